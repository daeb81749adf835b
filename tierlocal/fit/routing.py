"""How many of a layer's experts a batch of tokens reads: the share of E experts that B tokens,
each routed to k of them, touch together. Pure.

Routers do not spread tokens evenly. Expert popularity is modelled as falling with its rank as a
power: the expert at rank share x (0 < x ≤ 1, most popular first) is picked by a token with
probability q(x) = min(1, c·x^−α), c set so that a token picks k/E of the experts on average.
α = 0 is uniform routing, 1 − (1 − k/E)^B; a larger α concentrates the tokens of a batch on
fewer experts. The shape has one number, :data:`ROUTING_SKEW`, fitted on the decode rows of
published llama-batched-bench tables (recipes/batched_bench.toml, use = "fit": gpt-oss-20b and a
dense 7B on two devices) with every other MoE held out; ``python -m bench.concurrency_published
--skews`` shows what each α does to both kinds of rows. Written here: no library computes it.
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["ROUTING_SKEW", "distinct_expert_share"]

#: α of the expert popularity power law the product prices with, fitted 2026-12-07: the least
#: squared log error of aggregate decode on the use = "fit" rows over α = 0, 0.1, … 2, each
#: backend's batch share refitted at each α (``bench.concurrency_published --layer-shares``, with
#: the GPU overhead 0.7 per layer). Uniform routing (α = 0) reads more experts at 8–32 sequences
#: than GB10's bandwidth allows for its measured gpt-oss-120b step.
ROUTING_SKEW = 1.5

#: Points of the midpoint rule over the experts not always picked.
_POINTS = 512


def _mean_pick(c: float, alpha: float) -> tuple[float, float]:
    """The mean of q(x) = min(1, c·x^−α) over (0, 1], and x0 = the share of experts every token
    picks (q = 1 below it)."""
    x0 = min(1.0, c ** (1.0 / alpha))
    if abs(alpha - 1.0) < 1e-9:
        tail = c * -math.log(x0) if x0 > 0 else math.inf
    else:
        tail = c * (1.0 - x0 ** (1.0 - alpha)) / (1.0 - alpha)
    return x0 + tail, x0


@lru_cache(maxsize=4096)
def _skewed_share(used_share: float, tokens: int, alpha: float) -> float:
    low, high = 0.0, used_share  # c ≤ k/E: q at x = 1 is c, below the mean
    for _ in range(60):
        c = (low + high) / 2
        if _mean_pick(c, alpha)[0] > used_share:
            high = c
        else:
            low = c
    c = (low + high) / 2
    x0 = _mean_pick(c, alpha)[1]
    width = (1.0 - x0) / _POINTS
    touched = sum(1.0 - (1.0 - min(1.0, c * (x0 + (i + 0.5) * width) ** -alpha)) ** tokens for i in range(_POINTS))
    return min(1.0, x0 + touched * width)


def distinct_expert_share(used_share: float, tokens: int, skew: float = ROUTING_SKEW) -> float:
    """The expected share of a layer's experts ``tokens`` tokens read together when each picks
    ``used_share`` (k/E) of them, expert popularity falling as rank^−``skew`` (0: every expert
    equally likely, 1 − (1 − k/E)^B). One token reads k/E; the share grows toward 1 with B."""
    tokens = max(tokens, 1)
    if used_share >= 1.0:
        return 1.0
    if skew <= 0.0:
        return 1.0 - (1.0 - used_share) ** tokens
    if tokens == 1:
        return used_share
    return _skewed_share(used_share, tokens, skew)

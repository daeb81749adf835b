"""What a tier-1 cluster gives its users at once: each user's decode and all users' together,
and what an output token costs at the cluster's hourly price. Pure.

A decode step of B users reads the shared weights once, the experts the B tokens route to
(:func:`tierlocal.fit.routing.distinct_expert_share` routed uniformly: for k of E experts,
1 − (1 − k/E)^B of them — the skew fitted there is gpt-oss's and Qwen3's on llama.cpp, not
measured for this model's routers, and uniform routing reads the most, so the figure errs low)
and each user's cache at its depth, spread over the cluster's GPUs at their peak
bandwidth; and it takes no less than one user's published step (1 ÷ the engine's published
tokens/s at batch 1 for that tensor-parallel degree: kernel launches and all-reduces across 93
layers, not bytes, set it at a few users). Compute is not counted: for Kimi K3 (104B active) a
step of 1,024 users is ~0.2 PFLOP, milliseconds on any cluster that holds it, while its read is
tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..fit.routing import distinct_expert_share

__all__ = [
    "PublishedThroughput",
    "ClusterShape",
    "ClusterUsers",
    "ClusterThroughput",
    "cluster_throughput",
    "step_bytes",
    "CLUSTER_USER_COUNTS",
    "CLUSTER_DEPTH",
]

#: The routing skew tier-1 throughput is priced with (:mod:`tierlocal.fit.routing`): uniform.
UNIFORM_ROUTING = 0.0

#: The users at once the table prices (those past the cluster's cache capacity are left out).
CLUSTER_USER_COUNTS = (1, 8, 32, 128, 512)
#: Tokens of cache each user's step reads (a conversation 4k tokens in).
CLUSTER_DEPTH = 4096


@dataclass(frozen=True)
class PublishedThroughput:
    """An engine's published decode speed for one user on ``gpus`` GPUs (tensor parallel)."""

    engine: str
    gpus: int
    users: int
    tokens_per_s: float
    source: str


@dataclass(frozen=True)
class ClusterUsers:
    """``users`` at once: each one's decode (tokens/s), all of theirs, and USD per million output
    tokens at the cluster's hourly price kept busy (None: no price). ``basis``: ``published`` (the
    row the engine published), ``derived`` (from a published step and the bandwidth), ``bound``."""

    users: int
    per_user_decode_tokens_per_s: float
    aggregate_decode_tokens_per_s: float
    usd_per_million_output_tokens: float | None
    basis: str

    def to_json(self) -> dict[str, object]:
        usd = self.usd_per_million_output_tokens
        return {
            "users": self.users,
            "per_user_decode_tokens_per_s": round(self.per_user_decode_tokens_per_s, 1),
            "aggregate_decode_tokens_per_s": round(self.aggregate_decode_tokens_per_s, 1),
            "usd_per_million_output_tokens": None if usd is None else round(usd, 4),
            "basis": self.basis,
        }


@dataclass(frozen=True)
class ClusterThroughput:
    """The table for a cluster of ``gpus`` × ``gpu``; ``max_users``: the users whose caches at
    :data:`CLUSTER_DEPTH` fit beside the weights; ``anchor``: the published step it keeps to."""

    gpu: str
    gpus: int
    max_users: int | None
    anchor: PublishedThroughput | None
    rows: tuple[ClusterUsers, ...]

    def to_json(self) -> dict[str, object]:
        anchor = self.anchor
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "depth_tokens": CLUSTER_DEPTH,
            "max_users": self.max_users,
            "anchor": None
            if anchor is None
            else {"engine": anchor.engine, "gpus": anchor.gpus, "tokens_per_s": anchor.tokens_per_s, "source": anchor.source},
            "users": [row.to_json() for row in self.rows],
        }


@dataclass(frozen=True)
class ClusterShape:
    """What a step reads: weights in bytes, split into shared and expert bytes; the experts'
    count and how many each token uses (None: a dense model); cache bytes per token and per user."""

    weights_bytes: int
    params: int
    active_params: int
    experts: int | None
    experts_per_token: int | None
    kv_bytes_per_token: float
    fixed_state_bytes: int


def step_bytes(shape: ClusterShape, users: int) -> float:
    """Bytes one decode step of ``users`` reads: the shared weights, the experts their tokens
    route to, and each user's cache at :data:`CLUSTER_DEPTH` (and recurrent state)."""
    per_param = shape.weights_bytes / shape.params
    cache = users * (shape.kv_bytes_per_token * CLUSTER_DEPTH + shape.fixed_state_bytes)
    experts, used = shape.experts, shape.experts_per_token
    if not experts or not used or experts <= used:
        return shape.weights_bytes * shape.active_params / shape.params + cache  # dense: the active weights
    per_expert = (shape.params - shape.active_params) / (experts - used)
    shared = shape.active_params - used * per_expert
    read = shared + experts * per_expert * distinct_expert_share(used / experts, users, UNIFORM_ROUTING)
    return read * per_param + cache


def cluster_throughput(
    shape: ClusterShape,
    gpu: str,
    gpus: int,
    bandwidth_bytes_per_s: float,
    memory_bytes: int,
    usd_per_hour: float | None,
    published: Sequence[PublishedThroughput] = (),
    counts: Sequence[int] = CLUSTER_USER_COUNTS,
) -> ClusterThroughput:
    """The users table of ``gpus`` × ``gpu`` (each ``bandwidth_bytes_per_s``; ``memory_bytes``
    all together; ``usd_per_hour`` for the cluster). The step floor is the published batch-1
    step of the nearest tensor-parallel degree (none published: no floor, a bound)."""
    anchor = min((p for p in published if p.users == 1), key=lambda p: (abs(p.gpus - gpus), p.gpus), default=None)
    floor_s = 1.0 / anchor.tokens_per_s if anchor else 0.0
    per_user_cache = shape.kv_bytes_per_token * CLUSTER_DEPTH + shape.fixed_state_bytes
    room = memory_bytes - shape.weights_bytes
    max_users = int(room // per_user_cache) if per_user_cache > 0 and room > 0 else None
    rows = []
    for users in counts:
        if max_users is not None and users > max_users:
            continue
        read_s = step_bytes(shape, users) / (gpus * bandwidth_bytes_per_s)
        step_s = max(floor_s, read_s)
        aggregate = users / step_s
        basis = "bound" if anchor is None else ("published" if users == 1 and anchor.gpus == gpus else "derived")
        usd = usd_per_hour / (aggregate * 3600) * 1e6 if usd_per_hour else None
        rows.append(ClusterUsers(users, aggregate / users, aggregate, usd, basis))
    return ClusterThroughput(gpu, gpus, max_users, anchor, tuple(rows))

"""What a request costs, in USD, from the tokens an upstream reported (each protocol reads its own
usage fields: dialects/) and the dated price table, and the most it can cost before it is sent
(what a budget reserves)."""

from __future__ import annotations

from dataclasses import dataclass

from ..tiers.arithmetic import ApiPrices

__all__ = ["Usage", "count", "cost_usd", "worst_case_input_tokens"]

#: Template tokens a chat template may add per request (role markers, BOS, generation prompt).
TEMPLATE_TOKENS = 64


@dataclass(frozen=True)
class Usage:
    """Tokens as the upstream counted them; ``cached_tokens`` is part of ``prompt_tokens``."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def count(value: object) -> int:
    """A token count from an upstream's JSON: a non-negative integer below 2^40, else 0 (hostile
    or missing values count as nothing)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40 else 0


def cost_usd(prices: ApiPrices, usage: Usage) -> float:
    """Cached input at the cache-hit rate, the rest of the input at the miss rate, output at
    the output rate (prices per million tokens)."""
    return (
        usage.cached_tokens * prices.input_cache_hit
        + (usage.prompt_tokens - usage.cached_tokens) * prices.input_cache_miss
        + usage.completion_tokens * prices.output
    ) / 1e6


def worst_case_input_tokens(body_bytes: int) -> int:
    """An upper bound on a request's input tokens: a byte-level tokenizer spends at least one
    byte of text per token, and the request body holds all the text (plus JSON syntax, which
    only pads the bound), so body bytes plus the template's own tokens."""
    return body_bytes + TEMPLATE_TOKENS

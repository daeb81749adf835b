"""What a request costs, in USD, from an upstream's ``usage`` and the dated price table, and
the most it can cost before it is sent (what a budget reserves)."""

from __future__ import annotations

from dataclasses import dataclass

from ..tiers.arithmetic import ApiPrices

__all__ = ["Usage", "usage_from", "cost_usd", "worst_case_input_tokens"]

#: Template tokens a chat template may add per request (role markers, BOS, generation prompt).
TEMPLATE_TOKENS = 64


@dataclass(frozen=True)
class Usage:
    """Tokens as the upstream counted them; ``cached_tokens`` is part of ``prompt_tokens``."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40 else 0


def usage_from(document: object) -> Usage | None:
    """The ``usage`` object of a response or stream chunk, if it has one. Cached tokens are in
    ``prompt_tokens_details.cached_tokens`` (OpenAI, Moonshot) or ``cached_tokens`` (older
    Moonshot); llama-server reports ``prompt_tokens`` and ``completion_tokens``."""
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else _count(usage.get("cached_tokens"))
    prompt = _count(usage.get("prompt_tokens"))
    return Usage(prompt, min(cached, prompt), _count(usage.get("completion_tokens")))


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

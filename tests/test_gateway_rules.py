"""The gateway's pure rules: which upstream failures fall back, the waits upstreams ask for,
scrubbing, pricing from usage, and the sliding-minute rate limits."""

from __future__ import annotations

import json

import pytest

from tests.support.faultproxy import LLAMA_CONTEXT, MOONSHOT_OVERLOADED, MOONSHOT_QUOTA, MOONSHOT_RATE_LIMIT
from tierlocal.gateway.config import User
from tierlocal.gateway.dialects.openai_chat import openai_usage as usage_from
from tierlocal.gateway.limits import RateLimiter, Ticket
from tierlocal.gateway.pricing import Usage, cost_usd, worst_case_input_tokens
from tierlocal.gateway.protocol import classify, retry_after_s, sanitise, upstream_error_fields
from tierlocal.tiers.arithmetic import ApiPrices


def verdict(status: int, body: dict, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def, type-arg]
    type_, message, code = upstream_error_fields(json.dumps(body).encode())
    return classify(status, type_, message, code, headers or {})


@pytest.mark.parametrize(
    ("status", "body", "falls_back", "reason"),
    [
        (429, MOONSHOT_OVERLOADED, True, "rate_limited"),
        (429, MOONSHOT_RATE_LIMIT, True, "rate_limited"),
        (429, MOONSHOT_QUOTA, False, "quota"),
        (400, LLAMA_CONTEXT, True, "context_exceeded"),
        (400, {"error": {"type": "invalid_request_error", "message": "bad"}}, False, "client_error"),
        (400, {"error": {"type": "content_filter", "message": "risk"}}, False, "content_filter"),
        (401, {"error": {"type": "invalid_authentication_error", "message": "no"}}, False, "upstream_auth"),
        (403, {"error": {"type": "permission_denied_error", "message": "no"}}, False, "upstream_auth"),
        (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, True, "unavailable"),
        (500, {"error": {"type": "server_error", "message": "x"}}, True, "server_error"),
        (502, {}, True, "server_error"),
    ],
)
def test_which_failures_fall_back(status: int, body: dict, falls_back: bool, reason: str) -> None:  # type: ignore[type-arg]
    result = verdict(status, body)
    assert (result.fall_back, result.reason) == (falls_back, reason)


def test_waits_come_from_headers_or_moonshots_text() -> None:
    assert verdict(429, MOONSHOT_RATE_LIMIT).cooldown_s == 2.0  # "please try again after 2 seconds"
    assert verdict(429, MOONSHOT_OVERLOADED, {"retry-after": "7"}).cooldown_s == 7.0
    assert retry_after_s({"retry-after-ms": "1500"}, "") == 1.5
    assert retry_after_s({"retry-after": "99999"}, "") == 300.0  # capped
    assert retry_after_s({}, "no hint") is None


def test_sanitise_removes_keys_account_ids_and_bearer_tokens() -> None:
    text = sanitise("account org-9f8e7d6c<ak-a1b2c3d4> sent Bearer abc.def with sk-live-123456 and key SECRET-XYZ", ("SECRET-XYZ",))
    for secret in ("9f8e7d6c", "a1b2c3d4", "abc.def", "live-123456", "SECRET-XYZ"):
        assert secret not in text
    assert len(sanitise("x" * 5000)) <= 600


def test_cost_from_usage_with_cache_hits() -> None:
    prices = ApiPrices(input_cache_hit=0.30, input_cache_miss=3.00, output=15.00)
    usage = usage_from({"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 100_000, "prompt_tokens_details": {"cached_tokens": 400_000}}})
    assert usage == Usage(1_000_000, 400_000, 100_000)
    assert cost_usd(prices, usage) == pytest.approx(0.4 * 0.30 + 0.6 * 3.00 + 0.1 * 15.00)
    assert usage_from({"usage": {"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 4}}) == Usage(10, 4, 2)  # older Moonshot
    assert usage_from({"usage": {"prompt_tokens": -5, "completion_tokens": True}}) == Usage(0, 0, 0)  # hostile values count as 0
    assert usage_from({"choices": []}) is None


def test_the_input_bound_is_at_least_the_text_bytes() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "é" * 100}]}, ensure_ascii=False).encode()
    assert worst_case_input_tokens(len(body)) >= 200  # 100 two-byte characters: ≤ 200 byte-level tokens


def test_rate_limits_over_a_sliding_minute() -> None:
    limiter = RateLimiter()
    user = User("alice", requests_per_minute=2, tokens_per_minute=1000, concurrent_requests=5)
    first = limiter.admit(user, 100, now=0.0)
    second = limiter.admit(user, 100, now=10.0)
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    assert limiter.admit(user, 100, now=20.0) == pytest.approx(40.0)  # the first leaves the window at 60 s
    assert isinstance(limiter.admit(user, 100, now=60.5), Ticket)
    tokens = User("bob", tokens_per_minute=1000)
    big = limiter.admit(tokens, 900, now=0.0)
    assert isinstance(big, Ticket)
    assert limiter.admit(tokens, 200, now=1.0) == pytest.approx(59.0)
    limiter.release(big, tokens_used=100)  # it used far less than its worst case
    assert isinstance(limiter.admit(tokens, 200, now=2.0), Ticket)
    concurrent = User("carol", concurrent_requests=1)
    held = limiter.admit(concurrent, 1, now=0.0)
    assert isinstance(held, Ticket) and not isinstance(limiter.admit(concurrent, 1, now=0.1), Ticket)
    limiter.release(held, None)
    assert isinstance(limiter.admit(concurrent, 1, now=0.2), Ticket)

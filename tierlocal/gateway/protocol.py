"""How the gateway reads an upstream's failure, as pure functions (the same for every protocol:
the error bodies of OpenAI, Anthropic and llama-server all carry ``error.type``/``error.message``):
which upstream failures fall back and which go back to the client, the wait an upstream asks
for, and scrubbing account ids and keys out of upstream text.

Failure rules (OpenAI's error codes guide: 401 invalid authentication, 429 rate limit; the
openai-python client retries 408, 409, 429 and 5xx; Moonshot's API error codes, 429 and 500
with backoff; Retry-After as RFC 9110 §10.2.3 defines it): connection errors, timeouts, 5xx, 503 while a
local engine loads, 429 ``engine_overloaded_error`` / ``rate_limit_reached_error`` and 408/409
fall back to the next target (429s also cool the target down); llama-server's 400
``exceed_context_size_error`` goes on to a target with a larger context; 401/403, 429
``exceeded_current_quota_error`` (Moonshot's "insufficient balance"), other 4xx and content
filters are the request's or the account's problem and go back with ``x-should-retry: false``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["Verdict", "classify", "retry_after_s", "sanitise", "upstream_error_fields"]

#: Longest upstream error message passed on, in characters.
MAX_MESSAGE_CHARS = 600
#: Longest wait an upstream's hint may impose on a target, in seconds.
MAX_COOLDOWN_S = 300.0
#: Cooldown after a connection failure, a timeout or a 5xx when the upstream gave no hint, and
#: after a 429 without a wait in it, in seconds.
DEFAULT_COOLDOWN_S = 2.0
RATE_LIMIT_COOLDOWN_S = 5.0

_ACCOUNT_ID = re.compile(r"\b(org|ak|sk|user|proj|acct)-[A-Za-z0-9_\-]{3,}", re.IGNORECASE)
_BEARER = re.compile(r"(?i)bearer\s+\S+")
_AFTER_SECONDS = re.compile(r"(?i)after\s+(\d+(?:\.\d+)?)\s*(s\b|sec|second)")


@dataclass(frozen=True)
class Verdict:
    """What to do with one failed upstream attempt.

    ``fall_back``: try the next target; ``cooldown_s``: keep this target out of rotation that
    long (0: it is the request, not the target); ``reason``: a short label for logs and
    metrics."""

    fall_back: bool
    cooldown_s: float
    reason: str


def upstream_error_fields(body: bytes) -> tuple[str, str, str | None]:
    """(type, message, code) from an upstream error body in OpenAI's or llama-server's shape;
    unreadable bodies give ("", the first bytes as text, None)."""
    try:
        document = json.loads(body[:65536])
    except (ValueError, UnicodeDecodeError):
        return "", body[:200].decode("utf-8", "replace"), None
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, str):
        return "", error, None
    if not isinstance(error, dict):
        return "", "", None
    type_ = error.get("type")
    code = error.get("code")
    message = error.get("message")
    return (
        type_ if isinstance(type_, str) else "",
        message if isinstance(message, str) else "",
        str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None,
    )


def retry_after_s(headers: dict[str, str], message: str) -> float | None:
    """The wait an upstream asks for: ``Retry-After-Ms``, ``Retry-After`` (seconds), or
    Moonshot's "... after N seconds" in the message; capped at MAX_COOLDOWN_S."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return min(max(float(value) * scale, 0.0), MAX_COOLDOWN_S)
            except ValueError:
                pass
    match = _AFTER_SECONDS.search(message)
    return min(float(match.group(1)), MAX_COOLDOWN_S) if match else None


def classify(
    status: int, type_: str, message: str, code: str | None, headers: dict[str, str], error_cooldown_s: float = DEFAULT_COOLDOWN_S
) -> Verdict:
    """Whether an upstream's error response falls back (and cools the target down:
    ``error_cooldown_s`` after a 5xx without a hint)."""
    kind = (type_ or code or "").lower()
    if status == 429:
        if kind in ("exceeded_current_quota_error", "insufficient_quota"):
            return Verdict(False, 0.0, "quota")
        return Verdict(True, retry_after_s(headers, message) or RATE_LIMIT_COOLDOWN_S, "rate_limited")
    if status == 400 and kind == "exceed_context_size_error":
        return Verdict(True, 0.0, "context_exceeded")
    if status == 503:
        return Verdict(True, retry_after_s(headers, message) or error_cooldown_s, "unavailable")
    if status >= 500:
        return Verdict(True, error_cooldown_s, "server_error")
    if status in (408, 409):
        return Verdict(True, 0.0, "timeout" if status == 408 else "conflict")
    if kind == "content_filter":
        return Verdict(False, 0.0, "content_filter")
    return Verdict(False, 0.0, "client_error" if status not in (401, 403) else "upstream_auth")


def sanitise(text: str, secrets: tuple[str, ...] = (), limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` without any of ``secrets``, bearer tokens or account ids (``org-…``, ``ak-…``),
    cut to ``limit`` characters."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _BEARER.sub("Bearer [redacted]", text)
    text = _ACCOUNT_ID.sub(lambda match: f"{match.group(1)}-[redacted]", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe for one log line or a terminal cell: characters that are not printable
    (newlines, ESC, other controls, bidi overrides) written as ``\\n``/``\\x1b``/``\\u202e``, cut
    to ``limit`` characters."""
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in cut)

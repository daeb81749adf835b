"""Anthropic's Messages API as clients (Claude Code, the ``anthropic`` SDK) and upstreams (the
pinned llama-server's ``/v1/messages``, Moonshot's Anthropic endpoint) speak it (Anthropic's API
reference: Messages, streaming messages, errors).

- Request: ``stream``; the output capped by ``max_tokens`` (one choice, always).
- Usage: ``input_tokens`` (the input *not* read from or written to the cache),
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``, ``output_tokens``. The gateway's
  prompt tokens are all three inputs; its cached tokens are the cache reads.
- Stream: ``event:``/``data:`` pairs (clients ignore events without an ``event:`` line):
  ``message_start`` (with the input usage), content blocks, ``message_delta`` (the output usage so
  far), ``message_stop``. An error is one ``event: error`` whose data is the error body.
- Errors: ``{"type": "error", "error": {"type", "message"}}``, the type set by the HTTP status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..pricing import Usage, count
from ..sse import event_data, event_error, json_or_none
from .base import Dialect, Forwarded
from .translate_messages import ChatToMessagesStream, chat_to_message, messages_to_chat
from .translation import Translation

if TYPE_CHECKING:
    from ..wire import Exchange

__all__ = ["AnthropicMessages", "AnthropicCountTokens", "anthropic_error_body", "anthropic_usage", "ANTHROPIC_VERSION"]

#: The API version the gateway asks an Anthropic-speaking upstream for.
ANTHROPIC_VERSION = "2023-06-01"
#: Anthropic's error type for each HTTP status it documents (others: by class).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, object]:
    """Anthropic's error shape for HTTP ``status``."""
    type_ = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": type_, "message": message}}


def anthropic_usage(usage: object, before: Usage | None = None) -> Usage | None:
    """A Messages ``usage`` object as the gateway counts it, merged into what a stream reported
    ``before`` (``message_start`` gives the input, each ``message_delta`` the output so far)."""
    if not isinstance(usage, dict):
        return None
    inputs = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    cached = count(usage.get("cache_read_input_tokens"))
    prompt = sum(count(usage.get(name)) for name in inputs)
    if before is not None and not any(name in usage for name in inputs):
        prompt, cached = before.prompt_tokens, before.cached_tokens
    completion = count(usage.get("output_tokens"))
    if before is not None:
        completion = max(completion, before.completion_tokens)
    return Usage(prompt, min(cached, prompt), completion)


class AnthropicMessages(Dialect):
    """``POST /v1/messages``."""

    name = "messages"
    family = "messages"
    client_path = "/v1/messages"
    upstream_path = "/messages"
    cap_fields: tuple[str, ...] = ("max_tokens",)
    translation: Translation | None = Translation(messages_to_chat, chat_to_message, ChatToMessagesStream)

    def upstream_headers(self, key: str | None, stream: bool) -> dict[str, str]:
        headers = super().upstream_headers(key, stream)  # Bearer: Moonshot's endpoint and llama-server take it
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if key is not None:
            headers["x-api-key"] = key
        return headers

    def usage_from(self, document: object) -> Usage | None:
        return anthropic_usage(document.get("usage") if isinstance(document, dict) else None)

    def response_id(self, document: object) -> str | None:
        message = document.get("message") if isinstance(document, dict) else None  # a stream's message_start
        return super().response_id(message if isinstance(message, dict) else document)

    def forward_batch(self, batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> Forwarded:
        """Events go on as they came; those that carry usage, an error or the end are read."""
        out: list[bytes] = []
        for event in batch:
            data = event_data(event)
            if data is None:
                out.append(event)  # a comment or a ping without data
                continue
            if b"error" in event:
                message = event_error(event)
                if message is not None:
                    return out, False, clean(message)
            if b'"usage"' in data or b"message_stop" in data:
                document = json_or_none(data)
                kind = document.get("type") if isinstance(document, dict) else None
                if kind == "message_start" and isinstance(document, dict) and isinstance(document.get("message"), dict):
                    exchange.usage = anthropic_usage(document["message"].get("usage"), exchange.usage) or exchange.usage
                elif kind == "message_delta" and isinstance(document, dict):
                    exchange.usage = anthropic_usage(document.get("usage"), exchange.usage) or exchange.usage
                elif kind == "message_stop":
                    out.append(event)
                    return out, True, None
            elif b"content_block_delta" in event:
                exchange.content_events += 1
            out.append(event)
        return out, False, None

    def stream_tail(self, failure: str | None, exchange: Exchange) -> bytes:
        if failure is None:
            return b""  # message_stop went on with the upstream's events
        body = anthropic_error_body(502, f"the upstream stream broke: {failure}")
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"

    def error_body(self, status: int, message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
        return anthropic_error_body(status, message)


class AnthropicCountTokens(AnthropicMessages):
    """``POST /v1/messages/count_tokens``: the input a Messages request would use, nothing
    generated (``{"input_tokens": N}``); answered only by targets that speak Messages."""

    name = "count_tokens"
    client_path = "/v1/messages/count_tokens"
    upstream_path = "/messages/count_tokens"
    streams = False
    generates = False
    cap_fields = ()
    translation = None  # a count needs the target's own tokenizer

    def usage_from(self, document: object) -> Usage | None:
        return None  # a count, not a use: nothing to charge

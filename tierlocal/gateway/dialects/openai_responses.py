"""OpenAI's Responses API as clients (Codex CLI, the ``openai`` SDK's ``responses``) and upstreams
(the pinned llama-server's ``/v1/responses``) speak it (OpenAI's API reference: Responses,
streaming events).

- Request: ``stream``; the output capped by ``max_output_tokens``. State kept by the server
  (``previous_response_id``, ``conversation``, ``background``) cannot be honoured: no target the
  gateway routes to keeps responses, and a fallback would lose them. Such a request is refused
  with a 400 that says so, never sent on with the field dropped.
- Usage: ``input_tokens`` (cached ones included, in ``input_tokens_details.cached_tokens``),
  ``output_tokens``; in a stream, on the ``response.completed`` (or ``.incomplete``/``.failed``)
  event's ``response``.
- Stream: ``event:``/``data:`` pairs ending with ``response.completed`` (no ``[DONE]``); an error
  is an ``error`` event (``{"type": "error", "code", "message", "param", "sequence_number"}``).
- Errors: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..pricing import Usage, count
from ..sse import event_data, event_error, json_or_none
from .base import Dialect, Forwarded
from .openai_chat import openai_error_body
from .translate_responses import ChatToResponsesStream, chat_to_response, responses_to_chat
from .translation import Translation

if TYPE_CHECKING:
    from ..wire import Exchange

__all__ = ["OpenAIResponses", "responses_usage", "STATEFUL_FIELDS", "END_EVENTS"]

#: Request fields that ask the server to keep or recall state (refused: see the module's text).
STATEFUL_FIELDS = ("previous_response_id", "conversation", "background")
#: Stream events after which nothing more comes.
END_EVENTS = ("response.completed", "response.incomplete", "response.failed")


def responses_usage(usage: object) -> Usage | None:
    """A Responses ``usage`` object as the gateway counts it."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details")
    prompt = count(usage.get("input_tokens"))
    cached = count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(prompt, min(cached, prompt), count(usage.get("output_tokens")))


class OpenAIResponses(Dialect):
    """``POST /v1/responses``."""

    name = "responses"
    family = "responses"
    client_path = "/v1/responses"
    upstream_path = "/responses"
    cap_fields: tuple[str, ...] = ("max_output_tokens",)
    translation: Translation | None = Translation(responses_to_chat, chat_to_response, ChatToResponsesStream)

    def unsupported(self, body: dict[str, object]) -> tuple[str, str] | None:
        for name in STATEFUL_FIELDS:
            if body.get(name) not in (None, False, ""):
                return name, (
                    f"{name} asks the server to keep state between requests, and the gateway's targets keep none (a fallback would lose it "
                    "too): send the whole conversation in input instead"
                )
        return None

    def usage_from(self, document: object) -> Usage | None:
        return responses_usage(document.get("usage") if isinstance(document, dict) else None)

    def response_id(self, document: object) -> str | None:
        inner = document.get("response") if isinstance(document, dict) else None  # a stream's response.created
        return super().response_id(inner if isinstance(inner, dict) else document)

    def forward_batch(self, batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> Forwarded:
        """Events go on as they came; the end events carry the usage."""
        out: list[bytes] = []
        for event in batch:
            data = event_data(event)
            if data is not None and b'"error"' in data:
                message = event_error(event)
                if message is not None:
                    return out, False, clean(message)
            if data is not None and b"response.output_text.delta" in data:
                exchange.content_events += 1
            out.append(event)
            if data is not None and any(name.encode() in data for name in END_EVENTS):
                document = json_or_none(data)
                if isinstance(document, dict) and document.get("type") in END_EVENTS:
                    inner = document.get("response")
                    exchange.usage = self.usage_from(inner) or exchange.usage
                    return out, True, None
        return out, False, None

    def stream_tail(self, failure: str | None, exchange: Exchange) -> bytes:
        if failure is None:
            return b""  # the end event went on with the upstream's events
        body = {
            "type": "error",
            "code": "stream_interrupted",
            "message": f"the upstream stream broke: {failure}",
            "param": None,
            "sequence_number": exchange.content_events + 1,
        }
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"

    def error_body(self, status: int, message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
        return openai_error_body(message, type_, code, param)

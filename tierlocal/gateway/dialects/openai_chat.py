"""OpenAI's chat completions, (legacy) completions and embeddings, as clients and upstreams speak
them (OpenAI's API reference; llama-server and Moonshot answer the same shapes).

- Request: ``stream``; ``stream_options.include_usage``; output capped per choice by
  ``max_completion_tokens`` / ``max_tokens`` and multiplied by ``n`` / ``best_of``. The upstream
  is always asked for usage in a stream (the request is priced from it); a usage-only chunk is
  held back from a client that did not ask for it.
- Usage: ``prompt_tokens``, ``completion_tokens``; cached input in
  ``prompt_tokens_details.cached_tokens`` (OpenAI, Moonshot) or ``cached_tokens`` (older Moonshot).
- Stream: ``data:`` events ending with ``data: [DONE]``; an error after the first event is one
  ``data: {"error": …}`` frame, then ``[DONE]``.
- Errors: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..pricing import Usage, count
from ..sse import event_data, event_error, json_or_none
from .base import Dialect, Forwarded

if TYPE_CHECKING:
    from ..wire import Exchange

__all__ = ["OpenAIChat", "OpenAICompletions", "OpenAIEmbeddings", "OpenAIRerank", "openai_error_body", "openai_usage"]


def openai_error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def openai_usage(document: object) -> Usage | None:
    """The ``usage`` object of a response or stream chunk, if it has one. Cached tokens are in
    ``prompt_tokens_details.cached_tokens`` (OpenAI, Moonshot) or ``cached_tokens`` (older
    Moonshot); llama-server reports ``prompt_tokens`` and ``completion_tokens``."""
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, dict) else count(usage.get("cached_tokens"))
    prompt = count(usage.get("prompt_tokens"))
    return Usage(prompt, min(cached, prompt), count(usage.get("completion_tokens")))


class OpenAIChat(Dialect):
    """``POST /v1/chat/completions``."""

    name = "chat_completions"
    family = "chat_completions"
    client_path = "/v1/chat/completions"
    upstream_path = "/chat/completions"
    cap_fields: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    choice_fields: tuple[str, ...] = ("n", "best_of")

    def usage_requested(self, body: dict[str, object]) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def upstream_body(self, body: dict[str, object], model: str, stream: bool) -> dict[str, object]:
        upstream = super().upstream_body(body, model, stream)
        if stream:
            options = upstream.get("stream_options")
            upstream["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}  # always priced from usage
        return upstream

    def usage_from(self, document: object) -> Usage | None:
        return openai_usage(document)

    def forward_batch(self, batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> Forwarded:
        """Only chunks that can matter are parsed (an error, or usage): most carry one token of
        content. The usage-only chunk is held back from a client that did not ask for it."""
        out: list[bytes] = []
        for event in batch:
            data = event_data(event)
            if data == b"[DONE]":
                return out, True, None
            forward = True
            if b"error" in event or (data is not None and b'"usage"' in data):
                message = event_error(event)
                if message is not None:
                    return out, False, clean(message)
                document = None if data is None else json_or_none(data)
                usage = openai_usage(document)
                if usage is not None:
                    exchange.usage = usage
                if isinstance(document, dict) and document.get("choices"):
                    exchange.content_events += 1
                elif usage is not None and not exchange.include_usage:
                    forward = False
            elif data is not None:
                exchange.content_events += 1
            if forward:
                out.append(event)
        return out, False, None

    def stream_tail(self, failure: str | None, exchange: Exchange) -> bytes:
        frame = b""
        if failure is not None:
            body = openai_error_body(f"the upstream stream broke: {failure}", "upstream_error", "stream_interrupted")
            frame = b"data: " + json.dumps(body).encode() + b"\n\n"
        return frame + b"data: [DONE]\n\n"

    def error_body(self, status: int, message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
        return openai_error_body(message, type_, code, param)


class OpenAICompletions(OpenAIChat):
    """``POST /v1/completions`` (the same fields and framing as chat)."""

    name = "completions"
    client_path = "/v1/completions"
    upstream_path = "/completions"


class OpenAIEmbeddings(OpenAIChat):
    """``POST /v1/embeddings``: no stream, no output."""

    name = "embeddings"
    client_path = "/v1/embeddings"
    upstream_path = "/embeddings"
    streams = False
    generates = False
    cap_fields = ()
    choice_fields = ()


class OpenAIRerank(OpenAIEmbeddings):
    """``POST /v1/rerank`` (llama-server's with ``--reranking``, Jina's and Cohere's shape: a
    query, documents, ``top_n``; ``usage.prompt_tokens`` back): no stream, no output."""

    name = "rerank"
    client_path = "/v1/rerank"
    upstream_path = "/rerank"

"""What a translation between a client's protocol and chat completions is made of, and the
pieces the translators share. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..pricing import Usage

__all__ = ["Translation", "TranslationError", "StreamTranslator", "sse_event"]


class TranslationError(ValueError):
    """A request that a chat-only target cannot be sent (``param``: the field at fault)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamTranslator(Protocol):
    """Chat completion chunks in, the client's stream events out (whole SSE events, bytes)."""

    def feed(self, chunk: dict[str, object]) -> list[bytes]: ...

    def finish(self, usage: Usage | None) -> list[bytes]: ...


@dataclass(frozen=True)
class Translation:
    """A client protocol to chat completions and back: the request, a whole answer (given the
    model id the client sent and the usage the upstream reported), and a stream's translator."""

    request: Callable[[dict[str, object]], dict[str, object]]
    response: Callable[[dict[str, object], str, Usage | None], dict[str, object]]
    stream: Callable[[str], StreamTranslator]


def sse_event(name: str, data: dict[str, object]) -> bytes:
    """One server-sent event with an ``event:`` line (Anthropic's and Responses' clients skip
    events without one)."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

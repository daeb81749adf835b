"""One attempt's way to its target: the client's protocol passed through where the target speaks
it (native), else translated to chat completions and back (translated). Chosen per attempt, so a
fallback may cross protocols. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..pricing import Usage
from ..sse import event_data, event_error, json_or_none
from . import OPENAI_CHAT
from .base import Dialect, Forwarded
from .openai_chat import openai_usage
from .translation import StreamTranslator

if TYPE_CHECKING:
    from ..wire import Exchange

__all__ = ["Leg", "leg_for"]


@dataclass(frozen=True)
class Leg:
    """The client's protocol and the one its target is sent (the same object when native)."""

    client: Dialect
    upstream: Dialect

    @property
    def translated(self) -> bool:
        return self.upstream is not self.client

    def request(self, body: dict[str, object], model: str, stream: bool) -> dict[str, object]:
        """The body the target is sent.

        Raises:
            TranslationError: the request has something a chat-only target cannot be sent.
        """
        if self.translated:
            assert self.client.translation is not None
            body = self.client.translation.request(body)
        return self.upstream.upstream_body(body, model, stream)

    def answer(self, document: object, data: bytes, model: str, usage: Usage | None) -> bytes:
        """A whole answer as the client gets it (``data``: the upstream's bytes; ``usage``: what
        it reported, already read)."""
        if not self.translated or not isinstance(document, dict):
            return data
        assert self.client.translation is not None
        return json.dumps(self.client.translation.response(document, model, usage), ensure_ascii=False).encode()

    def forwarder(self, model: str) -> Callable[[list[bytes], Exchange, Callable[[str], str]], Forwarded]:
        """What turns one batch of the target's stream events into the client's."""
        if not self.translated:
            return self.client.forward_batch
        assert self.client.translation is not None
        return _Translated(self.client.translation.stream(model)).forward


class _Translated:
    """A chat stream, every chunk read, as the client's events."""

    def __init__(self, translator: StreamTranslator) -> None:
        self.translator = translator

    def forward(self, batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> Forwarded:
        out: list[bytes] = []
        for event in batch:
            data = event_data(event)
            if data is None:
                continue
            if data == b"[DONE]":
                return out + self.translator.finish(exchange.usage), True, None
            message = event_error(event)
            if message is not None:
                return out, False, clean(message)
            document = json_or_none(data)
            if not isinstance(document, dict):
                continue
            usage: Usage | None = openai_usage(document)
            if usage is not None:
                exchange.usage = usage
            if document.get("choices"):
                exchange.content_events += 1
            out += self.translator.feed(document)
        return out, False, None


def leg_for(client: Dialect, speaks: tuple[str, ...]) -> Leg | None:
    """How a target that speaks ``speaks`` can carry a ``client`` request (None: it cannot)."""
    if client.family in speaks:
        return Leg(client, client)
    if client.translation is not None and OPENAI_CHAT.family in speaks:
        return Leg(client, OPENAI_CHAT)  # a chat-only target is sent chat completions
    return None

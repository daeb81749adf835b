"""What the gateway asks about a client protocol, and nothing else: the one seam between the
routing (app.py, relay.py, ledger.py) and a protocol's wire shape.

A :class:`Dialect` owns a protocol's request fields (stream, usage in the stream, the fields that
cap and multiply the output), the request as an upstream that speaks it takes it (its model id,
its key, usage always asked for), the usage fields of its answers, its stream framing and end,
and its error body. The retry loop, the books and the limiter never look at a body themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..pricing import Usage

if TYPE_CHECKING:
    from ..wire import Exchange
    from .translation import Translation

__all__ = ["Dialect", "Forwarded"]

#: One batch of upstream stream events as the client gets it: the events to send, whether the
#: protocol's end event came, and the upstream's in-band error (cleaned of secrets) if one came.
Forwarded = tuple[list[bytes], bool, str | None]


class Dialect:
    """One protocol as clients and upstreams speak it. Subclasses set the class attributes and
    override what differs; the methods are pure (no I/O)."""

    #: How usage rows, logs and metrics name the protocol (e.g. ``chat_completions``).
    name: str = ""
    #: What a target lists in ``speaks`` to say it answers this protocol natively
    #: (``chat_completions`` also covers completions and embeddings).
    family: str = ""
    #: The gateway's path for it, and the path below a target's base URL an upstream answers it on.
    client_path: str = ""
    upstream_path: str = ""
    #: Whether a request may ask for a stream; whether it generates tokens (an output cap).
    streams: bool = True
    generates: bool = True
    #: Fields that cap the output per choice, and fields that multiply it (choices).
    cap_fields: tuple[str, ...] = ()
    choice_fields: tuple[str, ...] = ()
    #: How a request in this protocol reaches a target that speaks only chat completions (None:
    #: it cannot).
    translation: Translation | None = None

    def stream_requested(self, body: dict[str, object]) -> bool:
        """Whether the client asked for a stream."""
        return self.streams and body.get("stream") is True

    def unsupported(self, body: dict[str, object]) -> tuple[str, str] | None:
        """A field the gateway cannot honour for this protocol and why (a 400), or None."""
        return None

    def usage_requested(self, body: dict[str, object]) -> bool:
        """Whether a streaming client asked to see the usage event (always, where the protocol
        sends usage in its normal events)."""
        return True

    def upstream_body(self, body: dict[str, object], model: str, stream: bool) -> dict[str, object]:
        """The request as an upstream that speaks this protocol takes it: its own model id, and
        usage always asked for."""
        upstream = dict(body)
        upstream["model"] = model
        return upstream

    def upstream_headers(self, key: str | None, stream: bool) -> dict[str, str]:
        """Headers for the upstream: the content types and the target's key, if it has one."""
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def usage_from(self, document: object) -> Usage | None:
        """The usage a whole response (or one stream event's data) reports, if any."""
        raise NotImplementedError

    def response_id(self, document: object) -> str | None:
        """The upstream's id for the response (kept in the usage row), if it gave one."""
        value = document.get("id") if isinstance(document, dict) else None
        return value[:200] if isinstance(value, str) else None

    def forward_batch(self, batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> Forwarded:
        """What of one batch of upstream events goes to the client (see :data:`Forwarded`); the
        usage seen is kept on ``exchange``, and content events are counted there."""
        raise NotImplementedError

    def stream_tail(self, failure: str | None, exchange: Exchange) -> bytes:
        """The bytes that end a relayed stream: an error event first when the upstream broke
        (``failure`` says why), then the protocol's end, if it has one of its own."""
        raise NotImplementedError

    def error_body(self, status: int, message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
        """The protocol's error body for a refusal with HTTP ``status``."""
        raise NotImplementedError

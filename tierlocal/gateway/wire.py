"""One exchange on the wire, apart from routing: the errors a request ends with, its running
accounting, bounded reads of upstream bodies, and SSE events.

Server-sent events are split on blank lines; an event is kept whole (``data:`` lines and all)
and forwarded as it came, except that ``\\r\\n`` line ends become ``\\n``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from . import protocol
from .backends import TargetState
from .config import Route, User
from .pricing import Usage, usage_from

__all__ = [
    "Reject",
    "AttemptFailed",
    "Exchange",
    "read_bounded",
    "sse_batches",
    "response_id",
    "event_data",
    "json_or_none",
    "event_error",
    "forward_batch",
    "MAX_SSE_EVENT_BYTES",
]

#: Longest SSE event, in bytes.
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024


class Reject(Exception):
    """A request refused with an OpenAI-shaped error."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str | None = None,
        *,
        retry_after_s: float | None = None,
        should_retry: bool | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type_, self.code, self.param = status, message, type_, code, param
        self.retry_after_s, self.should_retry = retry_after_s, should_retry

    def response(self) -> web.Response:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, int(self.retry_after_s + 0.999)))
        if self.should_retry is not None:
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        return web.json_response(protocol.error_body(self.message, self.type_, self.code, self.param), status=self.status, headers=headers)


class AttemptFailed(Exception):
    """This attempt failed before anything reached the client: try the next target."""

    def __init__(self, verdict: protocol.Verdict, detail: str) -> None:
        super().__init__(detail)
        self.verdict, self.detail = verdict, detail


@dataclass
class Exchange:
    """One client request's accounting as it goes."""

    user: User
    route: Route
    stream: bool
    include_usage: bool
    input_bound: int
    started: float = field(default_factory=time.monotonic)
    usage: Usage | None = None
    usage_estimated: bool = False
    target: TargetState | None = None
    status: int = 0
    attempts: int = 0
    reasons: list[str] = field(default_factory=list)
    #: Request fields the gateway replaced before sending (why, for the log line).
    adjusted: tuple[str, ...] = ()
    content_events: int = 0
    request_id: str | None = None
    request_body: str | None = None  # only for routes with store_bodies
    response_kept: list[bytes] = field(default_factory=list)
    response_kept_bytes: int = 0

    def answered_by(self, state: TargetState) -> None:
        """``state``'s target answered: the exchange is its, with status 200 (a stream's may
        still end 499 or 502)."""
        self.target, self.status = state, 200

    def estimate_usage(self) -> None:
        """Without the upstream's usage: the input bound and one token per content event."""
        if self.usage is None:
            self.usage = Usage(self.input_bound, 0, self.content_events)
            self.usage_estimated = True

    def keep_response(self, data: bytes) -> None:
        """Keep the response's first bytes when its route stores bodies."""
        room = self.route.max_stored_body_bytes - self.response_kept_bytes
        if self.route.store_bodies and room > 0:
            self.response_kept.append(data[:room])
            self.response_kept_bytes += min(len(data), room)


async def read_bounded(content: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
    """The body up to ``limit`` bytes, and whether there was more. (One ``read(n)`` returns
    what has arrived, not n bytes: the body may come in several pieces.)"""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await content.read(min(65536, limit + 1 - size))
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit], True


async def sse_batches(upstream: aiohttp.ClientResponse):  # type: ignore[no-untyped-def]
    """An upstream SSE body as lists of whole events (each ending in a blank line, line ends
    made ``\\n``), one list per read, so events that arrive together are handled and sent
    together; a partial event at the end of the stream is dropped."""
    buffer = b""
    while True:
        chunk = await upstream.content.readany()
        if not chunk:
            return
        buffer += chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            if end > start:
                events.append(buffer[start : end + 2])
            start = end + 2
        buffer = buffer[start:]
        if len(buffer) > MAX_SSE_EVENT_BYTES:
            raise ValueError("an SSE event longer than the gateway's limit")
        if events:
            yield events


def response_id(document: object) -> str | None:
    value = document.get("id") if isinstance(document, dict) else None
    return value[:200] if isinstance(value, str) else None


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of one SSE event, if it has one."""
    parts = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


def json_or_none(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def event_error(event: bytes) -> str | None:
    """An in-band error: an ``error:`` field, or a data document with an ``error`` member."""
    for line in event.splitlines():
        if line.startswith(b"error:"):
            return line[6:].strip().decode("utf-8", "replace") or "error"
    data = event_data(event)
    document = json_or_none(data) if data is not None and data != b"[DONE]" else None
    if isinstance(document, dict) and "error" in document:
        _type, message, _code = protocol.upstream_error_fields(json.dumps(document).encode())
        return message or "error"
    return None


def forward_batch(batch: list[bytes], exchange: Exchange, clean: Callable[[str], str]) -> tuple[list[bytes], bool, str | None]:
    """What of one batch of upstream events goes to the client, whether ``[DONE]`` came, and
    the upstream's in-band error (``clean``-ed) if one came. Only chunks that can matter are
    parsed (an error, or usage): most carry one token of content. The usage is kept on
    ``exchange``; the usage-only chunk is held back from a client that did not ask for it."""
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
            usage = usage_from(document)
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

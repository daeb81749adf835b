"""One exchange on the wire, apart from routing: the errors a request ends with, its running
accounting, and bounded reads of upstream bodies. (Events of a stream: sse.py; what differs
between protocols: dialects/.)"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from . import protocol
from .backends import TargetState
from .config import Route, User
from .dialects import OPENAI_CHAT, Dialect
from .pricing import Usage

__all__ = ["Reject", "AttemptFailed", "Exchange", "read_bounded"]


class Reject(Exception):
    """A request refused: the status, the message and OpenAI's error type and code, written in
    the client's protocol's error shape by :meth:`response`."""

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

    def response(self, dialect: Dialect = OPENAI_CHAT) -> web.Response:
        """The refusal as ``dialect``'s clients expect it."""
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, int(self.retry_after_s + 0.999)))
        if self.should_retry is not None:
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        body = dialect.error_body(self.status, self.message, self.type_, self.code, self.param)
        return web.json_response(body, status=self.status, headers=headers)


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
    #: The client's protocol (its usage fields, stream framing and error shape).
    dialect: Dialect = OPENAI_CHAT
    #: The protocol the answering target was sent, where it is not the client's (translated).
    upstream_protocol: str | None = None
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

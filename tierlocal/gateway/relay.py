"""One attempt on one upstream target: the request as the upstream takes it (its model id, its
key, usage always asked for), the upstream's error classified (fall back, or pass on), and a
200 relayed — whole, or as a stream event by event.

Until a stream's first event reaches the client an upstream failure still falls back; after
that, a failure ends the stream with exactly one error event in the client's protocol and its end
(``data: [DONE]`` for OpenAI's) — nothing from
another upstream is spliced in.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from . import protocol
from .backends import TargetState
from .config import GatewayConfig
from .dialects.base import Forwarded
from .dialects.leg import Leg, leg_for
from .dialects.translation import TranslationError
from .metrics import Metrics
from .sse import event_data, event_error, json_or_none, sse_batches
from .wire import AttemptFailed, Exchange, Reject, read_bounded

__all__ = ["Relay", "MAX_RESPONSE_BYTES", "MAX_ERROR_BYTES"]

log = logging.getLogger("tierlocal.gateway")

#: Longest upstream response body read whole (non-streaming), in bytes.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Longest upstream error body read, in bytes.
MAX_ERROR_BYTES = 64 * 1024


#: What turns one batch of a target's stream events into the client's (dialects/leg.py).
Forwarder = Callable[[list[bytes], Exchange, Callable[[str], str]], Forwarded]
#: What the relay calls once an exchange has its answer (the books: ledger.Ledger.settle).
Settle = Callable[[Exchange, int | None], Awaitable[None]]


class Relay:
    """Attempts on upstream targets, over the gateway's one client ``session``; ``settle``
    records each answered exchange; ``secrets`` are scrubbed from every upstream text passed on."""

    def __init__(self, config: GatewayConfig, metrics: Metrics, session: aiohttp.ClientSession, settle: Settle, secrets: tuple[str, ...]) -> None:
        self.config, self.metrics, self.session, self.settle, self.secrets = config, metrics, session, settle, secrets

    def _upstream_request(self, body: dict[str, object], exchange: Exchange, state: TargetState, leg: Leg) -> tuple[bytes, dict[str, str]]:
        """The body and headers ``state``'s target is sent.

        Raises:
            Reject: 400, a request a chat-only target cannot be sent (translated legs).
        """
        try:
            upstream = leg.request(body, state.target.model, exchange.stream)
        except TranslationError as exc:
            raise Reject(400, str(exc), "invalid_request_error", "untranslatable", should_retry=False, param=exc.param) from None
        return json.dumps(upstream, ensure_ascii=False).encode(), leg.upstream.upstream_headers(state.key, exchange.stream)

    async def attempt(
        self, request: web.Request, body: dict[str, object], exchange: Exchange, state: TargetState, reservation: int | None
    ) -> web.StreamResponse:
        """One attempt on ``state``'s target: its answer relayed (and settled), or the
        client's error passed on.

        Raises:
            AttemptFailed: nothing reached the client; the next target may be tried.
            Reject: an error that is not retried (it goes back to the client).
        """
        leg = leg_for(exchange.dialect, state.target.speaks)
        assert leg is not None  # the retry loop excludes targets that cannot carry the request
        payload, headers = self._upstream_request(body, exchange, state, leg)
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=self.config.server.upstream_timeout_s)
        state.in_flight += 1
        self.metrics.in_flight.labels(state.label).set(state.in_flight)
        started = time.monotonic()
        try:
            try:
                upstream = await self.session.post(
                    state.target.url + leg.upstream.upstream_path, data=payload, headers=headers, timeout=timeout, allow_redirects=False
                )
            except TimeoutError:
                self.metrics.upstream.labels(state.label, "timeout").inc()
                raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "timeout"), "no answer in time") from None
            except aiohttp.ClientConnectorDNSError as exc:  # the host name does not resolve: no retry of this request fixes it
                self.metrics.upstream.labels(state.label, "dns_error").inc()
                raise AttemptFailed(
                    protocol.Verdict(True, self.config.server.error_cooldown_s, "dns_error"), self._clean(str(exc) or type(exc).__name__)
                ) from None
            except aiohttp.ClientError as exc:
                self.metrics.upstream.labels(state.label, "connect_error").inc()
                raise AttemptFailed(
                    protocol.Verdict(True, self.config.server.error_cooldown_s, "connect_error"), self._clean(str(exc) or type(exc).__name__)
                ) from None
            self.metrics.first_byte.labels(state.label).observe(time.monotonic() - started)
            async with upstream:
                if upstream.status != 200:
                    return await self._upstream_error(upstream, exchange, state, reservation)
                self.metrics.upstream.labels(state.label, "ok").inc()
                exchange.upstream_protocol = leg.upstream.name if leg.translated else None
                if exchange.stream:
                    return await self._relay_stream(request, upstream, exchange, state, reservation, leg)
                return await self._relay_whole(upstream, exchange, state, reservation, leg)
        finally:
            state.in_flight -= 1
            self.metrics.in_flight.labels(state.label).set(state.in_flight)

    def _clean(self, text: str) -> str:
        return protocol.sanitise(text, self.secrets)

    async def _upstream_error(
        self, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None
    ) -> web.StreamResponse:
        try:
            error_bytes, _more = await read_bounded(upstream.content, MAX_ERROR_BYTES)
        except (TimeoutError, aiohttp.ClientError):
            error_bytes = b""
        type_, message, code = protocol.upstream_error_fields(error_bytes)
        message = self._clean(message)
        verdict = protocol.classify(
            upstream.status, type_, message, code, {k.lower(): v for k, v in upstream.headers.items()}, self.config.server.error_cooldown_s
        )
        self.metrics.upstream.labels(state.label, str(upstream.status)).inc()
        if verdict.fall_back:
            raise AttemptFailed(verdict, f"HTTP {upstream.status} {type_ or code or ''}: {message}".strip())
        if upstream.status in (401, 403):
            message = (
                f"the upstream for {exchange.route.model!r} refused the gateway's own key ({message or upstream.status}); tell the gateway's operator"
            )
        exchange.target = state
        raise Reject(
            upstream.status, message or f"upstream answered HTTP {upstream.status}", type_ or "invalid_request_error", code, should_retry=False
        )

    async def _relay_whole(
        self, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None, leg: Leg
    ) -> web.Response:
        try:
            data, more = await read_bounded(upstream.content, MAX_RESPONSE_BYTES)
            if more:
                raise AttemptFailed(protocol.Verdict(True, 0.0, "response_too_large"), f"more than {MAX_RESPONSE_BYTES} bytes")
            document = json.loads(data)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise AttemptFailed(
                protocol.Verdict(True, self.config.server.error_cooldown_s, "dropped"), self._clean(str(exc) or type(exc).__name__)
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise AttemptFailed(
                protocol.Verdict(True, self.config.server.error_cooldown_s, "bad_response"), "the upstream's answer is not JSON"
            ) from None
        exchange.answered_by(state)
        exchange.usage = leg.upstream.usage_from(document)
        exchange.request_id = leg.upstream.response_id(document)
        data = leg.answer(document, data, exchange.route.model, exchange.usage)
        exchange.keep_response(data)
        await self.settle(exchange, reservation)  # recorded before the client has the answer
        return web.Response(body=data, content_type="application/json", headers={"x-tierlocal-target": state.target.url})

    async def _relay_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None, leg: Leg
    ) -> web.StreamResponse:
        batches = sse_batches(upstream)
        batch = await self._first_batch(batches)  # until the first event reaches the client, a failure still falls back
        exchange.answered_by(state)
        exchange.request_id = leg.upstream.response_id(json_or_none(event_data(batch[0]) or b""))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "x-tierlocal-target": state.target.url}
        )
        await response.prepare(request)
        try:
            failure = await self._forward(response, batches, batch, exchange, leg.forwarder(exchange.route.model))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            # The client went away: stop the upstream (closing it cancels generation) and
            # charge what we know.
            exchange.status = 499
            exchange.reasons.append("client_disconnected")
            exchange.estimate_usage()
            await self.settle(exchange, reservation)
            return response
        if failure is not None:
            exchange.status = 502
            exchange.reasons.append("stream_cut")
            self.metrics.upstream.labels(state.label, "stream_cut").inc()
            log.warning(
                "stream for %s on %s broke after %d events: %s",
                protocol.printable(exchange.route.model),
                protocol.printable(state.label),
                exchange.content_events,
                failure,
            )
            exchange.estimate_usage()
        await self.settle(exchange, reservation)  # recorded before the client sees the end
        try:
            await response.write(exchange.dialect.stream_tail(failure, exchange))
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return response

    async def _first_batch(self, batches: AsyncIterator[list[bytes]]) -> list[bytes]:
        """The stream's first events, unless it broke, ended or opened with an error.

        Raises:
            AttemptFailed: any of those (the next target is tried).
        """
        cooldown = self.config.server.error_cooldown_s
        try:
            batch = await anext(batches, None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise AttemptFailed(protocol.Verdict(True, cooldown, "dropped"), self._clean(str(exc) or type(exc).__name__)) from None
        if batch is None:
            raise AttemptFailed(protocol.Verdict(True, cooldown, "dropped"), "the stream ended before its first event")
        in_band = event_error(batch[0])
        if in_band is not None:
            raise AttemptFailed(protocol.Verdict(True, cooldown, "stream_error"), self._clean(in_band))
        return batch

    async def _forward(
        self, response: web.StreamResponse, batches: AsyncIterator[list[bytes]], batch: list[bytes] | None, exchange: Exchange, forward: Forwarder
    ) -> str | None:
        """Relay batches until the protocol's end event; the events that arrived together leave together.
        Returns why the upstream stream broke, or None when it ended properly (with the
        protocol's end event)."""
        while batch is not None:
            out, done, failure = forward(batch, exchange, self._clean)
            if out:
                chunk = b"".join(out)
                exchange.keep_response(chunk)
                await response.write(chunk)
            if done or failure is not None:
                return failure
            try:
                batch = await anext(batches, None)
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                return self._clean(str(exc) or type(exc).__name__) or "the upstream connection broke"
        return "the upstream ended the stream before its end event"

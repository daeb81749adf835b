"""The gateway's HTTP server: OpenAI's routes in front of an ordered list of upstreams per model.

One request goes through: authentication (a gateway key, hashed in the store) → body checks →
route → rate limits → budget reservation (worst case, atomic) → the one retry loop (targets in
order, skipping those down, cooling or full; jittered backoff before trying a target again; no
new attempt after the deadline) → relay → settlement (the reservation replaced by the cost the
upstream's ``usage`` gives) and a usage row, written before the response's last bytes go out.

A stream is relayed event by event. Until its first event reaches the client an upstream
failure still falls back; after that, a failure ends the stream with exactly one error frame and
``data: [DONE]`` — nothing from another upstream is spliced in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from aiohttp import web

from ..tiers import ApiPrices
from . import protocol
from .backends import DOWN, TargetState, now, poll_target, resolve_key
from .config import GatewayConfig, Route, Target, User
from .limits import RateLimiter, Ticket
from .metrics import Metrics
from .pricing import Usage, cost_usd, requested_max_tokens, usage_from, worst_case_input_tokens
from .store import Store, UsageRecord
from .wire import AttemptFailed, Exchange, Reject, event_data, event_error, json_or_none, read_bounded, response_id, sse_batches

__all__ = ["Gateway", "ENDPOINTS"]

log = logging.getLogger("tierlocal.gateway")

#: Client path → upstream path below the target's base URL.
ENDPOINTS = {"/v1/chat/completions": "/chat/completions", "/v1/completions": "/completions", "/v1/embeddings": "/embeddings"}
#: Longest upstream response body read whole (non-streaming), in bytes.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Longest upstream error body read, in bytes.
MAX_ERROR_BYTES = 64 * 1024
#: Backoff before trying a target again: base · 2^n seconds, jittered, capped; a target that
#: asks for a longer wait than the cap is not retried within the request (the client is told
#: when to come back). At most MAX_ATTEMPTS attempts per request, over all targets.
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
MAX_ATTEMPTS = 6
#: Seconds between health polls of local targets; seconds an authenticated key is cached.
POLL_INTERVAL_S = 2.0
AUTH_CACHE_S = 2.0
#: Largest max_tokens a request may reserve.
MAX_OUTPUT_TOKENS = 1 << 20


class Gateway:
    """The aiohttp application and the state it routes with."""

    def __init__(self, config: GatewayConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.metrics = Metrics()
        self.limiter = RateLimiter()
        self.shared_limiter = store.shared_limiter()  # Redis: one sliding minute for every replica
        self.states: dict[Target, TargetState] = {}
        for route in config.routes:
            for target in route.targets:
                self.states.setdefault(target, TargetState(target, resolve_key(target)))
        self.secrets = tuple(sorted({state.key for state in self.states.values() if state.key}, key=len, reverse=True))
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-store")  # SQLite: one writer
        self._auth_cache: dict[str, tuple[str | None, float]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    # --- application --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.server.max_body_bytes, middlewares=[self._errors, self._auth], handler_args={"max_field_size": 16384})
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        for path in ENDPOINTS:
            app.router.add_post(path, self._proxy)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        # The gateway's own loop is the only retry loop: aiohttp's client never retries a request.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True, trust_env=False)
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll_forever())

    async def _stop(self, _app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._session is not None:
            await self._session.close()
        self._store_thread.shutdown(wait=True)

    async def _poll_once(self) -> None:
        assert self._session is not None
        local = [state for state in self.states.values() if not state.target.hosted]
        await asyncio.gather(*(poll_target(self._session, state) for state in local))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self._poll_once()

    async def _in_store(self, function, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self._store_thread, function, *args)

    # --- middleware ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        try:
            return await handler(request)
        except Reject as reject:
            return reject.response()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.server.max_body_bytes
            return Reject(413, f"request body is larger than the gateway's limit of {limit} bytes", "invalid_request_error", "request_too_large", should_retry=False).response()
        except web.HTTPException as exc:
            if exc.status >= 400:
                return Reject(exc.status, exc.reason or "bad request", "invalid_request_error", should_retry=False).response()
            raise

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path == "/health":
            return await handler(request)
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not key:
            raise Reject(401, "no API key: send a gateway key as the bearer token (tierlocal gateway keys add NAME)", "invalid_request_error", "missing_api_key", should_retry=False)
        cached = self._auth_cache.get(key)
        moment = time.monotonic()
        if cached is not None and cached[1] > moment:
            user = cached[0]
        else:
            user = await self._in_store(self.store.authenticate, key)
            if len(self._auth_cache) > 10_000:
                self._auth_cache.clear()
            self._auth_cache[key] = (user, moment + AUTH_CACHE_S)
        if user is None:
            raise Reject(401, "the API key is not a live gateway key", "invalid_request_error", "invalid_api_key", should_retry=False)
        request["user"] = self.config.user(user) or User(user)
        return await handler(request)

    # --- simple routes ------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        moment = now()
        routes = {route.model: [self.states[target].describe(moment) for target in route.targets] for route in self.config.routes}
        return web.json_response({"status": "ok", "routes": routes})

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _models(self, _request: web.Request) -> web.Response:
        data = [{"id": route.model, "object": "model", "created": 0, "owned_by": "tierlocal"} for route in self.config.routes]
        return web.json_response({"object": "list", "data": data})

    # --- the proxy ----------------------------------------------------------------------------

    def _price(self, route: Route, target: Target) -> ApiPrices | None:
        return self.config.prices.get(target.model) or self.config.prices.get(route.model)

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise Reject(400, "the request body is not valid JSON", "invalid_request_error", "invalid_json", should_retry=False) from None
        if not isinstance(body, dict):
            raise Reject(400, "the request body must be a JSON object", "invalid_request_error", "invalid_json", should_retry=False)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise Reject(400, "the request names no model", "invalid_request_error", "missing_model", should_retry=False)
        route = self.config.route(model)
        if route is None:
            known = ", ".join(r.model for r in self.config.routes[:20]) or "none"
            raise Reject(404, f"the gateway has no route for model {model[:100]!r} (it serves: {known})", "invalid_request_error", "model_not_found", should_retry=False)
        user: User = request["user"]
        endpoint = ENDPOINTS[request.path]
        stream = body.get("stream") is True and endpoint != "/embeddings"
        options = body.get("stream_options")
        exchange = Exchange(user, route, stream, isinstance(options, dict) and options.get("include_usage") is True, worst_case_input_tokens(len(raw)))
        if route.store_bodies:
            exchange.request_body = self._redact(raw, route)

        max_tokens = requested_max_tokens(body)
        if endpoint == "/embeddings":
            output_bound = 0
        elif max_tokens is not None:
            output_bound = min(max_tokens, MAX_OUTPUT_TOKENS)
            if user.budget_usd is not None and max_tokens > output_bound:  # never more than reserved
                for name in ("max_tokens", "max_completion_tokens"):
                    if name in body:
                        body[name] = output_bound
        else:
            output_bound = self.config.server.default_max_tokens
            if user.budget_usd is not None:  # what is reserved is what may be generated
                body["max_tokens"] = output_bound

        limited = user.requests_per_minute or user.tokens_per_minute or user.concurrent_requests
        if self.shared_limiter is not None and limited:
            ticket = await self._in_store(self.shared_limiter.admit, user, exchange.input_bound + output_bound, time.time())
        else:
            ticket = self.limiter.admit(user, exchange.input_bound + output_bound, time.monotonic())
        if isinstance(ticket, float):
            self.metrics.requests.labels(model, "429").inc()
            raise Reject(429, f"rate limit for user {user.name!r} reached; retry after {ticket:.0f} s", "rate_limit_error", "rate_limit_exceeded", retry_after_s=ticket, should_retry=True)
        reservation: int | None = None
        try:
            if user.budget_usd is not None:
                reservation = await self._reserve(user, route, exchange.input_bound, output_bound)
            return await self._serve(request, body, endpoint, exchange, reservation)
        finally:
            tokens = None if exchange.usage is None else exchange.usage.prompt_tokens + exchange.usage.completion_tokens
            if isinstance(ticket, Ticket):
                self.limiter.release(ticket, tokens)
            else:
                await self._in_store(self.shared_limiter.release, ticket, tokens)  # type: ignore[union-attr]

    async def _reserve(self, user: User, route: Route, input_bound: int, output_bound: int) -> int:
        worst = 0.0
        for target in route.targets:
            if not target.hosted:
                continue
            prices = self._price(route, target)
            if prices is None:
                raise Reject(
                    403, f"no price for {target.model!r}, so a request by a user with a budget cannot be costed: add [prices.\"{target.model}\"] to the gateway's config",
                    "permission_error", "price_unknown", should_retry=False,
                )  # fmt: skip
            worst = max(worst, cost_usd(prices, Usage(input_bound, 0, output_bound)))
        assert user.budget_usd is not None
        reservation = await self._in_store(self.store.reserve, user.name, worst, user.budget_usd, user.budget_period)
        if reservation is None:
            spent = await self._in_store(self.store.spent, user.name, user.budget_period)
            self.metrics.requests.labels(route.model, "429").inc()
            raise Reject(
                429, f"budget reached for user {user.name!r}: ${spent:.4f} of ${user.budget_usd:.2f} this {user.budget_period} is spent or held, and this request may cost up to ${worst:.4f}",
                "insufficient_quota", "budget_exceeded", should_retry=False,
            )  # fmt: skip
        return reservation

    def _retry_waits(self, route: Route, excluded: set[Target]) -> list[tuple[float, TargetState]]:
        """(seconds until usable, target) for the targets this request may try again."""
        moment = now()
        return [
            (max(state.cooldown_until - moment, 0.0), state)
            for target in route.targets
            if target not in excluded and not (state := self.states[target]).missing_key
        ]

    def _candidates(self, route: Route, excluded: set[Target]) -> list[TargetState]:
        """Targets to try, best first: free and healthy, then full (spill over rather than
        queue), then ones that looked down at the last poll. Cooling and keyless ones are out."""
        moment = now()
        ready, full, down = [], [], []
        for target in route.targets:
            state = self.states[target]
            if target in excluded or state.missing_key or state.cooling(moment):
                continue
            (down if state.health == DOWN else full if state.full() else ready).append(state)
        return ready + full + down

    async def _serve(self, request: web.Request, body: dict[str, object], endpoint: str, exchange: Exchange, reservation: int | None) -> web.StreamResponse:
        route = exchange.route
        deadline = time.monotonic() + self.config.server.retry_deadline_s
        excluded: set[Target] = set()  # wrong for this request (e.g. its context is too small)
        failed: set[Target] = set()  # failed once; tried again only after the others, with backoff
        last_failure: AttemptFailed | None = None
        response: web.StreamResponse | None = None
        try:
            while time.monotonic() < deadline and exchange.attempts < MAX_ATTEMPTS:
                candidates = self._candidates(route, excluded)
                fresh = [state for state in candidates if state.target not in failed]
                if fresh:
                    state = fresh[0]
                else:
                    # Every target has failed this request once: wait (jittered, growing) for the
                    # first to be usable again — its cooldown, if it is cooling — then retry it.
                    waits = self._retry_waits(route, excluded)
                    if not waits:
                        break
                    wait_s, state = min(waits, key=lambda pair: pair[0])
                    backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(exchange.attempts - 1, 0)) * random.uniform(0.5, 1.0)  # noqa: S311
                    delay = max(wait_s, backoff)
                    if delay > BACKOFF_CAP_S or time.monotonic() + delay >= deadline:
                        break
                    await asyncio.sleep(delay)
                exchange.attempts += 1
                try:
                    response = await self._attempt(request, body, endpoint, exchange, state, reservation)
                    return response
                except AttemptFailed as failure:
                    last_failure = failure
                    exchange.reasons.append(failure.verdict.reason)
                    self.metrics.fallbacks.labels(route.model, failure.verdict.reason).inc()
                    failed.add(state.target)
                    if failure.verdict.reason == "context_exceeded":
                        excluded.add(state.target)
                    state.cool_down(failure.verdict.cooldown_s, failure.verdict.reason, now())
                    log.warning("attempt %d for %s on %s failed (%s): %s", exchange.attempts, route.model, state.label, failure.verdict.reason, failure.detail)
            # Nothing answered.
            exchange.status = 503
            if last_failure is not None and last_failure.verdict.reason == "context_exceeded" and not self._candidates(route, excluded):
                exchange.status = 400
                raise Reject(400, f"the request does not fit the context of any target for {route.model!r}: {last_failure.detail}", "invalid_request_error", "context_length_exceeded", should_retry=False)
            moment = now()
            waits = [self.states[t].cooldown_until - moment for t in route.targets if self.states[t].cooling(moment)]
            missing = [t.api_key_env or t.api_key_credential for t in route.targets if self.states[t].missing_key]
            detail = f"; last failure: {last_failure.verdict.reason} ({last_failure.detail})" if last_failure else ""
            if missing and len(missing) == len(route.targets):
                detail = f"; the upstream key is not set (set {missing[0]} in the gateway's environment)"
            raise Reject(
                503, f"no upstream for {route.model!r} answered after {exchange.attempts} attempt(s){detail}", "service_unavailable_error", "no_upstream",
                retry_after_s=min(waits) if waits else 1.0, should_retry=True,
            )  # fmt: skip
        except Reject as reject:
            exchange.status = reject.status
            await self._settle(exchange, reservation)
            raise
        finally:
            if exchange.status == 0:  # ended by an exception we did not expect: still settle
                exchange.status = 500
                await self._settle(exchange, reservation)

    def _upstream_request(self, body: dict[str, object], exchange: Exchange, state: TargetState) -> tuple[bytes, dict[str, str]]:
        upstream = dict(body)
        upstream["model"] = state.target.model
        if exchange.stream:
            options = upstream.get("stream_options")
            upstream["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}  # always priced from usage
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if exchange.stream else "application/json"}
        if state.key is not None:
            headers["Authorization"] = f"Bearer {state.key}"
        return json.dumps(upstream, ensure_ascii=False).encode(), headers

    async def _attempt(self, request: web.Request, body: dict[str, object], endpoint: str, exchange: Exchange, state: TargetState, reservation: int | None) -> web.StreamResponse:
        assert self._session is not None
        payload, headers = self._upstream_request(body, exchange, state)
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=self.config.server.upstream_timeout_s)
        state.in_flight += 1
        self.metrics.in_flight.labels(state.label).set(state.in_flight)
        started = time.monotonic()
        try:
            try:
                upstream = await self._session.post(state.target.url + endpoint, data=payload, headers=headers, timeout=timeout, allow_redirects=False)
            except asyncio.TimeoutError:
                self.metrics.upstream.labels(state.label, "timeout").inc()
                raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "timeout"), "no answer in time") from None
            except aiohttp.ClientError as exc:
                self.metrics.upstream.labels(state.label, "connect_error").inc()
                raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "connect_error"), self._clean(str(exc) or type(exc).__name__)) from None
            self.metrics.first_byte.labels(state.label).observe(time.monotonic() - started)
            async with upstream:
                if upstream.status != 200:
                    return await self._upstream_error(upstream, exchange, state, reservation)
                self.metrics.upstream.labels(state.label, "ok").inc()
                if exchange.stream:
                    return await self._relay_stream(request, upstream, exchange, state, reservation)
                return await self._relay_whole(upstream, exchange, state, reservation)
        finally:
            state.in_flight -= 1
            self.metrics.in_flight.labels(state.label).set(state.in_flight)

    def _clean(self, text: str) -> str:
        return protocol.sanitise(text, self.secrets)

    def _redact(self, data: bytes, route: Route) -> str:
        """A body as stored: its first bytes, without keys, bearer tokens or account ids."""
        cap = route.max_stored_body_bytes
        return protocol.sanitise(data[:cap].decode("utf-8", "replace"), self.secrets, limit=cap)

    async def _upstream_error(self, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None) -> web.StreamResponse:
        try:
            error_bytes, _more = await read_bounded(upstream.content, MAX_ERROR_BYTES)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            error_bytes = b""
        type_, message, code = protocol.upstream_error_fields(error_bytes)
        message = self._clean(message)
        verdict = protocol.classify(upstream.status, type_, message, code, {k.lower(): v for k, v in upstream.headers.items()}, self.config.server.error_cooldown_s)
        self.metrics.upstream.labels(state.label, str(upstream.status)).inc()
        if verdict.fall_back:
            raise AttemptFailed(verdict, f"HTTP {upstream.status} {type_ or code or ''}: {message}".strip())
        if upstream.status in (401, 403):
            message = f"the upstream for {exchange.route.model!r} refused the gateway's own key ({message or upstream.status}); tell the gateway's operator"
        exchange.target = state
        raise Reject(upstream.status, message or f"upstream answered HTTP {upstream.status}", type_ or "invalid_request_error", code, should_retry=False)

    async def _relay_whole(self, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None) -> web.Response:
        try:
            data, more = await read_bounded(upstream.content, MAX_RESPONSE_BYTES)
            if more:
                raise AttemptFailed(protocol.Verdict(True, 0.0, "response_too_large"), f"more than {MAX_RESPONSE_BYTES} bytes")
            document = json.loads(data)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "dropped"), self._clean(str(exc) or type(exc).__name__)) from None
        except (ValueError, UnicodeDecodeError):
            raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "bad_response"), "the upstream's answer is not JSON") from None
        exchange.target, exchange.status = state, 200
        exchange.usage = usage_from(document)
        exchange.request_id = response_id(document)
        exchange.keep_response(data)
        await self._settle(exchange, reservation)  # recorded before the client has the answer
        return web.Response(body=data, content_type="application/json", headers={"x-tierlocal-target": state.target.url})

    async def _relay_stream(self, request: web.Request, upstream: aiohttp.ClientResponse, exchange: Exchange, state: TargetState, reservation: int | None) -> web.StreamResponse:
        batches = sse_batches(upstream)
        # Before the first event reaches the client, a failure still falls back.
        try:
            batch = await anext(batches, None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "dropped"), self._clean(str(exc) or type(exc).__name__)) from None
        if batch is None:
            raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "dropped"), "the stream ended before its first event")
        in_band = event_error(batch[0])
        if in_band is not None:
            raise AttemptFailed(protocol.Verdict(True, self.config.server.error_cooldown_s, "stream_error"), self._clean(in_band))
        exchange.target, exchange.status = state, 200
        exchange.request_id = response_id(json_or_none(event_data(batch[0]) or b""))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "x-tierlocal-target": state.target.url})
        await response.prepare(request)
        failure: str | None = None
        done = False
        try:
            while True:
                if batch is None:
                    failure = "the upstream ended the stream without [DONE]"
                    break
                out: list[bytes] = []  # the events that arrived together leave together
                for event in batch:
                    data = event_data(event)
                    if data == b"[DONE]":
                        done = True
                        break
                    forward = True
                    if b"error" in event or (data is not None and b'"usage"' in data):
                        # Parse only the chunks that can matter: most are one token of content.
                        message = event_error(event)
                        if message is not None:
                            failure = self._clean(message)
                            break
                        document = None if data is None else json_or_none(data)
                        usage = usage_from(document)
                        if usage is not None:
                            exchange.usage = usage
                        if isinstance(document, dict) and document.get("choices"):
                            exchange.content_events += 1
                        elif usage is not None and not exchange.include_usage:
                            forward = False  # the usage-only chunk the client did not ask for
                    elif data is not None:
                        exchange.content_events += 1
                    if forward:
                        out.append(event)
                if out:
                    chunk = b"".join(out)
                    exchange.keep_response(chunk)
                    await response.write(chunk)
                if done or failure is not None:
                    break
                try:
                    batch = await anext(batches, None)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    failure = self._clean(str(exc) or type(exc).__name__) or "the upstream connection broke"
                    break
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            # The client went away: stop the upstream (closing it cancels generation) and
            # charge what we know.
            exchange.status = 499
            exchange.reasons.append("client_disconnected")
            self._estimate_usage(exchange)
            await self._settle(exchange, reservation)
            return response
        if failure is not None:
            exchange.status = 502
            exchange.reasons.append("stream_cut")
            self.metrics.upstream.labels(state.label, "stream_cut").inc()
            log.warning("stream for %s on %s broke after %d events: %s", exchange.route.model, state.label, exchange.content_events, failure)
            self._estimate_usage(exchange)
        await self._settle(exchange, reservation)  # recorded before the client sees the end
        try:
            if failure is not None:
                frame = protocol.error_body(f"the upstream stream broke: {failure}", "upstream_error", "stream_interrupted")
                await response.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return response

    def _estimate_usage(self, exchange: Exchange) -> None:
        """Without the upstream's usage: the input bound and one token per content event."""
        if exchange.usage is None:
            exchange.usage = Usage(exchange.input_bound, 0, exchange.content_events)
            exchange.usage_estimated = True

    async def _settle(self, exchange: Exchange, reservation: int | None) -> None:
        route, state = exchange.route, exchange.target
        usage = exchange.usage or Usage()
        prices = None if state is None or not state.target.hosted else self._price(route, state.target)
        cost = 0.0 if prices is None else cost_usd(prices, usage)
        reason = ",".join(exchange.reasons) or None
        if exchange.usage_estimated:
            reason = f"{reason or ''},usage_estimated".lstrip(",")
        latency_ms = (time.monotonic() - exchange.started) * 1000
        model = state.target.model if state is not None and state.target.hosted else route.model
        record = UsageRecord(
            exchange.user.name, model, route.model, "" if state is None else state.label, exchange.status,
            usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, cost, latency_ms, reason, exchange.request_id,
            exchange.request_body, self._redact(b"".join(exchange.response_kept), route) if route.store_bodies else None,
        )  # fmt: skip
        await self._in_store(self.store.settle, reservation, record)
        if exchange.user.budget_usd is not None:
            spent = await self._in_store(self.store.spent, exchange.user.name, exchange.user.budget_period)
            self.metrics.budget_remaining.labels(exchange.user.name).set(max(exchange.user.budget_usd - spent, 0.0))
        self.metrics.requests.labels(route.model, str(exchange.status)).inc()
        self.metrics.latency.labels(route.model).observe(latency_ms / 1000)
        for kind, count in (("prompt", usage.prompt_tokens), ("cached", usage.cached_tokens), ("completion", usage.completion_tokens)):
            if count:
                self.metrics.tokens.labels(route.model, kind).inc(count)
        if cost:
            self.metrics.spend.labels(route.model).inc(cost)
        log.info(
            "user=%s model=%s target=%s status=%d attempts=%d fallback=%s prompt=%d cached=%d completion=%d cost_usd=%.6f latency_ms=%.0f",
            exchange.user.name, route.model, "-" if state is None else state.label, exchange.status, exchange.attempts, reason or "-",
            usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, cost, latency_ms,
        )  # fmt: skip

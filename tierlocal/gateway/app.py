"""The gateway's HTTP server: OpenAI's routes in front of an ordered list of upstreams per model.

One request goes through: authentication (a gateway key, hashed in the store) → body checks →
route → rate limits → budget reservation (worst case, atomic: ledger.py) → the one retry loop
(targets in order, skipping those down, cooling or full; jittered backoff before trying a target
again; no new attempt after the deadline) → one attempt on a target (relay.py) → settlement (the
reservation replaced by the cost the upstream's ``usage`` gives) and a usage row, written before
the response's last bytes go out.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from .backends import DOWN, UP, TargetState, now, poll_target, resolve_key
from .config import GatewayConfig, Route, Target, User
from .ledger import Ledger
from .limiter import limiter_for
from .metrics import Metrics
from .pricing import worst_case_input_tokens
from .protocol import printable
from .relay import Relay
from .request_body import OutputLimits, output_limits, parse_json_object
from .store import Store
from .store_worker import StoreWorker
from .ui import Dashboard
from .wire import AttemptFailed, Exchange, Reject

__all__ = ["Gateway", "ENDPOINTS", "create_app"]

log = logging.getLogger("tierlocal.gateway")

#: Client path → upstream path below the target's base URL.
ENDPOINTS = {"/v1/chat/completions": "/chat/completions", "/v1/completions": "/completions", "/v1/embeddings": "/embeddings"}
#: Backoff before trying a target again: base · 2^n seconds, jittered, capped; a target that
#: asks for a longer wait than the cap is not retried within the request (the client is told
#: when to come back). At most MAX_ATTEMPTS attempts per request, over all targets.
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
MAX_ATTEMPTS = 6
#: Failures that trying the same target again within one request cannot mend: the target is not
#: tried again for it, and when nothing else answered the 503 says not to retry.
UNFIXABLE_BY_RETRY = frozenset({"dns_error", "no_key"})
#: Seconds between health polls of local targets; seconds an authenticated key is cached.
POLL_INTERVAL_S = 2.0
AUTH_CACHE_S = 2.0


#: The authenticated user of a request (set by the auth middleware).
USER = web.RequestKey("user", User)


def create_app(config: GatewayConfig, store: Store, *, metrics_dir: Path | None = None) -> web.Application:
    """The gateway's aiohttp application for ``config``, keeping its state in ``store``
    (``metrics_dir``: one of several worker processes, whose metrics are summed from there)."""
    return Gateway(config, store, metrics_dir).app()


class Gateway:
    """The aiohttp application and the state it routes with."""

    def __init__(self, config: GatewayConfig, store: Store, metrics_dir: Path | None = None) -> None:
        self.config = config
        self.store = store
        self.metrics = Metrics(metrics_dir)
        self.worker = StoreWorker()
        self.limiter = limiter_for(store.shared_limiter(), self.worker)  # Redis: one sliding minute for every replica
        self.states: dict[Target, TargetState] = {}
        for route in config.routes:
            for target in route.targets:
                self.states.setdefault(target, TargetState(target, resolve_key(target)))
        self.secrets = tuple(sorted({state.key for state in self.states.values() if state.key}, key=len, reverse=True))
        self.ledger = Ledger(config, store, self.metrics, self.secrets, self.worker)
        self.relay: Relay | None = None  # made at start-up, with the client session
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
        dashboard = Dashboard(
            self.config, self.store, authenticate=self.user_for_key, store_call=self.worker.call, health=self._health_report, metrics=self.metrics.render
        )
        dashboard.add_routes(app)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
        # The gateway's own loop is the only retry loop: aiohttp's client never retries a request.
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True, trust_env=False)
        self.relay = Relay(self.config, self.metrics, self._session, self.ledger.settle, self.secrets)
        await self._poll_once()
        self._poller = asyncio.create_task(self._poll_forever())

    async def _stop(self, _app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._session is not None:
            await self._session.close()
        self.worker.close()

    async def _poll_once(self) -> None:
        assert self._session is not None
        local = [state for state in self.states.values() if not state.target.hosted]
        await asyncio.gather(*(poll_target(self._session, state) for state in local))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self._poll_once()

    # --- middleware ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        try:
            return await handler(request)
        except Reject as reject:
            return reject.response()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.server.max_body_bytes
            return Reject(
                413, f"request body is larger than the gateway's limit of {limit} bytes", "invalid_request_error", "request_too_large", should_retry=False
            ).response()
        except web.HTTPException as exc:
            if exc.status >= 400:
                return Reject(exc.status, exc.reason or "bad request", "invalid_request_error", should_retry=False).response()
            raise

    async def user_for_key(self, key: str) -> str | None:
        """The user whose live gateway key ``key`` is (cached for AUTH_CACHE_S), else None."""
        cached = self._auth_cache.get(key)
        moment = time.monotonic()
        if cached is not None and cached[1] > moment:
            return cached[0]
        user = await self.worker.call(self.store.authenticate, key)
        if len(self._auth_cache) > 10_000:
            self._auth_cache.clear()
        self._auth_cache[key] = (user, moment + AUTH_CACHE_S)
        return user

    @web.middleware
    async def _auth(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path in ("/health", "/ui", "/favicon.ico") or request.path.startswith("/ui/"):
            return await handler(request)  # the dashboard signs its users in itself (ui.py)
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not key:
            raise Reject(
                401,
                "no API key: send a gateway key as the bearer token (tierlocal gateway keys add NAME)",
                "invalid_request_error",
                "missing_api_key",
                should_retry=False,
            )
        user = await self.user_for_key(key)
        if user is None:
            raise Reject(401, "the API key is not a live gateway key", "invalid_request_error", "invalid_api_key", should_retry=False)
        request[USER] = self.config.user(user) or User(user)
        return await handler(request)

    # --- simple routes ------------------------------------------------------------------------

    def _health_report(self) -> dict[str, object]:
        """What ``GET /health`` answers: each route's targets and their state now."""
        moment = now()
        routes = {route.model: [self.states[target].describe(moment) for target in route.targets] for route in self.config.routes}
        return {"status": "ok", "routes": routes}

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response(self._health_report())

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _models(self, _request: web.Request) -> web.Response:
        data = [{"id": route.model, "object": "model", "created": 0, "owned_by": "tierlocal"} for route in self.config.routes]
        return web.json_response({"object": "list", "data": data})

    # --- the proxy ----------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        try:
            raw = await asyncio.wait_for(request.read(), self.config.server.body_timeout_s)
        except ConnectionError:  # the client left while sending: nobody to answer, nothing held
            log.info("a client left before its request body arrived")
            return web.Response(status=400)
        except TimeoutError:
            raise Reject(
                408, f"the request body took longer than {self.config.server.body_timeout_s:g} s to arrive", "invalid_request_error", "request_timeout",
                should_retry=True,
            ) from None  # fmt: skip
        body, route = self._parse(raw)
        user = request[USER]
        endpoint = ENDPOINTS[request.path]
        stream = body.get("stream") is True and endpoint != "/embeddings"
        options = body.get("stream_options")
        exchange = Exchange(user, route, stream, isinstance(options, dict) and options.get("include_usage") is True, worst_case_input_tokens(len(raw)))
        if route.store_bodies:
            exchange.request_body = self.ledger.redact(raw, route)
        limits = (
            OutputLimits(0)
            if endpoint == "/embeddings"
            else output_limits(body, default_max_tokens=self.config.server.default_max_tokens, budgeted=user.budget_usd is not None)
        )
        exchange.adjusted = limits.adjusted
        output_bound = limits.tokens
        ticket = await self._admit(user, route, exchange.input_bound + output_bound)
        reservation: int | None = None
        try:
            if user.budget_usd is not None:
                reservation = await self.ledger.reserve(user, route, exchange.input_bound, output_bound)
            return await self._serve(request, body, endpoint, exchange, reservation)
        finally:
            tokens = None if exchange.usage is None else exchange.usage.prompt_tokens + exchange.usage.completion_tokens
            await self.limiter.release(ticket, tokens)

    def _parse(self, raw: bytes) -> tuple[dict[str, object], Route]:
        """The request's JSON object and the route its model names.

        Raises:
            Reject: not JSON, not an object, no model (400), or a model with no route (404).
        """
        body = parse_json_object(raw)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise Reject(400, "the request names no model", "invalid_request_error", "missing_model", should_retry=False)
        route = self.config.route(model)
        if route is None:
            known = ", ".join(r.model for r in self.config.routes[:20]) or "none"
            raise Reject(
                404, f"the gateway has no route for model {model[:100]!r} (it serves: {known})", "invalid_request_error", "model_not_found", should_retry=False
            )
        return body, route

    async def _admit(self, user: User, route: Route, tokens: int) -> object:
        """A rate-limit ticket (shared through Redis when the store offers it).

        Raises:
            Reject: 429 with Retry-After when a limit is reached.
        """
        ticket = await self.limiter.admit(user, tokens)
        if isinstance(ticket, float):
            self.metrics.requests.labels(route.model, "429").inc()
            raise Reject(
                429,
                f"rate limit for user {user.name!r} reached; retry after {ticket:.0f} s",
                "rate_limit_error",
                "rate_limit_exceeded",
                retry_after_s=ticket,
                should_retry=True,
            )
        return ticket

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
        ready: list[TargetState] = []
        full: list[TargetState] = []
        down: list[TargetState] = []
        for target in route.targets:
            state = self.states[target]
            if target in excluded or state.missing_key or state.cooling(moment):
                continue
            (down if state.health == DOWN else full if state.full() else ready).append(state)
        return ready + full + down

    async def _serve(self, request: web.Request, body: dict[str, object], endpoint: str, exchange: Exchange, reservation: int | None) -> web.StreamResponse:
        """The one retry loop: targets in order, each failed one tried again only after the
        others, after its cooldown or a jittered backoff; no attempt after the deadline."""
        route = exchange.route
        deadline = time.monotonic() + self.config.server.retry_deadline_s
        excluded: set[Target] = set()  # wrong for this request (e.g. its context is too small)
        failed: set[Target] = set()  # failed once; tried again only after the others, with backoff
        passed_over: set[Target] = set()  # earlier in the route, skipped without an attempt: counted once
        last_failure: AttemptFailed | None = None
        try:
            while time.monotonic() < deadline and exchange.attempts < MAX_ATTEMPTS:
                state = await self._next_target(route, excluded, failed, exchange, deadline)
                if state is None:
                    break
                self._count_passed_over(route, state, excluded, failed, passed_over, exchange)
                exchange.attempts += 1
                try:
                    assert self.relay is not None  # the app has started
                    response = await self.relay.attempt(request, body, endpoint, exchange, state, reservation)
                    if state.target.hosted:
                        state.health = UP  # not polled: an answer is what says it is up
                    return response
                except AttemptFailed as failure:
                    last_failure = failure
                    exchange.reasons.append(failure.verdict.reason)
                    self.metrics.fallbacks.labels(route.model, failure.verdict.reason).inc()
                    failed.add(state.target)
                    if failure.verdict.reason == "context_exceeded" or failure.verdict.reason in UNFIXABLE_BY_RETRY:
                        excluded.add(state.target)
                    state.cool_down(failure.verdict.cooldown_s, failure.verdict.reason, now())
                    log.warning(
                        "attempt %d for %s on %s failed (%s): %s",
                        exchange.attempts, printable(route.model), printable(state.label), failure.verdict.reason, printable(failure.detail, 2000),
                    )  # fmt: skip
            raise self._no_answer(exchange, excluded, last_failure)
        except Reject as reject:  # its status is the exchange's: 503 when nothing answered
            exchange.status = reject.status
            await self.ledger.settle(exchange, reservation)
            raise
        finally:
            if exchange.status == 0:  # ended by an exception we did not expect: still settle
                exchange.status = 500
                await self.ledger.settle(exchange, reservation)

    def _count_passed_over(
        self, route: Route, chosen: TargetState, excluded: set[Target], failed: set[Target], passed_over: set[Target], exchange: Exchange
    ) -> None:
        """Every target ahead of ``chosen`` in the route that this request skips without trying
        it is a fallback too (the local engine down or busy, a target cooling down): logged,
        counted in ``tierlocal_gateway_fallbacks_total`` and kept in the usage row, with why."""
        moment = now()
        for target in route.targets:
            if target == chosen.target:
                return
            if target in failed or target in passed_over:
                continue  # its failed attempt was counted with its own reason
            passed_over.add(target)
            reason = self.states[target].passed_over_reason(target in excluded, moment)
            exchange.reasons.append(reason)
            self.metrics.fallbacks.labels(route.model, reason).inc()

    async def _next_target(self, route: Route, excluded: set[Target], failed: set[Target], exchange: Exchange, deadline: float) -> TargetState | None:
        """The next target to try: the best one not yet failed; once every target has failed
        this request, the first usable again after its cooldown or a jittered, growing backoff
        (waited here). None when no wait fits the cap and the deadline."""
        fresh = [state for state in self._candidates(route, excluded) if state.target not in failed]
        if fresh:
            return fresh[0]
        waits = self._retry_waits(route, excluded)
        if not waits:
            return None
        wait_s, state = min(waits, key=lambda pair: pair[0])
        backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(exchange.attempts - 1, 0)) * random.uniform(0.5, 1.0)
        delay = max(wait_s, backoff)
        if delay > BACKOFF_CAP_S or time.monotonic() + delay >= deadline:
            return None
        await asyncio.sleep(delay)
        return state

    def _no_answer(self, exchange: Exchange, excluded: set[Target], last_failure: AttemptFailed | None) -> Reject:
        """Why nothing answered: the request fits no target's context (400), or 503 with
        Retry-After (the shortest cooldown), naming a missing upstream key when that is why."""
        route = exchange.route
        if last_failure is not None and last_failure.verdict.reason == "context_exceeded" and not self._candidates(route, excluded):
            return Reject(
                400,
                f"the request does not fit the context of any target for {route.model!r}: {last_failure.detail}",
                "invalid_request_error",
                "context_length_exceeded",
                should_retry=False,
            )
        moment = now()
        waits = [self.states[t].cooldown_until - moment for t in route.targets if self.states[t].cooling(moment)]
        missing = [t.api_key_env or t.api_key_credential for t in route.targets if self.states[t].missing_key]
        detail = f"; last failure: {last_failure.verdict.reason} ({last_failure.detail})" if last_failure else ""
        if missing and len(missing) == len(route.targets):
            detail = f"; the upstream key is not set (set {missing[0]} in the gateway's environment)"
        # A configuration the operator must fix (no key, a host name that does not resolve) is
        # not worth the client's retries: the SDKs honour x-should-retry: false.
        unfixable = (bool(missing) and len(missing) == len(route.targets)) or (bool(exchange.reasons) and set(exchange.reasons) <= UNFIXABLE_BY_RETRY)
        return Reject(
            503, f"no upstream for {route.model!r} answered after {exchange.attempts} attempt(s){detail}", "service_unavailable_error", "no_upstream",
            retry_after_s=None if unfixable else (min(waits) if waits else 1.0), should_retry=not unfixable,
        )  # fmt: skip

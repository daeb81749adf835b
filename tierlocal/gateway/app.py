"""The gateway's HTTP server: OpenAI's routes, Anthropic's Messages and OpenAI's Responses
(dialects/) in front of an ordered list of upstreams per model.

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
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

from ..serve.state import running_servers
from .backends import UP, TargetState, now, resolve_key
from .config import GatewayConfig, Route, Target, User
from .dialects import DIALECTS, dialect_for_path
from .dialects.leg import leg_for
from .health import poll_target
from .ledger import Ledger
from .limiter import limiter_for
from .live_users import LiveUsers
from .metrics import Metrics
from .pricing import worst_case_input_tokens
from .protocol import printable
from .relay import Relay
from .request_body import OutputLimits, output_limits, parse_request
from .speed_floor import engine_key
from .store import Store
from .store_worker import StoreWorker
from .targets import MAX_ATTEMPTS, UNFIXABLE_BY_RETRY, next_target, next_user_speed, no_answer, passed_over_reasons, too_slow
from .ui import Dashboard
from .wire import AttemptFailed, Exchange, Reject

__all__ = ["Gateway", "create_app"]

log = logging.getLogger("tierlocal.gateway")

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
        self.live_users = LiveUsers(config)
        self.dashboard: Dashboard | None = None  # made with the application
        self._auth_cache: dict[str, tuple[str | None, float]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    # --- application --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.server.max_body_bytes, middlewares=[self._errors, self._auth], handler_args={"max_field_size": 16384}
        )
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        for path in DIALECTS:
            app.router.add_post(path, self._proxy)
        self.dashboard = dashboard = Dashboard(
            self.config,
            self.store,
            authenticate=self.user_for_key,
            store_call=self.worker.call,
            health=self._health_report,
            metrics=self.metrics.render,
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
        if any(route.min_user_tokens_per_s or route.max_first_token_s for route in self.config.routes):
            curves = {engine_key(server.url): server.users_curve for server in await asyncio.to_thread(running_servers)}
            for state in local:
                state.curve = curves.get(engine_key(state.target.url), ())

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self._poll_once()

    def _read_users_again(self) -> None:
        """Take the config file's [[users]] if they changed."""
        users = self.live_users.refresh()
        if users is None:
            return
        self.config = replace(self.config, users=users)
        if self.dashboard is not None:
            self.dashboard.config = self.config

    def configured_user(self, name: str) -> User:
        """The user ``name`` authenticated as, with the limits and budget the config file gives
        them now; a user the file does not name is refused when it names any (the operator's
        own "local" key excepted), and has no limits only when it names none.

        Raises:
            Reject: 403, a key whose user has no [[users]] entry.
        """
        self._read_users_again()  # a stat of the file; read only when it changed
        user = self.config.user(name)
        if user is not None:
            return user
        if not self.config.users or name == "local":
            return User(name)
        raise Reject(
            403,
            f"user {name!r} has a gateway key but no [[users]] entry in the running gateway's config ({self.config.source}): "
            "add one with its limits and budget (the gateway reads [[users]] again when the file changes)",
            "permission_error",
            "user_not_configured",
            should_retry=False,
        )

    # --- middleware ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler):  # type: ignore[no-untyped-def]
        try:
            return await handler(request)
        except Reject as reject:
            return reject.response(dialect_for_path(request.path))
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.server.max_body_bytes
            return Reject(
                413,
                f"request body is larger than the gateway's limit of {limit} bytes",
                "invalid_request_error",
                "request_too_large",
                should_retry=False,
            ).response(dialect_for_path(request.path))
        except web.HTTPException as exc:
            if exc.status >= 400:
                refusal = Reject(exc.status, exc.reason or "bad request", "invalid_request_error", should_retry=False)
                return refusal.response(dialect_for_path(request.path))
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
        key = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "").strip()  # Anthropic's clients
        if not key:
            raise Reject(
                401,
                "no API key: send a gateway key as the bearer token or in x-api-key (tierlocal gateway keys add NAME)",
                "invalid_request_error",
                "missing_api_key",
                should_retry=False,
            )
        user = await self.user_for_key(key)
        if user is None:
            raise Reject(401, "the API key is not a live gateway key", "invalid_request_error", "invalid_api_key", should_retry=False)
        request[USER] = self.configured_user(user)
        return await handler(request)

    # --- simple routes ------------------------------------------------------------------------

    def _health_report(self) -> dict[str, object]:
        """What ``GET /health`` answers: each route's targets and their state now."""
        moment = now()
        routes = {route.model: [self._describe(route, target, moment) for target in route.targets] for route in self.config.routes}
        return {"status": "ok", "routes": routes}

    def _describe(self, route: Route, target: Target, moment: float) -> dict[str, object]:
        """A target's state now, and — where its serve's users table is known — its speed with one
        more user and whether the route's floor passes it over at that load."""
        state = self.states[target]
        described = state.describe(moment)
        if state.curve:
            speed, slow = next_user_speed(state), too_slow(route, state)
            described.update(next_user=None if speed is None else speed.to_json(), passed_over_for=None if slow is None else slow.reason)
        return described

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
                408,
                f"the request body took longer than {self.config.server.body_timeout_s:g} s to arrive",
                "invalid_request_error",
                "request_timeout",
                should_retry=True,
            ) from None
        dialect = DIALECTS[request.path]
        body, route = parse_request(raw, dialect, self.config)
        user = request[USER]
        exchange = Exchange(user, route, dialect.stream_requested(body), dialect.usage_requested(body), worst_case_input_tokens(len(raw)), dialect)
        if route.store_bodies:
            exchange.request_body = self.ledger.redact(raw, route)
        limits = (
            output_limits(
                body,
                default_max_tokens=self.config.server.default_max_tokens,
                budgeted=user.budget_usd is not None,
                cap_fields=dialect.cap_fields,
                choice_fields=dialect.choice_fields,
            )
            if dialect.generates
            else OutputLimits(0)
        )
        exchange.adjusted = limits.adjusted
        output_bound = limits.tokens
        ticket = await self._admit(user, route, exchange.input_bound + output_bound)
        reservation: int | None = None
        try:
            if user.budget_usd is not None:
                reservation = await self.ledger.reserve(user, route, exchange.input_bound, output_bound)
            return await self._serve(request, body, exchange, reservation)
        finally:
            tokens = None if exchange.usage is None else exchange.usage.prompt_tokens + exchange.usage.completion_tokens
            await self.limiter.release(ticket, tokens)

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

    async def _serve(self, request: web.Request, body: dict[str, object], exchange: Exchange, reservation: int | None) -> web.StreamResponse:
        """The one retry loop: targets in order, each failed one tried again only after the
        others, after its cooldown or a jittered backoff; no attempt after the deadline."""
        route = exchange.route
        deadline = time.monotonic() + self.config.server.retry_deadline_s
        # wrong for this request: its protocol is not spoken there, its context is too small …
        excluded = {target for target in route.targets if leg_for(exchange.dialect, target.speaks) is None}
        failed: set[Target] = set()  # failed once; tried again only after the others, with backoff
        passed_over = set(excluded)  # earlier in the route, skipped without an attempt: counted once (a protocol it lacks: never)
        last_failure: AttemptFailed | None = None
        try:
            while time.monotonic() < deadline and exchange.attempts < MAX_ATTEMPTS:
                state = await next_target(route, self.states, excluded, failed, exchange.attempts, deadline)
                if state is None:
                    break
                for reason, detail in passed_over_reasons(route, self.states, state, excluded, failed, passed_over):
                    exchange.reasons.append(reason)
                    self.metrics.fallbacks.labels(route.model, reason).inc()
                    if detail is not None:
                        log.info("passed over for %s (%s): %s", printable(route.model), reason, printable(detail))
                exchange.attempts += 1
                try:
                    assert self.relay is not None  # the app has started
                    response = await self.relay.attempt(request, body, exchange, state, reservation)
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
                        exchange.attempts,
                        printable(route.model),
                        printable(state.label),
                        failure.verdict.reason,
                        printable(failure.detail, 2000),
                    )
            raise no_answer(exchange, self.states, excluded, last_failure)
        except Reject as reject:  # its status is the exchange's: 503 when nothing answered
            exchange.status = reject.status
            await self.ledger.settle(exchange, reservation)
            raise
        finally:
            if exchange.status == 0:  # ended by an exception we did not expect: still settle
                exchange.status = 500
                await self.ledger.settle(exchange, reservation)

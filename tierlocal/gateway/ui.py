"""The dashboard under ``/ui``: served by the gateway on its own listener, or by
``tierlocal dashboard`` (loopback only) when no gateway runs.

Security:
- Every page and data endpoint needs a live gateway key: the bearer header, or the cookie the
  sign-in form sets (``HttpOnly``, ``SameSite=Strict``, ``Path=/ui``, ``Secure`` over TLS). A key
  is never read from the URL.
- No state-changing GET: sign-in and sign-out are POSTs that carry a CSRF token equal to a
  cookie of their own (double submit), and are refused from another origin.
- A strict Content-Security-Policy (scripts, styles, images and fetches from this origin only;
  no inline script; no frames), ``nosniff``, no referrer to other origins, no caching.
- No upstream key, user key or stored body is rendered: the pages show what ``hw``, ``status``,
  ``status --live``, ``/health``, ``/metrics`` and ``usage`` say, and none of those hold one.
- A user without ``admin = true`` sees their own spend only.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from ..report.pages import ICON, PAGES, SCRIPT, STYLESHEET, live_section, login_page, machine_section, page, spend_section
from ..report.set_page import sets_section
from ..serve.live import Throughput, live_report
from ..serve.state import running_servers, running_sets
from .config import GatewayConfig
from .store import Store
from .store.base import MAX_KEY_CHARS, looks_like_key
from .usage_report import PERIODS, usage_report

__all__ = ["Dashboard", "dashboard_app", "KEY_COOKIE", "CSRF_COOKIE", "CONTENT_SECURITY_POLICY"]

KEY_COOKIE = "tierlocal_key"
CSRF_COOKIE = "tierlocal_csrf"
#: Seconds a sign-in lasts.
SESSION_S = 12 * 3600
#: Largest sign-in or sign-out form accepted (bytes).
MAX_FORM_BYTES = 4096
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it Chromium sends "Origin: null" on a form POST, and the origin check fails.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}

Authenticate = Callable[[str], Awaitable[str | None]]
StoreCall = Callable[..., Awaitable[Any]]


class Dashboard:
    """The pages, their data and their sign-in, for one gateway (``health`` and ``metrics``
    given) or for ``tierlocal dashboard`` (neither)."""

    def __init__(
        self,
        config: GatewayConfig,
        store: Store,
        *,
        authenticate: Authenticate,
        store_call: StoreCall,
        health: Callable[[], dict[str, Any]] | None = None,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.authenticate = authenticate
        self.store_call = store_call
        self.health = health
        self.metrics = metrics
        self.history: dict[str, Throughput] = {}
        self._hardware: dict[str, Any] | None = None
        self._session: aiohttp.ClientSession | None = None

    # --- wiring --------------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self._home)
        app.router.add_get("/ui/", self._home)
        app.router.add_get("/ui/login", self._login_form)
        app.router.add_post("/ui/login", self._login)
        app.router.add_post("/ui/logout", self._logout)
        app.router.add_get("/ui/logout", self._logout_by_get)
        app.router.add_get("/ui/static/ui.js", self._script)
        app.router.add_get("/ui/static/ui.css", self._stylesheet)
        app.router.add_get("/ui/static/icon.svg", self._icon)
        app.router.add_get("/favicon.ico", self._icon)  # browsers ask for it on every origin
        app.router.add_get("/ui/data/{name}.json", self._data)
        app.router.add_get("/ui/{name}", self._page)
        app.on_cleanup.append(self._close)

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    # --- who is asking -------------------------------------------------------------------------

    async def user_of(self, request: web.Request) -> str | None:
        """The user whose live key came as the bearer header or the sign-in cookie."""
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header[:7].lower() == "bearer " else request.cookies.get(KEY_COOKIE, "")
        if not key or len(key) > MAX_KEY_CHARS or not looks_like_key(key):
            return None
        return await self.authenticate(key)

    # --- sign-in -------------------------------------------------------------------------------

    @staticmethod
    def _csrf(request: web.Request) -> str:
        token = request.cookies.get(CSRF_COOKIE, "")
        return token if 20 <= len(token) <= 100 and token.isascii() else ""

    def _respond(self, request: web.Request, response: web.Response, csrf: str | None = None) -> web.Response:
        response.headers.update(_HEADERS)
        if csrf is not None and csrf != self._csrf(request):
            response.set_cookie(CSRF_COOKIE, csrf, path="/ui", httponly=True, samesite="Strict", secure=request.secure)
        return response

    def _html(self, request: web.Request, body: str, *, status: int = 200, csrf: str | None = None) -> web.Response:
        return self._respond(request, web.Response(text=body, status=status, content_type="text/html", charset="utf-8"), csrf)

    async def _home(self, request: web.Request) -> web.Response:
        return _see_other("/ui/machine")

    async def _login_form(self, request: web.Request) -> web.Response:
        csrf = self._csrf(request) or secrets.token_urlsafe(32)
        return self._html(request, login_page(csrf=csrf), csrf=csrf)

    async def _checked_form(self, request: web.Request) -> dict[str, str]:
        """The posted form, after the CSRF checks: same origin, and a token equal to the cookie's."""
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise web.HTTPForbidden(reason="cross-site form refused")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(reason="a form from another origin is refused")
        if request.content_length is None or request.content_length > MAX_FORM_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_FORM_BYTES, actual_size=request.content_length or 0)
        form = await request.post()
        token, expected = str(form.get("csrf", "")), self._csrf(request)
        if not expected or not hmac.compare_digest(token.encode(), expected.encode()):
            raise web.HTTPForbidden(reason="the form's CSRF token does not match: reload the sign-in page and try again")
        return {name: str(value) for name, value in form.items()}

    async def _login(self, request: web.Request) -> web.Response:
        form = await self._checked_form(request)
        key = form.get("key", "").strip()
        user = await self.authenticate(key) if key and len(key) <= MAX_KEY_CHARS and looks_like_key(key) else None
        csrf = self._csrf(request)
        if user is None:
            return self._html(request, login_page(csrf=csrf, error="That is not a live gateway key."), status=401, csrf=csrf)
        response = _see_other("/ui/machine")
        response.set_cookie(KEY_COOKIE, key, path="/ui", httponly=True, samesite="Strict", secure=request.secure, max_age=SESSION_S)
        return response

    async def _logout(self, request: web.Request) -> web.Response:
        await self._checked_form(request)
        response = _see_other("/ui/login")
        response.del_cookie(KEY_COOKIE, path="/ui")
        return response

    async def _logout_by_get(self, _request: web.Request) -> web.Response:
        raise web.HTTPMethodNotAllowed("GET", ["POST"], headers=_HEADERS)

    # --- static --------------------------------------------------------------------------------

    async def _script(self, request: web.Request) -> web.Response:
        return self._respond(request, web.Response(text=SCRIPT, content_type="text/javascript", charset="utf-8"))

    async def _stylesheet(self, request: web.Request) -> web.Response:
        return self._respond(request, web.Response(text=STYLESHEET, content_type="text/css", charset="utf-8"))

    async def _icon(self, request: web.Request) -> web.Response:
        return self._respond(request, web.Response(text=ICON, content_type="image/svg+xml", charset="utf-8"))

    # --- pages and data ------------------------------------------------------------------------

    async def _named(self, request: web.Request) -> tuple[str, str | None]:
        """The page a request names (404 for another) and the signed-in user, if any."""
        name = request.match_info["name"]
        if name not in PAGES:
            raise web.HTTPNotFound(reason=f"no page {name!r}: the pages are {', '.join(PAGES)}")
        return name, await self.user_of(request)

    async def _page(self, request: web.Request) -> web.Response:
        name, user = await self._named(request)
        if user is None:
            return _see_other("/ui/login")
        period = self._period(request)
        section, _data = await self._section(name, user, period)
        csrf = self._csrf(request) or secrets.token_urlsafe(32)
        data_url = f"/ui/data/{name}.json" + (f"?period={period}" if name == "spend" else "")
        body = page(name, section, user=user, csrf=csrf, data_url=data_url, updated=_now())
        return self._html(request, body, csrf=csrf)

    async def _data(self, request: web.Request) -> web.Response:
        name, user = await self._named(request)
        if user is None:
            response = web.json_response(
                {"error": {"message": "sign in first: no live gateway key came with the request", "type": "invalid_request_error"}}, status=401
            )
            return self._respond(request, response)
        section, data = await self._section(name, user, self._period(request))
        return self._respond(request, web.json_response({"page": name, "updated": _now(), "data": data, "html": section}))

    @staticmethod
    def _period(request: web.Request) -> str:
        period = request.query.get("period", "month")
        if period not in PERIODS:
            raise web.HTTPBadRequest(reason=f"period must be one of {', '.join(PERIODS)}")
        return period

    async def _section(self, name: str, user: str, period: str) -> tuple[str, dict[str, Any]]:
        if name == "machine":
            machine = await self.machine()
            return machine_section(machine["hardware"], machine["servers"]), machine
        if name == "live":
            live = await self.live()
            return live_section(live["engines"], live["routes"], live["fallbacks"]) + sets_section(live["sets"]), live
        spend = await self.spend(user, period)
        return spend_section(spend, user=user, everyone=self.config.is_admin(user)), spend

    async def machine(self) -> dict[str, Any]:
        """``hw --json`` (detected once) and every running serve's ``status --json``."""
        if self._hardware is None:
            from ..hardware.detect import detect  # probes may start llama-server --list-devices

            self._hardware = (await asyncio.to_thread(detect)).to_json()
        servers = await asyncio.to_thread(running_servers)
        return {"hardware": self._hardware, "servers": [_without_argv(server.to_json()) for server in servers]}

    async def live(self) -> dict[str, Any]:
        """``status --live --json``'s engines (rates over the last 5 minutes of this dashboard's
        samples), the gateway's ``/health`` routes and the fallbacks its ``/metrics`` counts."""
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        servers = await asyncio.to_thread(running_servers)
        engines = await live_report(servers, self.history, window_s=300.0, session=self._session)
        routes = None if self.health is None else self.health()["routes"]
        sets = await asyncio.to_thread(running_sets)
        return {"engines": engines, "routes": routes, "fallbacks": _fallbacks(self.metrics() if self.metrics else b""), "sets": sets}

    async def spend(self, user: str, period: str) -> dict[str, Any]:
        """``usage --period P --json``; for a user who is not an admin, their own rows only."""
        report: dict[str, Any] = await self.store_call(usage_report, self.config, self.store, period)
        if self.config.is_admin(user):
            return report
        own = {name: row for name, row in report["users"].items() if name == user}
        budgets = {name: row for name, row in report["budgets"].items() if name == user}
        return {
            "period": report["period"],
            "since": report["since"],
            "users": own,
            "budgets": budgets,
            "models": {},
            "targets": {},
            "by_tier": {},
            "clusters": {},
            "local": {},
            "break_even": {},
        }


def _without_argv(server: dict[str, Any]) -> dict[str, Any]:
    """A status object as the page uses it: the engine's argv and log path stay off the page."""
    return {name: value for name, value in server.items() if name not in ("argv", "log", "api_key_file")}


def _fallbacks(metrics: bytes) -> dict[str, float]:
    """``tierlocal_gateway_fallbacks_total`` from the gateway's /metrics text, by route and reason."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.decode("utf-8", "replace")):
        for sample in family.samples:
            if sample.name == "tierlocal_gateway_fallbacks_total":
                label = f"{sample.labels.get('model', '')} · {sample.labels.get('reason', '')}"
                counts[label] = counts.get(label, 0.0) + sample.value
    return counts


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={**_HEADERS, "Location": location})


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def dashboard_app(config: GatewayConfig, store: Store) -> web.Application:
    """``tierlocal dashboard``: the pages alone, keys checked against the gateway's store."""
    from concurrent.futures import ThreadPoolExecutor

    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-store")

    async def store_call(function: Callable[..., Any], *args: object) -> Any:
        return await asyncio.get_running_loop().run_in_executor(thread, function, *args)

    async def authenticate(key: str) -> str | None:
        result: str | None = await store_call(store.authenticate, key)
        return result

    async def close(_app: web.Application) -> None:
        thread.shutdown(wait=True)

    app = web.Application(client_max_size=MAX_FORM_BYTES)
    Dashboard(config, store, authenticate=authenticate, store_call=store_call).add_routes(app)
    app.on_cleanup.append(close)
    return app

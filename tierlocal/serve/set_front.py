"""One OpenAI-compatible endpoint for a served model set, as llama-server's router mode gives:
the request's ``model`` chooses the member, ``/v1/models`` lists them all, ``/set`` says what each
is doing. A request for a member that is not loaded loads it (:class:`~.set_pool.SetPool`, in a
worker thread) and waits up to the set's bound; past it the answer is 503 ``model_loading`` with
``Retry-After``, which a gateway route takes as a reason to try its next target. Bytes are passed
through as they come (streams included); nothing is retried or metered here — that is the
gateway's job.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from ..errors import MemberLoadFailed
from .set_pool import LoadWaitExceeded, SetPool

__all__ = ["set_app"]

#: Longest request body read (bytes): a long prompt with images fits.
MAX_BODY_BYTES = 64 << 20
#: Headers not passed on either way (hop by hop, or recomputed).
_DROPPED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "authorization", "x-api-key"}


def set_app(pool: SetPool, *, load_wait_s: float, api_keys: frozenset[str] = frozenset()) -> web.Application:
    """The endpoint's application; ``api_keys``: the keys a client must send (bearer or
    ``x-api-key``; none: loopback only, as serve refuses otherwise)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    front = _Front(pool, load_wait_s, api_keys)
    app.router.add_get("/health", front.health)
    app.router.add_get("/v1/models", front.models)
    app.router.add_get("/set", front.status)
    app.router.add_post("/{path:.*}", front.forward)
    app.on_startup.append(front.open)
    app.on_cleanup.append(front.close)
    return app


class _Front:
    def __init__(self, pool: SetPool, load_wait_s: float, api_keys: frozenset[str]) -> None:
        self.pool = pool
        self.load_wait_s = load_wait_s
        self.api_keys = api_keys
        self.session: aiohttp.ClientSession | None = None

    async def open(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False, trust_env=False)

    async def close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        members = self.pool.snapshot()["members"]
        data = [
            {"id": m["name"], "object": "model", "owned_by": "tierlocal", "created": int(self.pool.started), "status": {"value": m["state"]}}
            for m in members
        ]
        return web.json_response({"object": "list", "data": data})

    async def status(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        return refused if refused is not None else web.json_response(self.pool.snapshot())

    async def forward(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return _error(400, "the request body is not JSON", "invalid_request_error")
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or name not in self.pool.members:
            known = ", ".join(sorted(self.pool.members))
            return _error(404, f"no model {name!r} in this set (it has {known})", "model_not_found")
        started = time.monotonic()
        try:
            member = await asyncio.to_thread(self.pool.acquire, name, self.load_wait_s)
        except LoadWaitExceeded as exc:
            return _error(503, str(exc), "model_loading", headers={"Retry-After": str(max(int(self.load_wait_s), 1))})
        except MemberLoadFailed as exc:
            return _error(503, str(exc), "model_unavailable")
        try:
            return await self._relay(request, raw, member.port, time.monotonic() - started)
        finally:
            self.pool.release(member)

    async def _relay(self, request: web.Request, raw: bytes, port: int | None, waited_s: float) -> web.StreamResponse:
        """The member's answer, passed through as it comes."""
        assert self.session is not None and port is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        url = f"http://127.0.0.1:{port}{request.rel_url}"
        try:
            async with self.session.post(url, data=raw, headers=headers) as upstream:
                answer = web.StreamResponse(status=upstream.status)
                for key, value in upstream.headers.items():
                    if key.lower() not in _DROPPED:
                        answer.headers[key] = value
                answer.headers["X-Tierlocal-Load-Wait"] = f"{waited_s:.3f}"
                await answer.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
        except aiohttp.ClientError as exc:
            return _error(502, f"the member did not answer: {type(exc).__name__}", "upstream_error")

    def _refused(self, request: web.Request) -> web.Response | None:
        if not self.api_keys:
            return None
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return None if given in self.api_keys else _error(401, "a key is needed (Authorization: Bearer KEY)", "authentication_error")


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    payload: dict[str, Any] = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(payload, status=status, headers=headers)

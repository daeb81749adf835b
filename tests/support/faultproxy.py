"""A fault-injecting HTTP proxy for gateway tests: it forwards to a real upstream (a real
llama-server) and, when told, answers instead with an error status and a hosted API's real
error body, resets the connection, waits, echoes what it was sent, or cuts a stream after N
bytes. It runs its own event loop in a thread; tests queue faults and read what it saw."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.support.engines import free_port

# Moonshot's error bodies (shared/notes/gateway-anchors.md), account ids included.
MOONSHOT_OVERLOADED = {"error": {"type": "engine_overloaded_error", "message": "The engine is currently overloaded, please try again later"}}
MOONSHOT_RATE_LIMIT = {
    "error": {
        "type": "rate_limit_reached_error",
        "message": "Your account org-9f8e7d6c5b4a<ak-a1b2c3d4e5f6> request reached organization max RPM: 3, please try again after 2 seconds",
    }
}
MOONSHOT_QUOTA = {
    "error": {
        "type": "exceeded_current_quota_error",
        "message": "Your account org-9f8e7d6c5b4a<ak-a1b2c3d4e5f6> is suspended due to insufficient balance, please recharge your account or "
        "check your plan and billing details",
    }
}
MOONSHOT_SERVER_ERROR = {"error": {"type": "server_error", "message": "Internal server error"}}
MOONSHOT_INVALID = {"error": {"type": "invalid_request_error", "message": "Invalid request: temperature must be in [0, 1]"}}
MOONSHOT_CONTENT_FILTER = {"error": {"type": "content_filter", "message": "The request was rejected because it was considered high risk"}}
LLAMA_LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
LLAMA_CONTEXT = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 1024,
    }
}


@dataclass(frozen=True)
class Fault:
    """What to do with one request: ``status`` (answer with it and ``body``), ``reset`` (close
    the connection without answering), ``delay_s`` (then forward), ``cut_after`` (forward, and
    abort the connection after that many response bytes), ``bill_all_choices``, ``echo_key`` (answer ``status`` with
    the Authorization header it received in the message — a leaky upstream)."""

    status: int | None = None
    body: dict | None = None  # type: ignore[type-arg]
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False
    delay_s: float = 0.0
    cut_after: int | None = None
    echo_key: bool = False
    #: Bill every choice, as hosted APIs do (llama-server's usage counts one choice's tokens):
    #: a non-streaming answer's completion_tokens multiplied by its number of choices.
    bill_all_choices: bool = False
    trickle: bool = False  # forward the response in 64-byte pieces, 10 ms apart
    #: Answer with a call of this tool (name, arguments) as a hosted model that calls tools does
    #: (the test model does not): the real engine's answer with its message (or its stream's
    #: deltas) replaced by OpenAI's tool-call shape, its id and usage kept.
    tool_call: tuple[str, dict] | None = None  # type: ignore[type-arg]


@dataclass
class Seen:
    path: str
    authorization: str | None
    body: dict  # type: ignore[type-arg]


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.faults: deque[Fault] = deque()
        self.always: Fault | None = None
        self.seen: list[Seen] = []  # POSTs: what the gateway sent on behalf of clients
        self.polls = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        assert self._ready.wait(10), "fault proxy did not start"
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the port (connections are refused from here on), once."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def queue(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def reset(self) -> None:
        self.faults.clear()
        self.always = None
        self.seen.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._ready.set()
        await self._stop.wait()
        await self._session.close()
        await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        fault: Fault | None = None
        if request.method == "GET":  # health and props polls: always forwarded, counted apart
            self.polls += 1
        else:
            self.seen.append(Seen(request.path, request.headers.get("Authorization"), body))
            fault = self.faults.popleft() if self.faults else self.always
        if fault is not None and fault.reset:
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError
        if fault is not None and fault.echo_key:
            message = f"bad request from {request.headers.get('Authorization')}"
            return web.json_response({"error": {"type": "server_error", "message": message}}, status=fault.status or 500)
        if fault is not None and fault.status is not None:
            return web.json_response(fault.body or {}, status=fault.status, headers=fault.headers)
        if fault is not None and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        headers = {name: value for name, value in request.headers.items() if name.lower() in ("authorization", "content-type", "accept")}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=raw, headers=headers) as upstream:
            if fault is not None and fault.tool_call is not None:
                return await _tool_call_answer(request, upstream, bool(body.get("stream")), *fault.tool_call)
            if fault is not None and fault.bill_all_choices and not body.get("stream"):
                answer = await upstream.json()
                if isinstance(answer.get("usage"), dict):
                    answer["usage"]["completion_tokens"] *= max(1, len(answer.get("choices") or ()))
                    answer["usage"]["total_tokens"] = answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
                return web.json_response(answer, status=upstream.status)
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")})
            await response.prepare(request)
            sent = 0
            async for chunk in upstream.content.iter_any():
                if fault is not None and fault.cut_after is not None and sent + len(chunk) >= fault.cut_after:
                    await response.write(chunk[: fault.cut_after - sent])
                    await asyncio.sleep(0.05)
                    assert request.transport is not None
                    request.transport.abort()
                    raise asyncio.CancelledError
                if fault is not None and fault.trickle:
                    for start in range(0, len(chunk), 64):
                        await response.write(chunk[start : start + 64])
                        await asyncio.sleep(0.01)
                else:
                    await response.write(chunk)
                sent += len(chunk)
            await response.write_eof()
            return response


async def _tool_call_answer(request: web.Request, upstream: aiohttp.ClientResponse, stream: bool, name: str, arguments: dict) -> web.StreamResponse:  # type: ignore[type-arg]
    """The real answer, its content replaced by one call of ``name`` (see Fault.tool_call)."""
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    if not stream:
        answer = await upstream.json()
        answer["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
        answer["choices"][0]["finish_reason"] = "tool_calls"
        return web.json_response(answer)
    chunks = [json.loads(line[5:]) for line in (await upstream.text()).splitlines() if line.startswith("data: {")]
    first, usage = chunks[0], next(chunk for chunk in chunks if chunk.get("usage"))
    text = call["function"]["arguments"]  # type: ignore[index]
    deltas = [{"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call, "function": {"name": name, "arguments": ""}}]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": text[start : start + 8]}}]} for start in range(0, len(text), 8)]
    out = [{**first, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    out.append({**first, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    out.append({**usage, "choices": []})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in out:
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response

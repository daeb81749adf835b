"""The gateway in process, with aiohttp's test client: the app from ``create_app`` over a real
SQLite store, in front of upstreams that are aiohttp servers on loopback in the same loop,
standing in for what cannot run here — a hosted API on the internet, and a rented cluster —
and speaking their protocol (OpenAI's chat completions with ``usage``; a vLLM that answers 503
while it loads). No engine, no child process: the fast path. The end-to-end tests with real
llama-servers and the gateway as a child process are in test_gateway.py."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tierlocal.gateway.app import create_app
from tierlocal.gateway.config import parse_config
from tierlocal.gateway.store import SqliteStore

HOSTED_KEY = "sk-inproc-" + secrets.token_hex(12)
#: USD per million tokens, as the test's config gives them (worked by hand below).
PRICES = {"input_cache_hit": 0.30, "input_cache_miss": 3.00, "output": 15.00}
#: What the hosted API reports for every answer (OpenAI's shape, Moonshot's cached-token field).
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100, "prompt_tokens_details": {"cached_tokens": 400}}


class Upstream:
    """An OpenAI-compatible server on loopback: records what it was sent, answers ``status``
    (a vLLM still loading answers /health and requests with 503)."""

    def __init__(self, name: str, status: int = 200) -> None:
        self.name = name
        self.status = status
        self.seen: list[tuple[str | None, dict]] = []  # type: ignore[type-arg]
        self.server: TestServer | None = None

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.headers.get("Authorization"), body))
        if self.status == 401:  # as some APIs do: the refused key, quoted back
            return web.json_response(
                {"error": {"message": f"Incorrect API key provided: {request.headers.get('Authorization')}", "type": "invalid_request_error"}},
                status=401,
            )
        if self.status != 200:
            return web.json_response({"error": {"message": "loading", "type": "service_unavailable", "code": 503}}, status=self.status)
        return web.json_response(
            {
                "id": f"chatcmpl-{self.name}",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"hello from {self.name}"}, "finish_reason": "stop"}],
                "usage": USAGE,
            }
        )

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=self.status)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return f"http://127.0.0.1:{self.server.port}/v1"


def _config(state: Path, routes: str, users: str = '[[users]]\nname = "alice"\n') -> dict:  # type: ignore[type-arg]
    import tomllib

    text = f'[server]\nstate_dir = "{state}"\n\n{routes}\n[prices."kimi-k3"]\n' + "".join(f"{k} = {v}\n" for k, v in PRICES.items()) + users
    return tomllib.loads(text)


def _run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    routes: Callable[[dict[str, str]], str],
    body: Callable[..., Awaitable[None]],
    *upstreams: Upstream,
    users: str = '[[users]]\nname = "alice"\n',
) -> None:
    """Start the upstreams, then the gateway app on them, and run ``body(client, key)``."""
    monkeypatch.setenv("INPROC_HOSTED_KEY", HOSTED_KEY)

    async def main() -> None:
        urls = {upstream.name: await upstream.start() for upstream in upstreams}
        config = parse_config(_config(tmp_path / "state", routes(urls), users), "inprocess.toml")
        (tmp_path / "state").mkdir(exist_ok=True)
        store = SqliteStore(tmp_path / "state")
        key = store.add_key("alice")
        client = TestClient(TestServer(create_app(config, store), host="127.0.0.1"))
        await client.start_server()
        try:
            await body(client, key)
        finally:
            await client.close()
            for upstream in upstreams:
                assert upstream.server is not None
                await upstream.server.close()

    asyncio.run(main())


def _rows(tmp_path: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(tmp_path / "state" / "gateway.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return db.execute("SELECT * FROM usage ORDER BY id").fetchall()


def _cost(usage: dict) -> float:  # type: ignore[type-arg]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return (
        cached * PRICES["input_cache_hit"]
        + (usage["prompt_tokens"] - cached) * PRICES["input_cache_miss"]
        + usage["completion_tokens"] * PRICES["output"]
    ) / 1e6


CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}


def test_a_request_is_authenticated_relayed_with_the_upstream_key_and_priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosted = Upstream("hosted")

    def routes(urls: dict[str, str]) -> str:
        return f'[[routes]]\nmodel = "kimi-k3"\ntargets = [ {{ url = "{urls["hosted"]}", model = "kimi-k3", api_key_env = "INPROC_HOSTED_KEY" }} ]\n'

    async def body(client: TestClient, key: str) -> None:
        assert (await client.get("/health")).status == 200  # no key needed
        refused = await client.post("/v1/chat/completions", json=CHAT)
        assert refused.status == 401 and (await refused.json())["error"]["type"]
        answer = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert answer.status == 200, await answer.text()
        document = await answer.json()
        assert document["choices"][0]["message"]["content"] == "hello from hosted" and document["usage"]["prompt_tokens"] == 1000
        models = await (await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).json()
        assert [model["id"] for model in models["data"]] == ["kimi-k3"]

    _run(tmp_path, monkeypatch, routes, body, hosted)
    # The client's key never reaches the upstream; the gateway's key for it does.
    ((authorization, sent),) = hosted.seen
    assert authorization == f"Bearer {HOSTED_KEY}" and sent["model"] == "kimi-k3"
    (row,) = _rows(tmp_path)
    assert (row["user"], row["status"], row["tier"], row["prompt_tokens"], row["cached_tokens"]) == ("alice", 200, 3, 1000, 400)
    assert row["cost_usd"] == pytest.approx(_cost(USAGE))


def test_a_loading_cluster_hands_over_to_the_hosted_api_and_usage_says_which_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, hosted = Upstream("cluster", status=503), Upstream("hosted")

    def routes(urls: dict[str, str]) -> str:
        return (
            '[[routes]]\nmodel = "kimi-k3"\ntargets = [\n  '
            f'{{ url = "{urls["cluster"]}", model = "moonshotai/Kimi-K3", tier = 1, usd_per_hour = 40.0 }},\n'
            f'  {{ url = "{urls["hosted"]}", model = "kimi-k3", api_key_env = "INPROC_HOSTED_KEY" }},\n]\n'
        )

    async def body(client: TestClient, key: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        loading = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert loading.status == 200 and (await loading.json())["choices"][0]["message"]["content"] == "hello from hosted"
        cluster.status = 200  # loaded: it answers /health, and the poller puts it back in front
        for _ in range(50):
            routes_health = (await (await client.get("/health")).json())["routes"]["kimi-k3"]
            if routes_health[0]["state"] == "up" and not routes_health[0].get("cooldown_s"):
                break
            await asyncio.sleep(0.2)
        served = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert served.status == 200 and (await served.json())["choices"][0]["message"]["content"] == "hello from cluster"

    _run(tmp_path, monkeypatch, routes, body, cluster, hosted)
    rows = _rows(tmp_path)
    assert [(row["tier"], row["cost_usd"] > 0) for row in rows] == [(3, True), (1, False)]  # the cluster is paid by the hour
    assert cluster.seen[-1][0] is None and cluster.seen[-1][1]["model"] == "moonshotai/Kimi-K3"  # no key sent where none is configured


def test_a_budget_refuses_before_any_upstream_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosted = Upstream("hosted")

    def routes(urls: dict[str, str]) -> str:
        return f'[[routes]]\nmodel = "kimi-k3"\ntargets = [ {{ url = "{urls["hosted"]}", model = "kimi-k3", api_key_env = "INPROC_HOSTED_KEY" }} ]\n'

    async def body(client: TestClient, key: str) -> None:
        # A tenth of a cent cannot hold 8 output tokens at $15/M plus the body's worst-case input at $3/M.
        refused = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert refused.status == 429 and (await refused.json())["error"]["code"] == "budget_exceeded"

    _run(tmp_path, monkeypatch, routes, body, hosted, users='[[users]]\nname = "alice"\nbudget_usd = 0.00001\nbudget_period = "day"\n')
    assert hosted.seen == [] and _rows(tmp_path) == []


def test_an_upstream_error_that_quotes_the_key_reaches_the_client_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosted = Upstream("hosted", status=401)

    def routes(urls: dict[str, str]) -> str:
        return f'[[routes]]\nmodel = "kimi-k3"\ntargets = [ {{ url = "{urls["hosted"]}", model = "kimi-k3", api_key_env = "INPROC_HOSTED_KEY" }} ]\n'

    async def body(client: TestClient, key: str) -> None:
        refused = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        text = await refused.text()
        assert refused.status == 401 and refused.headers["x-should-retry"] == "false"
        assert HOSTED_KEY not in text and key not in text and "Incorrect API key provided" in text

    _run(tmp_path, monkeypatch, routes, body, hosted)
    assert len(hosted.seen) == 1  # a refused key is not retried


def test_the_ledger_lets_exactly_the_reservations_the_budget_holds(tmp_path: Path) -> None:
    """Twenty requests reserve at once; the books group-commit them on the store's thread and
    hold exactly as many as the budget covers: 0.024 USD at 1,000 input tokens (3 USD/M) and 100
    output tokens (15 USD/M) = 0.0045 each → 5."""
    from tierlocal.gateway.ledger import Ledger
    from tierlocal.gateway.metrics import Metrics
    from tierlocal.gateway.store_worker import StoreWorker
    from tierlocal.gateway.wire import Reject

    routes = '[[routes]]\nmodel = "kimi-k3"\ntargets = [ { url = "https://api.example/v1", model = "kimi-k3", api_key_env = "K" } ]\n'
    config = parse_config(
        _config(tmp_path / "state", routes, '[[users]]\nname = "alice"\nbudget_usd = 0.024\nbudget_period = "day"\n'), "ledger.toml"
    )
    (tmp_path / "state").mkdir()
    store, worker = SqliteStore(tmp_path / "state"), StoreWorker()
    ledger = Ledger(config, store, Metrics(), (), worker)
    user, route = config.users[0], config.routes[0]

    async def reserve() -> int | None:
        try:
            return await ledger.reserve(user, route, 1000, 100)
        except Reject as refused:
            assert refused.status == 429
            return None

    async def main() -> list[int | None]:
        return await asyncio.gather(*(reserve() for _ in range(20)))

    try:
        held = asyncio.run(main())
        assert sum(result is not None for result in held) == 5
        assert store.spent("alice", "day") == pytest.approx(5 * (1000 * 3.0 + 100 * 15.0) / 1e6)
    finally:
        worker.close()
        store.close()

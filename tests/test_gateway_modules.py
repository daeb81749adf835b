"""The gateway modules that no request through the in-process app reaches, tested in this
process: the order a request tries targets in and what it is told when none answered
(targets.py), the usage report (usage_report.py), the log filter (logs.py), the checks before the
server starts (runner.py) and the dashboard's sign-in (ui.py). Real SQLite stores, aiohttp's
test client; no engine."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import stat
import time
from pathlib import Path

import pytest
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.test_utils import TestClient, TestServer

from tierlocal.errors import UsageError
from tierlocal.gateway.backends import DOWN, UP, TargetState, now
from tierlocal.gateway.config import GatewayConfig, Route, ServerConfig, Target, User, default_config
from tierlocal.gateway.logs import ClientErrorFilter
from tierlocal.gateway.protocol import Verdict
from tierlocal.gateway.runner import ensure_key, without_unfittable_local_targets
from tierlocal.gateway.speed_floor import LoadSpeed, speed_at
from tierlocal.gateway.store import SqliteStore, UsageRecord
from tierlocal.gateway.targets import candidates, next_target, no_answer, passed_over_reasons
from tierlocal.gateway.ui import dashboard_app
from tierlocal.gateway.usage_report import usage_report
from tierlocal.gateway.wire import AttemptFailed, Exchange
from tierlocal.serve.state import UsersPoint
from tierlocal.tiers.arithmetic import ApiPrices

LOCAL = Target("http://127.0.0.1:8080/v1", "local-model")
BUSY = Target("http://127.0.0.1:8081/v1", "busy-model")
GONE = Target("http://127.0.0.1:8082/v1", "gone-model")
HOSTED = Target("https://api.example/v1", "kimi-k3", api_key_env="EXAMPLE_KEY")


def _states(**health: str) -> dict[Target, TargetState]:
    states = {target: TargetState(target, key="k" if target.hosted else None) for target in (LOCAL, BUSY, GONE, HOSTED)}
    states[BUSY].slots, states[BUSY].in_flight = 1, 1
    states[GONE].health = DOWN
    states[LOCAL].health = health.get("local", UP)
    return states


def _config(server: ServerConfig, routes: tuple[Route, ...], *users: User) -> GatewayConfig:
    return GatewayConfig(server, routes, {}, users, "test")


def _exchange(route: Route) -> Exchange:
    return Exchange(User("alice"), route, stream=False, include_usage=False, input_bound=10)


def test_targets_are_tried_free_then_full_then_down_and_cooling_or_keyless_ones_not_at_all() -> None:
    route = Route("m", (GONE, BUSY, LOCAL, HOSTED))
    states = _states()
    assert [state.target for state in candidates(route, states, set())] == [LOCAL, HOSTED, BUSY, GONE]
    states[LOCAL].cool_down(30, "server_error", now())
    states[HOSTED].key = None  # its key is not set
    assert [state.target for state in candidates(route, states, set())] == [BUSY, GONE]
    assert [state.target for state in candidates(route, states, {BUSY})] == [GONE]


def test_each_target_skipped_on_the_way_is_a_fallback_counted_once_with_why() -> None:
    route = Route("m", (GONE, BUSY, LOCAL, HOSTED))
    states = _states()
    passed: set[Target] = set()
    assert list(passed_over_reasons(route, states, states[LOCAL], set(), set(), passed)) == [("engine_down", None), ("slots_full", None)]
    assert list(passed_over_reasons(route, states, states[HOSTED], set(), {LOCAL}, passed)) == []  # counted already; LOCAL failed with its own reason


#: A serve's users table: 40 tok/s alone, 30 each for 2, 18 each for 4 (first tokens 0.5, 1.0, 2.0 s).
CURVE = (UsersPoint(1, 40.0, 0.5, "measured"), UsersPoint(2, 30.0, 1.0, "derived"), UsersPoint(4, 18.0, 2.0, "derived"))


def test_the_speed_at_a_load_is_the_row_between_rows_and_the_same_aggregate_past_them() -> None:
    assert speed_at(CURVE, 2) == LoadSpeed(2, 30.0, 1.0, "derived")
    assert speed_at(CURVE, 3) == LoadSpeed(3, 24.0, 1.5, "derived")  # halfway between 2 and 4 users
    assert speed_at(CURVE, 8) == LoadSpeed(8, 9.0, 4.0, "derived")  # 4 × 18 = 72 tok/s shared by 8; the wait doubles
    assert speed_at((), 1) is None


def test_a_local_target_too_slow_at_its_load_is_passed_over_for_speed_and_counted_with_the_figures() -> None:
    route = Route("m", (LOCAL, HOSTED), min_user_tokens_per_s=25.0)
    states = _states()
    states[LOCAL].curve = CURVE
    states[LOCAL].in_flight = 1  # this request would be the second user: 30 tok/s each, above 25
    assert [state.target for state in candidates(route, states, set())] == [LOCAL, HOSTED]
    states[LOCAL].in_flight = 2  # the third: 24 tok/s, below 25
    assert [state.target for state in candidates(route, states, set())] == [HOSTED, LOCAL]  # still tried when the API fails
    ((reason, detail),) = passed_over_reasons(route, states, states[HOSTED], set(), set(), set())
    assert reason == "below_speed_floor" and detail == f"{LOCAL.label}: 24.0 tok/s per user at 3 user(s) (derived), below the route's 25"
    waiting = Route("m", (LOCAL, HOSTED), max_first_token_s=1.2)  # the first token after 1.5 s at 3 users
    assert [reason for reason, _ in passed_over_reasons(waiting, states, states[HOSTED], set(), set(), set())] == ["first_token_over_limit"]
    states[LOCAL].curve = ()  # no table known: never passed over blind
    assert [state.target for state in candidates(route, states, set())] == [LOCAL, HOSTED]


def test_when_nothing_answers_the_client_is_told_why_and_whether_to_retry() -> None:
    route = Route("m", (LOCAL, HOSTED))
    states = _states()
    context = AttemptFailed(Verdict(True, 0.0, "context_exceeded"), "prompt of 9000 tokens, context 8192")
    reject = no_answer(_exchange(route), states, {LOCAL, HOSTED}, context)
    assert (reject.status, reject.should_retry) == (400, False) and "does not fit the context" in str(reject)
    states[LOCAL].cool_down(12.0, "rate_limited", now())
    states[HOSTED].cool_down(40.0, "server_error", now())
    busy = no_answer(_exchange(route), states, set(), AttemptFailed(Verdict(True, 40.0, "server_error"), "503"))
    assert busy.status == 503 and busy.should_retry and 11.0 < busy.retry_after_s <= 12.0  # the shortest cooldown
    keyless = {target: TargetState(target) for target in (HOSTED,)}  # hosted, and its key is not set
    exchange = _exchange(Route("kimi-k3", (HOSTED,)))
    unset = no_answer(exchange, keyless, set(), None)
    assert (unset.status, unset.should_retry, unset.retry_after_s) == (503, False, None) and "set EXAMPLE_KEY" in str(unset)


def test_a_failed_target_is_tried_again_after_a_backoff_that_fits_the_deadline() -> None:
    route = Route("m", (LOCAL,))
    states = _states()

    async def attempt(deadline_s: float) -> tuple[TargetState | None, float]:
        started = time.monotonic()
        chosen = await next_target(route, states, set(), {LOCAL}, attempts=1, deadline=time.monotonic() + deadline_s)
        return chosen, time.monotonic() - started

    again, waited = asyncio.run(attempt(5.0))
    assert again is states[LOCAL] and 0.12 <= waited < 1.0  # 0.25 s × 2^0, jittered to 0.125–0.25 s
    assert asyncio.run(attempt(0.05))[0] is None  # no wait fits before the deadline


def test_the_usage_report_sums_each_user_and_tier_and_sets_spend_against_budget(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    cluster = Target("http://10.0.0.5:8000/v1", "moonshotai/Kimi-K3", declared_tier=1, usd_per_hour=40.0)
    route = Route("kimi-k3", (cluster, HOSTED))
    config = _config(ServerConfig(state_dir=tmp_path), (route,), User("alice", budget_usd=1.0, budget_period="day"))
    store.settle(None, UsageRecord("alice", "kimi-k3", "kimi-k3", HOSTED.label, 200, 1000, 200, 100, 0.25, tier=3))
    store.settle(None, UsageRecord("alice", "kimi-k3", "kimi-k3", cluster.label, 200, 4000, 0, 1000, 0.0, tier=1))
    store.settle(None, UsageRecord("bob", "kimi-k3", "kimi-k3", HOSTED.label, 200, 500, 0, 50, 0.125, tier=3))
    report = usage_report(config, store, "day")
    users = report["users"]
    assert isinstance(users, dict)
    assert (users["alice"]["requests"], users["alice"]["prompt_tokens"], users["alice"]["cost_usd"]) == (2, 5000, 0.25)
    assert users["bob"]["cost_usd"] == 0.125
    by_tier = report["by_tier"]
    assert isinstance(by_tier, dict) and (by_tier["1"]["requests"], by_tier["3"]["requests"]) == (1, 2)
    assert report["budgets"] == {"alice": {"budget_usd": 1.0, "budget_period": "day", "spent_usd": 0.25, "left_usd": 0.75}}
    clusters = report["clusters"]
    assert isinstance(clusters, dict) and (clusters[cluster.label]["tokens"], clusters[cluster.label]["requests"]) == (5000, 1)
    store.close()


def test_a_local_engines_tokens_are_priced_at_its_routes_hosted_api(tmp_path: Path) -> None:
    """Issue 48 item 5: what the local tokens would have cost on the API the route falls back to."""
    store = SqliteStore(tmp_path)
    routes = (Route("qwen3-14b", (LOCAL, HOSTED)), Route("unpriced", (BUSY,)))
    prices = {"kimi-k3": ApiPrices(input_cache_hit=0.30, input_cache_miss=3.00, output=15.00)}
    config = GatewayConfig(ServerConfig(state_dir=tmp_path), routes, prices, (User("alice"),), "test")
    store.settle(None, UsageRecord("alice", "qwen3-14b", "local-model", LOCAL.label, 200, 4000, 1000, 1000, 0.0, tier=2))
    store.settle(None, UsageRecord("alice", "unpriced", "busy-model", BUSY.label, 200, 10, 0, 5, 0.0, tier=2))
    local = usage_report(config, store, "day")["local"]
    assert isinstance(local, dict)
    # 1,000 cached at $0.30, 3,000 uncached at $3.00 and 1,000 out at $15.00 per million tokens
    assert local[LOCAL.label] == {
        "routes": ["qwen3-14b"],
        "requests": 1,
        "prompt_tokens": 4000,
        "cached_tokens": 1000,
        "completion_tokens": 1000,
        "api_model": "kimi-k3",
        "api_usd": 0.0243,
    }
    assert (local[BUSY.label]["api_model"], local[BUSY.label]["api_usd"]) == ("unpriced", None)
    store.close()


def test_a_malformed_request_is_logged_in_one_line_without_what_the_client_sent() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("tierlocal.test.aiohttp.server")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.addFilter(ClientErrorFilter())
    try:
        error = BadHttpMessage("Invalid header value char:\n  Authorization: Bearer tl-secret\x00")
        try:
            raise error
        except BadHttpMessage:
            logger.error("Error handling request from %s", "192.0.2.7", exc_info=True)
    finally:
        logger.removeHandler(handler)
    logged = stream.getvalue()
    assert logged.splitlines() == ["refused a malformed HTTP request from 192.0.2.7 (400): Invalid header value char"]
    assert "tl-secret" not in logged and "Traceback" not in logged


def test_the_server_refuses_a_public_address_without_a_key_and_makes_one_on_loopback(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    public = _config(ServerConfig(host="0.0.0.0", state_dir=tmp_path), ())
    with pytest.raises(UsageError, match=r"refusing to listen on 0\.0\.0\.0"):
        ensure_key(public, store)
    assert store.list_keys() == []
    ensure_key(_config(ServerConfig(host="127.0.0.1", state_dir=tmp_path), ()), store)
    key_file = tmp_path / "local.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert store.authenticate(key_file.read_text().strip()) == "local"
    ensure_key(public, store)  # a key exists now: a public address is allowed
    store.close()


def test_a_frontier_model_keeps_only_its_cluster_and_hosted_targets_on_a_machine_it_cannot_fit() -> None:
    local_k3 = Target("http://127.0.0.1:8080/v1", "kimi-k3")
    routes = (Route("kimi-k3", (local_k3, HOSTED)), Route("only-local", (LOCAL,)))
    config = _config(ServerConfig(), routes)
    small = without_unfittable_local_targets(config, 256 * 2**30)
    assert [(route.model, route.targets) for route in small.routes] == [("kimi-k3", (HOSTED,)), ("only-local", (LOCAL,))]
    assert without_unfittable_local_targets(config, 4 * 2**40).routes == routes  # 4 TiB of memory: every target stays
    alone = without_unfittable_local_targets(_config(ServerConfig(), (Route("kimi-k3", (local_k3,)),)), 256 * 2**30)
    assert alone.routes == ()  # no cluster or hosted target left: the route goes


def test_the_dashboard_signs_in_only_with_its_form_token_and_keeps_the_key_out_of_pages(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    key = store.add_key("alice")

    async def main() -> None:
        client = TestClient(TestServer(dashboard_app(default_config(), store), host="127.0.0.1"))
        await client.start_server()
        try:
            refused = await client.get("/ui/spend", allow_redirects=False)
            assert refused.status != 200 and key not in await refused.text()
            forged = await client.post("/ui/login", data={"key": key}, allow_redirects=False)  # no CSRF token
            assert forged.status == 403 and "tierlocal_key" not in "".join(forged.headers.getall("Set-Cookie", []))
            form = await client.get("/ui/login")
            assert "default-src 'none'" in form.headers["Content-Security-Policy"]
            token = re.search(r'name="csrf" value="([^"]+)"', await form.text())
            assert token is not None
            signed_in = await client.post("/ui/login", data={"key": key, "csrf": token.group(1)}, allow_redirects=False)
            assert signed_in.status == 303 and signed_in.headers["Location"] == "/ui/machine"
            spend = await client.get("/ui/spend")
            assert spend.status == 200 and "alice" in await spend.text() and key not in await spend.text()
        finally:
            await client.close()

    asyncio.run(main())
    store.close()

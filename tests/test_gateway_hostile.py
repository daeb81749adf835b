"""The gateway against a hostile client, in front of a real llama-server (behind the fault proxy,
which bills every choice as hosted APIs do) with a budgeted user: every request shape stays
inside the budget and gets a 4xx, never a 500 or a traceback; after each, the gateway still
answers a valid request, the ledger holds nothing it should not, and no secret shows anywhere."""

from __future__ import annotations

import json
import math
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

import httpx2
import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.engines import free_port, llama_server_argv, running
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.gatewayrun import RunningGateway, add_key, gateway
from tests.test_gateway import CHAT, ENV, HOSTED_KEY, PRICES, PRICES_TOML, cost, hosted, route, usage_rows

DEFAULT_MAX_TOKENS = 6
# A request's worst case: its body's bytes + 64 template tokens of input at the miss price, and
# its output at the output price (the gateway's reservation rule, restated here).
TEMPLATE_TOKENS = 64


def worst_case(request: dict, output_tokens: int) -> float:  # type: ignore[type-arg]
    return ((len(json.dumps(request).encode()) + TEMPLATE_TOKENS) * PRICES["input_cache_miss"] + output_tokens * PRICES["output"]) / 1e6


@pytest.fixture(scope="module")
def upstream(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultProxy]:
    """llama-server with 4 slots (it honours ``n`` up to them) behind a proxy billing every choice."""
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, "--api-key", HOSTED_KEY, ctx=4096, parallel=4)
    with (
        running(argv, tmp_path_factory.mktemp("hosted") / "llama.log", f"http://127.0.0.1:{port}/health"),
        FaultProxy(f"http://127.0.0.1:{port}") as proxy,
    ):
        yield proxy


def _gateway(directory: Path, upstream: FaultProxy, budget: float, server: str = "") -> AbstractContextManager[RunningGateway]:
    directory.mkdir(parents=True, exist_ok=True)
    upstream.reset()
    upstream.always = Fault(bill_all_choices=True)
    body = route("kimi-k3", hosted(upstream.url + "/v1")) + PRICES_TOML + f'[[users]]\nname = "bob"\nbudget_usd = {budget}\nbudget_period = "day"\n'
    return gateway(directory, body, user="bob", env=ENV, server=f"default_max_tokens = {DEFAULT_MAX_TOKENS}\n{server}")


def _post(gw: RunningGateway, request: dict, path: str = "/chat/completions", **kwargs: object) -> httpx2.Response:  # type: ignore[type-arg]
    return httpx2.post(gw.url + path, json=request, headers=gw.headers(), timeout=120, **kwargs)  # type: ignore[arg-type]


def _ledger(gw: RunningGateway) -> tuple[int, float]:
    """(reservations held, USD recorded in usage rows)."""
    with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
        held = db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0]
        spent = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM usage").fetchone()[0]
    return held, spent


def _still_serves(gw: RunningGateway) -> None:
    answer = _post(gw, {**CHAT, "model": "kimi-k3"})
    assert answer.status_code == 200, answer.text
    assert gw.process.poll() is None


def _no_leaks(gw: RunningGateway, *texts: str) -> None:
    haystack = "\n".join((*texts, gw.log_text()))
    assert "Traceback" not in haystack and "Server got itself in trouble" not in haystack
    assert HOSTED_KEY not in haystack and gw.key not in haystack


# --- every field that multiplies or extends the output --------------------------------------------


def test_n_and_best_of_are_reserved_for_every_choice(tmp_path: Path, upstream: FaultProxy) -> None:
    one = {**CHAT, "model": "kimi-k3", "max_tokens": 1000}
    two = {**one, "n": 2}
    budget = (worst_case(one, 1000) + worst_case(two, 2000)) / 2  # one choice fits, two do not
    with _gateway(tmp_path, upstream, budget) as gw:
        refused = _post(gw, two)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded", refused.text
        completions = {"model": "kimi-k3", "prompt": "Say hello", "max_tokens": 1000, "best_of": 2}
        assert _post(gw, completions, "/completions").json()["error"]["code"] == "budget_exceeded"
        assert _ledger(gw) == (0, 0) and not upstream.seen  # nothing held, nothing sent
        for bad in (0, -1, "2", 2.5, 129, True):
            answer = _post(gw, {**one, "n": bad})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "n", (bad, answer.text)
        served = _post(gw, {**one, "max_tokens": 4})
        assert served.status_code == 200
        _still_serves(gw)
        _no_leaks(gw, refused.text)
    with _gateway(tmp_path / "wide", upstream, 1.0) as gw:
        answer = _post(gw, {**CHAT, "model": "kimi-k3", "n": 2, "max_tokens": 4, "temperature": 1.0})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["choices"]) == 2 and body["usage"]["completion_tokens"] == 8  # billed for both
        (row,) = usage_rows(gw)
        assert row["completion_tokens"] == 8
        assert row["cost_usd"] == pytest.approx(cost(body["usage"]), rel=1e-9)
        assert _ledger(gw)[0] == 0


def test_both_caps_are_capped_to_what_was_reserved(tmp_path: Path, upstream: FaultProxy) -> None:
    """llama-server honours max_completion_tokens; a hosted API may honour max_tokens. Both are
    sent as the reserved cap, streamed or not."""
    with _gateway(tmp_path, upstream, 1.0) as gw:
        for stream in (False, True):
            request = {**CHAT, "model": "kimi-k3", "max_tokens": 4, "max_completion_tokens": 9, "stream": stream}
            if stream:
                request["stream_options"] = {"include_usage": True}
            answer = _post(gw, request)
            assert answer.status_code == 200, answer.text
            sent = upstream.seen[-1].body
            assert (sent["max_tokens"], sent["max_completion_tokens"]) == (4, 4)
        rows = usage_rows(gw)
        assert [row["completion_tokens"] for row in rows] == [4, 4]
        assert "caps differ" in gw.log_text()


def test_a_negative_max_tokens_gets_the_default_and_the_log_line_says_so(tmp_path: Path, upstream: FaultProxy) -> None:
    with _gateway(tmp_path, upstream, 1.0) as gw:
        answer = _post(gw, {**CHAT, "model": "kimi-k3", "max_tokens": -5})
        assert answer.status_code == 200, answer.text
        assert upstream.seen[-1].body["max_tokens"] == DEFAULT_MAX_TOKENS
        assert answer.json()["usage"]["completion_tokens"] <= DEFAULT_MAX_TOKENS
        line = next(line for line in gw.log_text().splitlines() if "user=bob" in line and "status=200" in line)
        assert "max_tokens=-5 is not a positive integer" in line and f"the default {DEFAULT_MAX_TOKENS}" in line


# --- bodies, connections and headers ------------------------------------------------------------


def test_bodies_nested_deeper_than_the_bound_are_a_400_not_a_500(tmp_path: Path, upstream: FaultProxy) -> None:
    with _gateway(tmp_path, upstream, 1.0, server="max_body_bytes = 1048576") as gw:
        deep = b"[" * 100_000 + b"]" * 100_000
        nested = json.dumps({**CHAT, "model": "kimi-k3", "metadata": json.loads("[" * 200 + "]" * 200)}).encode()
        texts = []
        for raw in (deep, nested):
            answer = httpx2.post(gw.url + "/chat/completions", content=raw, headers=gw.headers(), timeout=60)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_json" and "nests deeper than 128" in answer.json()["error"]["message"]
            texts.append(answer.text)
        assert _ledger(gw) == (0, 0)
        _still_serves(gw)
        _no_leaks(gw, *texts)


def _raw(port: int, data: bytes, timeout_s: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
            if b"\r\n\r\n" in reply and len(reply) > 200:
                break
        return reply


def _port(gw: RunningGateway) -> int:
    return int(gw.url.rsplit(":", 1)[1].split("/")[0])


def test_a_slow_client_gets_a_408_and_holds_nothing(tmp_path: Path, upstream: FaultProxy) -> None:
    with _gateway(tmp_path, upstream, 1.0, server="body_timeout_s = 2") as gw:
        body = json.dumps({**CHAT, "model": "kimi-k3"}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.key}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", _port(gw)), timeout=10) as conn:
            conn.sendall(head.encode())
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                valid = pool.submit(_post, gw, {**CHAT, "model": "kimi-k3"})
                reply = b""
                answered_at = math.inf
                for byte in body:  # one byte a second until the gateway answers
                    try:
                        conn.sendall(bytes([byte]))
                        conn.settimeout(1.0)
                        reply += conn.recv(65536)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if reply:
                        answered_at = time.monotonic()
                        break
                assert valid.result().status_code == 200  # answered meanwhile
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        # The 408's own time (CI once spent 11 s here waiting for the valid request beside it)
        assert b"request_timeout" in reply and answered_at - started < 10
        held, _ = _ledger(gw)
        assert held == 0 and len(usage_rows(gw)) == 1  # only the valid request
        _still_serves(gw)
        _no_leaks(gw, reply.decode(errors="replace"))


def test_a_thousand_idle_connections_do_not_starve_a_valid_request(tmp_path: Path, upstream: FaultProxy) -> None:
    with _gateway(tmp_path, upstream, 1.0) as gw:
        idle = [socket.create_connection(("127.0.0.1", _port(gw)), timeout=10) for _ in range(1000)]
        try:
            started = time.monotonic()
            _still_serves(gw)
            assert time.monotonic() - started < 30
        finally:
            for conn in idle:
                conn.close()
        _still_serves(gw)


def test_a_client_that_leaves_during_reservation_leaves_the_ledger_correct(tmp_path: Path, upstream: FaultProxy) -> None:
    with _gateway(tmp_path, upstream, 1.0) as gw:
        body = json.dumps({**CHAT, "model": "kimi-k3"}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.key}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", _port(gw)), timeout=10) as conn:
                conn.sendall(head.encode() + body)  # and gone before any answer
        deadline = time.monotonic() + 30
        while _ledger(gw)[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        held, recorded = _ledger(gw)
        rows = usage_rows(gw)
        assert held == 0  # every hold settled or released
        assert recorded == pytest.approx(sum(row["cost_usd"] for row in rows)) and recorded <= 1.0
        _still_serves(gw)
        _no_leaks(gw)


@pytest.mark.parametrize(
    "header",
    [b"Authorization: Bearer KEY\rX-Injected: 1", b"X-Note: first\nInjected: yes", b"X-Note: a\x00b", b"Bad Header Name: x"],
    ids=["bare-CR", "bare-LF", "NUL", "space-in-name"],
)
def test_header_values_with_cr_lf_or_nul_are_refused_with_a_400(tmp_path: Path, upstream: FaultProxy, header: bytes) -> None:
    with _gateway(tmp_path, upstream, 1.0) as gw:
        body = json.dumps({**CHAT, "model": "kimi-k3"}).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            + header.replace(b"KEY", gw.key.encode())
            + b"\r\n"
            + f"Authorization: Bearer {gw.key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        reply = _raw(_port(gw), request)
        assert reply.split(b" ", 2)[1] == b"400", reply[:300]
        assert _ledger(gw) == (0, 0) and not upstream.seen
        _still_serves(gw)
        # aiohttp's 400 quotes the malformed line back to the peer that sent it (its own bytes);
        # the log keeps one line without them, and nothing of the gateway's own reaches either.
        assert HOSTED_KEY.encode() not in reply
        _no_leaks(gw)
        assert "refused a malformed HTTP request from 127.0.0.1 (400)" in gw.log_text()


# --- names in the books, the logs and the terminal ---------------------------------------------------


def test_names_with_markup_print_as_they_are_and_control_characters_never_get_in(tmp_path: Path, upstream: FaultProxy) -> None:
    user, model = "<script>alert('u')</script>", "<b>k3</b> & [bold]x[/bold]"
    upstream.reset()
    upstream.always = Fault(bill_all_choices=True)
    target = f'{{ url = "{upstream.url}/v1", model = {json.dumps(model)}, api_key_env = "HOSTED_KEY" }}'
    body = (
        route(model, target)
        + PRICES_TOML.replace('"kimi-k3"', json.dumps(model))
        + f'[[users]]\nname = "{user}"\nbudget_usd = 1.0\n[[users]]\nname = "eve"\n'
    )

    with gateway(tmp_path, body, user=user, env=ENV) as gw:
        answer = _post(gw, {**CHAT, "model": model})
        assert answer.status_code == 200, answer.text
        control = "x\x1b[2J\u202e\nuser=root"
        missing = _post(gw, {**CHAT, "model": control})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        report = json.loads(run_cli("usage", "--json", "--config", str(gw.config)).stdout)
        assert list(report["users"]) == [user] and model in report["models"]
        table = run_cli("usage", "--config", str(gw.config)).stdout
        assert user in table and model in table
        refused = run_cli("gateway", "keys", "add", "eve\x1b[31m\nuser=root", "--config", str(gw.config))
        assert refused.returncode == 2 and refused.stderr.startswith("error: user name ") and "holds control characters" in refused.stderr
        assert "\x1b" not in refused.stderr
        log = gw.log_text()
        assert f"user={user} model={model}" in log
        assert "\x1b" not in log and "\u202e" not in log and "\nuser=root" not in log
        add_key(gw.config, "eve")  # a plain name still works
    bad = tmp_path / "bad"
    bad.mkdir()
    config = bad / "gateway.toml"
    config.write_text(route("kimi-k3", hosted(upstream.url + "/v1")) + '[[users]]\nname = "eve\\u001b[31m"\n')
    result = run_cli("gateway", "keys", "list", "--config", str(config))
    assert result.returncode == 2 and "holds control characters" in result.stderr and "\x1b" not in result.stderr

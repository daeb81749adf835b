"""The gateway end to end: the official openai client and plain HTTP against `tierlocal gateway`,
in front of a real llama-server (local) and a second real llama-server started with --api-key
(the hosted API's stand-in: real 401s), with faults injected by a proxy between them."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import httpx2
import openai
import psutil
import pytest

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import ENGINE_THREADS, free_port, llama_server_argv, running
from tests.support.faultproxy import (
    LLAMA_CONTEXT,
    LLAMA_LOADING,
    MOONSHOT_CONTENT_FILTER,
    MOONSHOT_INVALID,
    MOONSHOT_OVERLOADED,
    MOONSHOT_QUOTA,
    MOONSHOT_RATE_LIMIT,
    MOONSHOT_SERVER_ERROR,
    Fault,
    FaultProxy,
)
from tests.support.gatewayrun import Engine, RunningGateway, add_key, gateway, gemma_server, write_config
from tierlocal.serve.state import ServeState, write_state

HOSTED_KEY = "sk-hosted-" + secrets.token_hex(16)
# The price table (USD per million tokens), read here independently of the gateway.
PRICES = {"input_cache_hit": 0.30, "input_cache_miss": 3.00, "output": 15.00}
PRICES_TOML = '[prices."kimi-k3"]\ninput_cache_hit = 0.30\ninput_cache_miss = 3.00\noutput = 15.00\n'
CHAT = {"model": "qwen3-14b", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def local_engine(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with gemma_server(assets, tmp_path_factory.mktemp("local"), ctx=2048, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def hosted_engine(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with gemma_server(assets, tmp_path_factory.mktemp("hosted"), "--api-key", HOSTED_KEY, ctx=2048, parallel=4) as engine:
        yield engine


@pytest.fixture(scope="module")
def embedding_engine(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """llama-server serves embeddings only when started for them (then it serves nothing else)."""
    with gemma_server(assets, tmp_path_factory.mktemp("embed"), "--embeddings", "--pooling", "mean", ctx=512, parallel=1) as engine:
        yield engine


def route(model: str, *targets: str) -> str:
    return f'[[routes]]\nmodel = "{model}"\ntargets = [\n' + "".join(f"  {target},\n" for target in targets) + "]\n"


def local(url: str) -> str:
    return f'{{ url = "{url}", model = "qwen3-14b" }}'


def hosted(url: str) -> str:
    return f'{{ url = "{url}", model = "kimi-k3", api_key_env = "HOSTED_KEY" }}'


def cost(usage: dict) -> float:  # type: ignore[type-arg]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return (
        cached * PRICES["input_cache_hit"]
        + (usage["prompt_tokens"] - cached) * PRICES["input_cache_miss"]
        + usage["completion_tokens"] * PRICES["output"]
    ) / 1e6


def usage_rows(gw: RunningGateway) -> list[sqlite3.Row]:
    with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return db.execute("SELECT * FROM usage ORDER BY id").fetchall()


def client(gw: RunningGateway, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url, api_key=gw.key, **kwargs)  # type: ignore[arg-type]


def sse_lines(response: httpx2.Response) -> list[str]:
    return [line for line in response.iter_lines() if line.startswith("data:")]


ENV = {"HOSTED_KEY": HOSTED_KEY}


# --- the happy path with the official client ------------------------------------------------


def test_openai_client_local_and_hosted_with_usage_and_key_injection(
    tmp_path: Path, local_engine: Engine, hosted_engine: Engine, embedding_engine: Engine
) -> None:
    with FaultProxy(f"http://127.0.0.1:{hosted_engine.port}") as upstream:
        body = (
            route("qwen3-14b", local(local_engine.url))
            + route("kimi-k3", hosted(upstream.url + "/v1"))
            + route("embed", local(embedding_engine.url))
            + PRICES_TOML
            + '[[users]]\nname = "alice"\n'
        )
        with gateway(tmp_path, body, env=ENV) as gw:
            api = client(gw, max_retries=0)
            assert {model.id for model in api.models.list()} == {"qwen3-14b", "kimi-k3", "embed"}
            answer = api.chat.completions.create(model="qwen3-14b", messages=[{"role": "user", "content": "Say hello"}], max_tokens=4)
            assert answer.choices[0].message.content and answer.usage is not None and answer.usage.completion_tokens == 4
            chunks = list(
                api.chat.completions.create(
                    model="kimi-k3",
                    messages=[{"role": "user", "content": "Say hello"}],
                    max_tokens=5,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
            streamed_usage = chunks[-1].usage
            assert text and streamed_usage is not None and streamed_usage.completion_tokens == 5
            # Without include_usage the client gets no usage chunk, though the gateway priced it.
            plain = list(api.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True))
            assert all(chunk.usage is None for chunk in plain)
            embedding = api.embeddings.create(model="embed", input="hello")
            assert len(embedding.data[0].embedding) > 100
            legacy = api.completions.create(model="kimi-k3", prompt="Once upon", max_tokens=3)
            assert legacy.usage is not None
            # Fields the gateway does not know pass through untouched (the engine may ignore them).
            tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
            api.chat.completions.create(
                model="kimi-k3",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
                tools=tools,
                extra_body={"reasoning_effort": "low", "x_custom": [1, {"a": None}]},
            )
            passed = upstream.seen[-1].body
            assert passed["tools"] == tools and passed["reasoning_effort"] == "low" and passed["x_custom"] == [1, {"a": None}]

            # The upstream got the gateway's key, never the client's; the local engine no key.
            assert {seen.authorization for seen in upstream.seen} == {f"Bearer {HOSTED_KEY}"}
            assert all(seen.body["model"] == "kimi-k3" for seen in upstream.seen)
            assert upstream.seen[0].body["stream_options"] == {"include_usage": True}  # always priced
            assert upstream.seen[1].body["stream_options"] == {"include_usage": True}

            rows = usage_rows(gw)
            assert [row["route"] for row in rows] == ["qwen3-14b", "kimi-k3", "kimi-k3", "embed", "kimi-k3", "kimi-k3"]
            assert all(row["status"] == 200 for row in rows)
            assert rows[0]["completion_tokens"] == 4 and rows[0]["cost_usd"] == 0  # local: free
            assert rows[1]["prompt_tokens"] == streamed_usage.prompt_tokens and rows[1]["completion_tokens"] == 5
            assert rows[1]["cost_usd"] == pytest.approx(cost(streamed_usage.model_dump()), rel=1e-9)
            assert rows[1]["request_id"] == chunks[0].id
            assert rows[4]["cost_usd"] == pytest.approx(cost(legacy.usage.model_dump()), rel=1e-9)

            report = run_cli("usage", "--config", str(gw.config), "--json")
            assert report.returncode == 0, report.stderr
            totals = json.loads(report.stdout)
            assert totals["users"]["alice"]["requests"] == 6
            assert (
                totals["models"]["kimi-k3"]["completion_tokens"]
                == 5 + rows[2]["completion_tokens"] + legacy.usage.completion_tokens + rows[5]["completion_tokens"]
            )
            assert totals["users"]["alice"]["cost_usd"] == pytest.approx(sum(row["cost_usd"] for row in rows), abs=1e-6)

            metrics = httpx2.get(gw.url.removesuffix("/v1") + "/metrics", headers=gw.headers()).text
            assert 'tierlocal_gateway_requests_total{model="kimi-k3",status="200"} 4.0' in metrics
            assert 'tierlocal_gateway_tokens_total{kind="completion",model="qwen3-14b"} 4.0' in metrics


# --- fallback ------------------------------------------------------------------------------------

FALLBACKS = {
    "reset": (Fault(reset=True), "connect_error", True),
    "loading-503": (Fault(status=503, body=LLAMA_LOADING), "unavailable", True),
    "server-500": (Fault(status=500, body=MOONSHOT_SERVER_ERROR), "server_error", True),
    "overloaded-429": (Fault(status=429, body=MOONSHOT_OVERLOADED, headers={"Retry-After": "30"}), "rate_limited", True),
    "rpm-429-after-n-seconds": (
        Fault(status=429, body=json.loads(json.dumps(MOONSHOT_RATE_LIMIT).replace("after 2 seconds", "after 20 seconds"))),
        "rate_limited",
        True,
    ),
    "context-400": (Fault(status=400, body=LLAMA_CONTEXT), "context_exceeded", False),
}


@pytest.mark.parametrize(
    # The cooldown cases read a clock: on a loaded machine the seconds between the 429 and the
    # read once ate the difference between the hint (20 s) and the default (5 s).
    "case",
    [pytest.param(case, marks=pytest.mark.serial) if case in ("overloaded-429", "rpm-429-after-n-seconds") else case for case in FALLBACKS],
)
def test_fallback_matrix(case: str, tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    fault, reason, cools_down = FALLBACKS[case]
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as first:
        body = route("qwen3-14b", local(first.url + "/v1"), hosted(hosted_engine.url)) + PRICES_TOML
        # A cooldown without a hint lasts error_cooldown_s: long enough that two requests to the
        # hosted engine on a loaded machine (CI twice took over 30 s) cannot outlast it.
        with gateway(tmp_path, body, env=ENV, server="error_cooldown_s = 600") as gw:
            first.queue(fault)
            answer = httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-tierlocal-target"] == hosted_engine.url
            assert len(first.seen) == 1
            row = usage_rows(gw)[-1]
            assert row["fallback_reason"] == reason and row["target"].startswith(hosted_engine.url)
            assert row["cost_usd"] == pytest.approx(cost(answer.json()["usage"]), rel=1e-9)

            # The next request: a cooling target is skipped; a context miss is the request's fault only.
            again = httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60)
            assert again.status_code == 200
            if cools_down:
                assert len(first.seen) == 1 and again.headers["x-tierlocal-target"] == hosted_engine.url
                health = httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]["qwen3-14b"][0]
                assert health["state"] == "cooldown" and health["cooldown_s"] > 0
                # Without the hint a 429 cools for 5 s; the margins leave a loaded machine time
                # between the 429 and this read (CI once took 10 s).
                if case == "overloaded-429":
                    assert 5 < health["cooldown_s"] <= 30  # Retry-After honoured
                if case == "rpm-429-after-n-seconds":
                    assert 5 < health["cooldown_s"] <= 20  # "try again after 20 seconds" honoured
            else:
                assert len(first.seen) == 2 and again.headers["x-tierlocal-target"] == first.url + "/v1", gw.log_text()


def test_down_local_engine_is_skipped_and_streams_fall_back_before_the_first_byte(
    tmp_path: Path, local_engine: Engine, hosted_engine: Engine
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as first:
        body = (
            route("qwen3-14b", local(first.url + "/v1"), hosted(hosted_engine.url))
            + route("gone", local(dead), hosted(hosted_engine.url))
            + PRICES_TOML
        )
        with gateway(tmp_path, body, env=ENV) as gw:
            health = httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]
            assert health["gone"][0]["state"] == "down" and health["gone"][1]["state"] == "unknown"  # hosted: not polled
            assert httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "gone"}, headers=gw.headers(), timeout=60).status_code == 200
            # Skipped without an attempt is a fallback all the same: logged with why, counted, kept.
            assert usage_rows(gw)[-1]["fallback_reason"] == "engine_down"
            assert "model=gone" in gw.log_text() and "fallback=engine_down" in gw.log_text()
            metrics = httpx2.get(gw.url.removesuffix("/v1") + "/metrics", headers=gw.headers()).text
            assert 'tierlocal_gateway_fallbacks_total{model="gone",reason="engine_down"} 1.0' in metrics
            # ... and the dashboard's Live page shows it (it once said "Fallbacks taken: None")
            live = httpx2.get(gw.url.removesuffix("/v1") + "/ui/data/live.json", headers=gw.headers(), timeout=30)
            assert live.status_code == 200 and live.json()["data"]["fallbacks"] == {"gone · engine_down": 1.0}
            assert "Fallbacks taken" in live.json()["html"] and "gone · engine_down" in live.json()["html"]
            assert httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]["gone"][1]["state"] == "up"  # it answered
            # Cut after one byte: nothing reached the client, so the stream falls back whole.
            first.queue(Fault(cut_after=1))
            with httpx2.stream("POST", gw.url + "/chat/completions", json={**CHAT, "stream": True}, headers=gw.headers(), timeout=60) as response:
                assert response.status_code == 200 and response.headers["x-tierlocal-target"] == hosted_engine.url
                lines = sse_lines(response)
            assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
            assert len({json.loads(line[5:])["id"] for line in lines[:-1]}) == 1


def test_mid_stream_cut_ends_with_one_error_frame_and_done(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    with (
        FaultProxy(f"http://127.0.0.1:{local_engine.port}") as first,
        gateway(tmp_path, route("qwen3-14b", local(first.url + "/v1"), hosted(hosted_engine.url)) + PRICES_TOML, env=ENV) as gw,
    ):
        # Measure a whole stream through the proxy first, then cut the next one halfway.
        whole = httpx2.post(first.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 12, "stream": True}, timeout=60).content
        first.reset()
        first.queue(Fault(cut_after=len(whole) // 2))
        with httpx2.stream(
            "POST", gw.url + "/chat/completions", json={**CHAT, "max_tokens": 12, "stream": True}, headers=gw.headers(), timeout=60
        ) as response:
            assert response.status_code == 200
            lines = sse_lines(response)
        errors = [line for line in lines if '"error"' in line]
        assert len(errors) == 1, lines
        assert lines[-2:] == [errors[0], "data: [DONE]"]
        assert json.loads(errors[0][5:])["error"]["code"] == "stream_interrupted"
        content = [json.loads(line[5:]) for line in lines[:-2]]
        assert content and len({chunk["id"] for chunk in content}) == 1  # one upstream, nothing spliced
        assert len(first.seen) == 1
        row = usage_rows(gw)[-1]
        assert row["status"] == 502 and "stream_cut" in row["fallback_reason"]

        # The openai client sees the in-band error as an exception after the content it got.
        first.queue(Fault(cut_after=len(whole) // 2))
        received = []
        with pytest.raises(openai.APIError, match="stream broke"):
            for chunk in client(gw, max_retries=0).chat.completions.create(**{**CHAT, "max_tokens": 12}, stream=True):
                received.append(chunk)
        assert received


# --- errors that go back --------------------------------------------------------------------------

NOT_RETRIED = {
    "quota-429": (Fault(status=429, body=MOONSHOT_QUOTA), 429, "exceeded_current_quota_error"),
    "invalid-400": (Fault(status=400, body=MOONSHOT_INVALID), 400, "invalid_request_error"),
    "content-filter-400": (Fault(status=400, body=MOONSHOT_CONTENT_FILTER), 400, "content_filter"),
}


@pytest.mark.parametrize("case", list(NOT_RETRIED))
def test_errors_that_are_not_retried(case: str, tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    fault, status, type_ = NOT_RETRIED[case]
    with FaultProxy(f"http://127.0.0.1:{hosted_engine.port}") as upstream, FaultProxy(f"http://127.0.0.1:{local_engine.port}") as second:
        with gateway(tmp_path, route("qwen3-14b", hosted(upstream.url + "/v1"), local(second.url + "/v1")) + PRICES_TOML, env=ENV) as gw:
            upstream.always = fault
            # The openai client retries 429 by default: x-should-retry: false must stop it.
            with pytest.raises(openai.APIStatusError) as caught:
                client(gw, max_retries=2).chat.completions.create(**CHAT)
            assert caught.value.status_code == status
            assert caught.value.response.headers["x-should-retry"] == "false"
            assert caught.value.body["type"] == type_  # type: ignore[index]
            assert len(upstream.seen) == 1 and not second.seen
            assert "org-9f8e" not in caught.value.message and "ak-a1b2" not in caught.value.message


def test_wrong_upstream_key_is_a_real_401_and_not_retried(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as second:
        with gateway(tmp_path, route("qwen3-14b", hosted(hosted_engine.url), local(second.url + "/v1")), env={"HOSTED_KEY": "sk-wrong"}) as gw:
            response = httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60)
            assert response.status_code == 401 and response.headers["x-should-retry"] == "false"
            assert "refused the gateway's own key" in response.json()["error"]["message"]
            assert not second.seen


def test_missing_upstream_key_names_the_variable(tmp_path: Path, hosted_engine: Engine) -> None:
    with gateway(tmp_path, route("kimi-k3", hosted(hosted_engine.url)), env={"HOSTED_KEY": ""}) as gw:
        response = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=30)
        assert response.status_code == 503 and "HOSTED_KEY" in response.json()["error"]["message"]
        assert "HOSTED_KEY is not set" in gw.log_text()
        # A configuration error: retrying cannot help, so the SDKs are told not to.
        assert response.headers["x-should-retry"] == "false" and "retry-after" not in response.headers


def test_an_upstream_that_does_not_resolve_fails_once_and_says_not_to_retry(tmp_path: Path) -> None:
    """The built-in kimi-k3 route against an API host that does not resolve once made 6 attempts
    over 10.8 s and answered a retryable 503, which the openai client then retried whole."""
    with gateway(tmp_path, route("kimi-k3", hosted("http://api.no-such-host.invalid/v1")), env=ENV) as gw:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client(gw, max_retries=2).chat.completions.create(**{**CHAT, "model": "kimi-k3"})
        assert time.monotonic() - started < 10
        assert caught.value.status_code == 503 and caught.value.response.headers["x-should-retry"] == "false"
        assert "dns_error" in caught.value.message
        rows = usage_rows(gw)
        assert [(row["status"], row["fallback_reason"]) for row in rows] == [(503, "dns_error")]  # one request, not three
        assert "attempts=1 " in gw.log_text()


# --- capacity, limits, budgets ----------------------------------------------------------------------


def test_capacity_spills_to_the_next_target_instead_of_queueing(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url), hosted(hosted_engine.url)) + PRICES_TOML, env=ENV) as gw:
        assert httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]["qwen3-14b"][0]["slots"] == 2
        body = {**CHAT, "max_tokens": 40}
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: httpx2.post(gw.url + "/chat/completions", json=body, headers=gw.headers(), timeout=120), range(3)))
        targets = sorted(answer.headers["x-tierlocal-target"] for answer in answers)
        assert targets == sorted([local_engine.url, local_engine.url, hosted_engine.url])
        spilled = [row for row in usage_rows(gw) if row["target"].startswith(hosted_engine.url)]
        assert [row["fallback_reason"] for row in spilled] == ["slots_full"]
        metrics = httpx2.get(gw.url.removesuffix("/v1") + "/metrics", headers=gw.headers()).text
        assert 'tierlocal_gateway_fallbacks_total{model="qwen3-14b",reason="slots_full"} 1.0' in metrics


@pytest.mark.parametrize("workers", [1, 2])
def test_rate_limit_answers_429_with_retry_after(tmp_path: Path, local_engine: Engine, workers: int) -> None:
    """With 2 worker processes the limit is shared (each request on a new connection, so the
    kernel spreads them), and /metrics from either counts both."""
    body = route("qwen3-14b", local(local_engine.url)) + '[[users]]\nname = "alice"\nrequests_per_minute = 2\n'
    with gateway(tmp_path, body, workers=workers) as gw:
        for _ in range(2):
            assert httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60).status_code == 200
        for _ in range(3):
            limited = httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60)
            assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(limited.headers["Retry-After"]) <= 60
        assert len(usage_rows(gw)) == 2  # a refused request is never admitted
        for _ in range(4):
            metrics = httpx2.get(gw.url.removesuffix("/v1") + "/metrics", headers=gw.headers(), timeout=10).text
            assert 'tierlocal_gateway_requests_total{model="qwen3-14b",status="200"} 2.0' in metrics


@pytest.mark.parametrize("workers", [1, 2])
def test_fifty_concurrent_requests_never_overrun_a_budget(tmp_path: Path, hosted_engine: Engine, workers: int) -> None:
    budget = 0.005
    body = route("kimi-k3", hosted(hosted_engine.url)) + PRICES_TOML + f'[[users]]\nname = "bob"\nbudget_usd = {budget}\nbudget_period = "day"\n'
    with gateway(tmp_path, body, user="bob", env=ENV, workers=workers) as gw:
        request = {**CHAT, "model": "kimi-k3"}
        with ThreadPoolExecutor(50) as pool:
            burst = list(pool.map(lambda _: httpx2.post(gw.url + "/chat/completions", json=request, headers=gw.headers(), timeout=120), range(50)))
        statuses = [answer.status_code for answer in burst]
        assert set(statuses) == {200, 429} and statuses.count(429) > 0, statuses
        assert all(answer.json()["error"]["code"] == "budget_exceeded" for answer in burst if answer.status_code == 429)
        refused = next(answer.json()["error"]["message"] for answer in burst if answer.status_code == 429)
        assert " of $0.005 this day is spent or held" in refused  # a budget under a cent keeps its digits (it once read $0.00)
        # After reconciliation the budget frees up: sequential requests are admitted until the
        # remaining budget is below one request's worst case, and never beyond the budget.
        served = statuses.count(200)
        for _ in range(80):
            answer = httpx2.post(gw.url + "/chat/completions", json=request, headers=gw.headers(), timeout=60)
            if answer.status_code == 429:
                break
            assert answer.status_code == 200
            served += 1
        else:
            pytest.fail("the budget never ran out")
        rows = usage_rows(gw)
        assert len(rows) == served
        spent = sum(
            cost(
                {
                    "prompt_tokens": row["prompt_tokens"],
                    "completion_tokens": row["completion_tokens"],
                    "prompt_tokens_details": {"cached_tokens": row["cached_tokens"]},
                }
            )
            for row in rows
        )
        assert spent <= budget
        assert spent == pytest.approx(sum(row["cost_usd"] for row in rows), rel=1e-9)
        # No reservation is left behind, and no false rejection: what was refused at the end
        # really would not fit (the worst case of one request is more than what is left).
        with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0
        worst = (len(json.dumps(request).encode()) + 64) * PRICES["input_cache_miss"] / 1e6 + 4 * PRICES["output"] / 1e6
        assert budget - spent < worst * 1.5
        assert served > 25  # reconciliation freed what the worst cases held
        # usage says the same figures with their digits (it once printed "$0.0016 of $0.00")
        table = " ".join(run_cli("usage", "--period", "day", "--config", str(gw.config)).stdout.split())
        assert "of $0.005" in table and "$0.00 " not in table + " ", table


def test_a_user_added_while_the_gateway_runs_has_the_budget_the_file_gives(tmp_path: Path, hosted_engine: Engine) -> None:
    """Issue 47: dave, appended to the running gateway's config with a $1 budget and given a key,
    had his $1.50 worst case sent upstream (no budget at all), while bob was held to his. The
    running gateway reads [[users]] again when the file changes; a key whose user the file no
    longer names is refused, never served without limits."""
    body = route("kimi-k3", hosted(hosted_engine.url)) + PRICES_TOML + '[[users]]\nname = "bob"\nbudget_usd = 6.0\n'
    with gateway(tmp_path, body, user="bob", env=ENV) as gw:
        expensive = {**CHAT, "model": "kimi-k3", "max_tokens": 100_000}  # worst case: 100,000 × $15/M = $1.50 of output
        with gw.config.open("a") as config:
            config.write('\n[[users]]\nname = "dave"\nbudget_usd = 1.0\n')
        added = run_cli("gateway", "keys", "add", "dave", "--config", str(gw.config))
        assert added.returncode == 0 and "reads its [[users]] again when the file changes" in added.stderr, added.stderr
        dave = added.stdout.strip()
        refused = httpx2.post(gw.url + "/chat/completions", json=expensive, headers=gw.headers(dave), timeout=60)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded", refused.text
        assert "of $1.00 this month" in refused.json()["error"]["message"], refused.text
        cheap = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(dave), timeout=60)
        assert cheap.status_code == 200, cheap.text  # within his budget
        # dave leaves the file: his key no longer works (it would have no limits at all)
        gw.config.write_text(gw.config.read_text().replace('[[users]]\nname = "dave"\nbudget_usd = 1.0\n', ""))
        gone = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(dave), timeout=60)
        assert gone.status_code == 403 and gone.json()["error"]["code"] == "user_not_configured", gone.text
        assert "no [[users]] entry" in gone.json()["error"]["message"]
        assert httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60).status_code == 200
        # a change to bob's own limits applies from the next request, without a restart
        gw.config.write_text(gw.config.read_text().replace("budget_usd = 6.0", "budget_usd = 0.000001"))
        answer = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "budget_exceeded", answer.text
    assert "[[users]] read again" in gw.log_text()


def test_usage_names_the_store_it_read_and_refuses_an_empty_default(tmp_path: Path, hosted_engine: Engine) -> None:
    """Issue 47: `tierlocal usage` without --config read another, empty store and printed empty
    tables with exit 0."""
    body = route("kimi-k3", hosted(hosted_engine.url)) + PRICES_TOML + '[[users]]\nname = "bob"\n'
    with gateway(tmp_path, body, user="bob", env=ENV) as gw:
        assert httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60).status_code == 200
        assert f"keys and usage in {gw.state_dir}" in gw.log_text()
    plain = run_cli("usage")
    assert plain.returncode == 2 and plain.stdout == ""
    assert "no gateway has kept usage in" in plain.stderr and "tierlocal usage --config FILE" in plain.stderr, plain.stderr
    report = run_cli("usage", "--config", str(gw.config), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["store"] == str(gw.state_dir) and json.loads(report.stdout)["users"]["bob"]["requests"] == 1
    text = run_cli("usage", "--config", str(gw.config)).stdout
    assert text.splitlines()[0].startswith(f"usage from {gw.state_dir} ({gw.config})")


# --- secrets and bad input ---------------------------------------------------------------------------


def test_secret_leak_scan_over_every_error_path(tmp_path: Path, hosted_engine: Engine) -> None:
    seen_text: list[str] = []
    with FaultProxy(f"http://127.0.0.1:{hosted_engine.port}") as upstream:
        # Bodies are stored for this route, so the stored rows are scanned too.
        body = (
            route("kimi-k3", hosted(upstream.url + "/v1")).replace("[[routes]]\n", "[[routes]]\nstore_bodies = true\n")
            + PRICES_TOML
            + '[[users]]\nname = "alice"\nbudget_usd = 1.0\n'
        )
        with gateway(tmp_path, body, env=ENV, server="retry_deadline_s = 3") as gw:
            faults = [
                Fault(echo_key=True, status=400),  # passed back: must be scrubbed
                Fault(echo_key=True, status=500),  # falls back, then the 503 names the last failure
                Fault(status=429, body=MOONSHOT_QUOTA),
                Fault(status=429, body=MOONSHOT_RATE_LIMIT),
                Fault(reset=True),
                Fault(cut_after=400),
                None,
            ]
            for fault in faults:
                upstream.reset()
                if fault is not None:
                    upstream.always = fault
                for stream in (False, True):
                    response = httpx2.post(
                        gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3", "stream": stream}, headers=gw.headers(), timeout=60
                    )
                    seen_text.append(str(response.status_code) + str(dict(response.headers)) + response.text)
            assert any('"echo' in text or "bad request from" in text for text in seen_text)  # the leaky path was reached
            for path in ("/metrics", "/health", "/v1/models"):
                seen_text.append(httpx2.get(gw.url.removesuffix("/v1") + path, headers=gw.headers()).text)
            for command in (("usage", "--json"), ("gateway", "keys", "list", "--json")):
                result = run_cli(*command, "--config", str(gw.config))
                seen_text.append(result.stdout + result.stderr)
        seen_text.append(gw.log_text())
        for stored in gw.state_dir.iterdir():
            seen_text.append(stored.read_bytes().decode("latin-1"))
        haystack = "\n".join(seen_text)
        assert HOSTED_KEY not in haystack and HOSTED_KEY[10:] not in haystack
        assert "org-9f8e7d6c5b4a" not in haystack and "ak-a1b2c3d4e5f6" not in haystack
        assert "[redacted]" in haystack


def test_bad_requests_get_clear_errors_and_the_gateway_keeps_serving(tmp_path: Path, local_engine: Engine) -> None:
    body = route("qwen3-14b", local(local_engine.url)) + '[[users]]\nname = "alice"\n[[users]]\nname = "carol"\n'
    with gateway(tmp_path, body, server="max_body_bytes = 4096") as gw:
        base = gw.url
        carol = add_key(gw.config, "carol")
        cases = [
            (httpx2.post(base + "/chat/completions", content=b"{not json", headers=gw.headers()), 400, "invalid_json"),
            (httpx2.post(base + "/chat/completions", json=[1, 2], headers=gw.headers()), 400, "invalid_json"),
            (httpx2.post(base + "/chat/completions", json={"messages": []}, headers=gw.headers()), 400, "missing_model"),
            (httpx2.post(base + "/chat/completions", json={**CHAT, "model": "gpt-9"}, headers=gw.headers()), 404, "model_not_found"),
            (httpx2.post(base + "/chat/completions", json=CHAT), 401, "missing_api_key"),
            (httpx2.post(base + "/chat/completions", json=CHAT, headers=gw.headers("tlk-not-a-key")), 401, "invalid_api_key"),
            (httpx2.get(base + "/models"), 401, "missing_api_key"),
            (httpx2.get(base.removesuffix("/v1") + "/metrics"), 401, "missing_api_key"),
            (httpx2.post(base + "/chat/completions", content=b'{"model": "' + b"x" * 5000 + b'"}', headers=gw.headers()), 413, "request_too_large"),
        ]
        for response, status, code in cases:
            assert response.status_code == status, (code, response.text)
            error = response.json()["error"]
            assert error["code"] == code and error["message"] and set(error) == {"message", "type", "param", "code"}
        # A revoked key stops working (within the auth cache's 2 s).
        assert run_cli("gateway", "keys", "revoke", "carol", "--config", str(gw.config)).returncode == 0
        time.sleep(2.5)
        assert httpx2.post(base + "/chat/completions", json=CHAT, headers=gw.headers(carol)).status_code == 401
        assert httpx2.post(base + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60).status_code == 200
        assert gw.process.poll() is None


# --- process behaviour ---------------------------------------------------------------------------------


def test_refuses_a_public_address_without_a_key_and_makes_one_on_loopback(tmp_path: Path, local_engine: Engine) -> None:
    config, _port = write_config(tmp_path, route("qwen3-14b", local(local_engine.url)))
    refused = run_cli("gateway", "--config", str(config), "--host", "0.0.0.0", timeout=30)
    assert refused.returncode != 0 and "no gateway key exists" in refused.stderr and "keys add" in refused.stderr
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url)), user=None) as gw:
        key_file = gw.state_dir / "local.key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_file.read_text().strip()
        assert httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(key), timeout=60).status_code == 200


def test_readiness_is_notified_on_a_real_datagram_socket(tmp_path: Path, local_engine: Engine) -> None:
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(address)
        receiver.settimeout(30)
        with gateway(tmp_path, route("qwen3-14b", local(local_engine.url)), env={"NOTIFY_SOCKET": address}) as gw:
            message = receiver.recv(4096).decode()
            assert "READY=1" in message.splitlines()
            gw.process.terminate()
            assert gw.process.wait(20) == 0
            assert "STOPPING=1" in receiver.recv(4096).decode()


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_9_under_load_loses_and_doubles_no_completed_request(tmp_path: Path, local_engine: Engine, workers: int) -> None:
    """With 2 workers every gateway process is killed -9 (the workers first, so none is told
    to stop gracefully)."""
    completed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url)), workers=workers) as gw:

        def worker() -> None:
            while not stop.is_set():
                try:
                    answer = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "max_tokens": 2}, headers=gw.headers(), timeout=30)
                except httpx2.HTTPError:
                    return
                if answer.status_code == 200:
                    with lock:
                        completed.append(answer.json()["id"])

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(completed) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        for child in psutil.Process(gw.process.pid).children():
            child.kill()  # SIGKILL while requests are in flight
        gw.process.kill()
        gw.process.wait()
        stop.set()
        for thread in threads:
            thread.join(40)
    assert len(completed) >= 5
    with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = [row[0] for row in db.execute("SELECT request_id FROM usage WHERE status = 200")]
    assert len(ids) == len(set(ids))  # nothing counted twice
    assert set(completed) <= set(ids)  # every answer a client got was recorded
    assert len(ids) - len(completed) <= 8  # at most the requests in flight at the kill


def test_default_configuration_serves_what_tierlocal_serve_runs(tmp_path: Path, assets: Assets) -> None:
    port = free_port()
    serve_log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlocal",
            "serve",
            str(assets.gemma_gguf),
            "--port",
            str(port),
            "--llama-server",
            str(assets.llama_server_cpu),
            "--ctx",
            "1024",
            "--threads",
            ENGINE_THREADS,
        ],
        stdout=serve_log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env=os.environ.copy(),
    )
    serve_log.close()
    try:
        state = Path(os.environ["TIERLOCAL_HOME"]) / "run" / f"serve-{port}.json"
        deadline = time.monotonic() + 180
        while not state.exists():
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        gateway_port = free_port()
        log = tmp_path / "gateway.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "tierlocal", "gateway", "--port", str(gateway_port)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, "MOONSHOT_API_KEY": ""},
            )
        try:
            key_file = Path(os.environ["TIERLOCAL_HOME"]) / "gateway" / "local.key"
            deadline = time.monotonic() + 60
            while not (key_file.exists() and "gateway on" in log.read_text()):
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=key_file.read_text().strip(), max_retries=0)
            models = {model.id for model in api.models.list()}
            assert {"kimi-k3", assets.gemma_gguf.stem} <= models
            answer = api.chat.completions.create(model=assets.gemma_gguf.stem, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
            assert answer.usage is not None and answer.usage.completion_tokens == 3
            assert answer.model == assets.gemma_gguf.stem  # issue 47: it was the engine's path to the file
            # The Gemma file has no template: serve gave llama-server Gemma's, not its ChatML fallback.
            said = api.chat.completions.create(
                model=assets.gemma_gguf.stem, messages=[{"role": "user", "content": "Say hello"}], max_tokens=16, temperature=0
            )
            text = said.choices[0].message.content or ""
            assert text and "<|im_start|>" not in text and "<|im_end|>" not in text, text
            with pytest.raises(openai.APIStatusError, match="MOONSHOT_API_KEY"):
                api.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        finally:
            process.terminate()
            process.wait(20)
    finally:
        serve.terminate()
        serve.wait(30)


def test_a_local_engine_too_slow_for_a_route_is_passed_over_for_speed_and_counted(
    tmp_path: Path, assets: Assets, local_engine: Engine, hosted_engine: Engine
) -> None:
    """Issue 48: the local llama-server stands behind a `tierlocal serve` state whose plan is a real
    `check --users 2` of the Gemma file on this machine. A route whose per-user floor is twice what
    that plan gives one more user passes the engine over for the hosted API — logged with the
    figures, counted, kept in the usage row, shown on /health and the Live page; a route whose
    floor is half of it is served locally."""
    planned = run_cli("check", str(assets.gemma_gguf), "--users", "2", "--ctx", "2048", "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    one_user = next(row for row in plan["users"] if row["users"] == 1)["per_user_decode_tokens_per_s"]
    engine_root = local_engine.url.removesuffix("/v1")
    state = ServeState(engine_root, os.getpid(), "llama-server", None, None, plan, {}, {"verified": True})
    write_state(local_engine.port, state)
    local_target = f'{{ url = "{local_engine.url}", model = "gemma" }}'
    body = (
        f'[[routes]]\nmodel = "strict"\nmin_user_tokens_per_s = {one_user * 2:.3f}\ntargets = [ {local_target}, {hosted(hosted_engine.url)} ]\n'
        f'[[routes]]\nmodel = "easy"\nmin_user_tokens_per_s = {one_user / 2:.3f}\ntargets = [ {local_target}, {hosted(hosted_engine.url)} ]\n'
        + PRICES_TOML
    )
    with gateway(tmp_path, body, env=ENV) as gw:
        root = gw.url.removesuffix("/v1")
        health = httpx2.get(root + "/health").json()["routes"]
        assert health["strict"][0]["next_user"]["users"] == 1 and health["strict"][0]["passed_over_for"] == "below_speed_floor"
        assert health["strict"][0]["next_user"]["per_user_decode_tokens_per_s"] == pytest.approx(one_user, rel=0.01)
        assert health["easy"][0]["passed_over_for"] is None
        strict = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "strict"}, headers=gw.headers(), timeout=60)
        assert strict.status_code == 200 and strict.headers["x-tierlocal-target"] == hosted_engine.url
        easy = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "easy"}, headers=gw.headers(), timeout=60)
        assert easy.status_code == 200 and easy.headers["x-tierlocal-target"] == local_engine.url
        assert [row["fallback_reason"] for row in usage_rows(gw)] == ["below_speed_floor", None]
        # Item 5: the local answer's tokens at the price of the API the route falls back to.
        local_row = usage_rows(gw)[1]
        spent = json.loads(run_cli("usage", "--config", str(gw.config), "--json").stdout)["local"][f"{local_engine.url}#gemma"]
        assert (spent["routes"], spent["api_model"], spent["completion_tokens"]) == (["strict", "easy"], "kimi-k3", local_row["completion_tokens"])
        usage = {
            "prompt_tokens": local_row["prompt_tokens"],
            "prompt_tokens_details": {"cached_tokens": local_row["cached_tokens"]},  # the engine may have the prompt cached
            "completion_tokens": local_row["completion_tokens"],
        }
        assert spent["api_usd"] == pytest.approx(cost(usage), abs=1e-6) and spent["api_usd"] > 0
        assert f"passed over for strict (below_speed_floor): {local_engine.url}#gemma: " in gw.log_text()
        metrics = httpx2.get(root + "/metrics", headers=gw.headers()).text
        assert 'tierlocal_gateway_fallbacks_total{model="strict",reason="below_speed_floor"} 1.0' in metrics
        live = httpx2.get(root + "/ui/data/live.json", headers=gw.headers(), timeout=30).json()
        assert live["data"]["fallbacks"] == {"strict · below_speed_floor": 1.0} and "below_speed_floor" in live["html"]


def test_a_model_that_cannot_fit_has_no_local_target(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    # Kimi K3 (recipes/frontier.toml: a serving floor of over a terabyte) cannot run on this
    # machine, so even a healthy local engine configured for it is never used.
    k3_local = f'{{ url = "{local_engine.url}", model = "kimi-k3" }}'
    body = route("kimi-k3", k3_local, hosted(hosted_engine.url)) + PRICES_TOML
    with gateway(tmp_path, body, env=ENV) as gw:
        health = httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]["kimi-k3"]
        assert [target["url"] for target in health] == [hosted_engine.url]
        answer = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
        assert answer.status_code == 200 and answer.headers["x-tierlocal-target"] == hosted_engine.url
        assert "kimi-k3 needs at least" in gw.log_text() and "local targets are skipped" in gw.log_text()


def test_kimi_goes_to_your_cluster_first_and_to_the_hosted_api_when_it_stops(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    """Tier 1 first: a llama-server stands in for the rented cluster (behind the fault proxy, so
    it can go away), a second one with --api-key for the hosted API. The cluster answers; once
    it refuses connections (stopped, or loading) the API takes over; usage says which tier
    answered each request, and the cluster's hours against what its tokens cost on the API."""
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as cluster:
        cluster_target = f'{{ url = "{cluster.url}/v1", model = "moonshotai/Kimi-K3", tier = 1, usd_per_hour = 2.0 }}'
        admin = '[[users]]\nname = "alice"\nadmin = true\n'  # sees every tier on the dashboard
        with gateway(tmp_path, route("kimi-k3", cluster_target, hosted(hosted_engine.url)) + PRICES_TOML + admin, env=ENV) as gw:
            health = httpx2.get(gw.url.removesuffix("/v1") + "/health").json()["routes"]["kimi-k3"]
            assert [target["url"] for target in health] == [cluster.url + "/v1", hosted_engine.url]  # not dropped as "cannot fit"
            first = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
            assert first.status_code == 200 and first.headers["x-tierlocal-target"] == cluster.url + "/v1"
            assert cluster.seen[-1].body["model"] == "moonshotai/Kimi-K3" and cluster.seen[-1].authorization is None
            cluster.stop()  # the cluster stops: its port refuses connections
            second = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
            assert second.status_code == 200 and second.headers["x-tierlocal-target"] == hosted_engine.url
            rows = usage_rows(gw)
            assert [(row["tier"], row["target"]) for row in rows] == [
                (1, f"{cluster.url}/v1#moonshotai/Kimi-K3"),
                (3, f"{hosted_engine.url}#kimi-k3"),
            ]
            assert rows[0]["cost_usd"] == 0 and rows[1]["cost_usd"] > 0  # the cluster is paid by the hour, not per token
            # Refused at once, or already marked down by the health poll: either way, a fallback with its reason.
            assert rows[0]["fallback_reason"] is None and rows[1]["fallback_reason"] in ("connect_error", "engine_down")
            report = run_cli("usage", "--config", str(gw.config), "--period", "all", "--json")
            text = run_cli("usage", "--config", str(gw.config), "--period", "all")
            spend = httpx2.get(gw.url.removesuffix("/v1") + "/ui/data/spend.json?period=all", headers=gw.headers(), timeout=30).json()
    # The dashboard's spend page draws the same report: the tiers, and the cluster against the API.
    assert set(spend["data"]["by_tier"]) == {"1", "3"}
    assert '<section class="cluster"' in spend["html"] and "Your cluster" in spend["html"] and "was cheaper" in spend["html"]
    assert report.returncode == 0, report.stderr
    usage = json.loads(report.stdout)
    tiers = usage["by_tier"]
    assert set(tiers) == {"1", "3"} and (tiers["1"]["name"], tiers["1"]["requests"], tiers["3"]["requests"]) == ("your cluster", 1, 1)
    mine = usage["clusters"][f"{cluster.url}/v1#moonshotai/Kimi-K3"]
    served = first.json()["usage"]
    assert mine["tokens"] == served["prompt_tokens"] + served["completion_tokens"] and mine["usd_per_hour"] == 2.0
    assert mine["api_usd"] == pytest.approx(cost(served), abs=1e-6)  # the same tokens at the API's price, computed here
    assert mine["cluster_usd"] == pytest.approx(2.0 * mine["hours"], abs=1e-5) and mine["cheaper"] == (
        "cluster" if mine["cluster_usd"] < mine["api_usd"] else "api"
    )
    assert "tier 1 (your cluster): 1 requests" in text.stdout and "tier 3 (hosted API): 1 requests" in text.stdout
    assert f"cluster {cluster.url}/v1#moonshotai/Kimi-K3:" in text.stdout


def test_a_real_context_overflow_goes_to_the_larger_context_target(tmp_path: Path, assets: Assets, hosted_engine: Engine) -> None:
    """A local llama-server with a 256-token context answers a longer prompt with its real 400
    exceed_context_size_error; the gateway sends the request on to the 2048-token target."""
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, ctx=256, parallel=1)
    with running(argv, tmp_path / "small.log", f"http://127.0.0.1:{port}/health"):
        small = f"http://127.0.0.1:{port}/v1"
        long_prompt = {**CHAT, "messages": [{"role": "user", "content": "hello world " * 200}]}
        direct = httpx2.post(small + "/chat/completions", json=long_prompt, timeout=60)
        assert direct.status_code == 400 and direct.json()["error"]["type"] == "exceed_context_size_error"
        with gateway(tmp_path, route("qwen3-14b", local(small), hosted(hosted_engine.url)) + PRICES_TOML, env=ENV) as gw:
            answer = httpx2.post(gw.url + "/chat/completions", json=long_prompt, headers=gw.headers(), timeout=120)
            assert answer.status_code == 200 and answer.headers["x-tierlocal-target"] == hosted_engine.url
            assert usage_rows(gw)[-1]["fallback_reason"] == "context_exceeded"
            # A short prompt still runs locally: the overflow was the request's, not the engine's.
            short = httpx2.post(gw.url + "/chat/completions", json=CHAT, headers=gw.headers(), timeout=60)
            assert short.headers["x-tierlocal-target"] == small
        (tmp_path / "only").mkdir()
        with gateway(tmp_path / "only", route("qwen3-14b", local(small)), env=ENV) as gw:
            refused = httpx2.post(gw.url + "/chat/completions", json=long_prompt, headers=gw.headers(), timeout=60)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
            assert refused.headers["x-should-retry"] == "false"


def test_a_client_that_leaves_mid_stream_is_charged_what_it_got_and_its_hold_released(tmp_path: Path, hosted_engine: Engine) -> None:
    body = route("kimi-k3", hosted(hosted_engine.url)) + PRICES_TOML + '[[users]]\nname = "alice"\nbudget_usd = 1.0\n'
    with gateway(tmp_path, body, env=ENV) as gw:
        with httpx2.stream(
            "POST",
            gw.url + "/chat/completions",
            json={**CHAT, "model": "kimi-k3", "max_tokens": 400, "stream": True},
            headers=gw.headers(),
            timeout=60,
        ) as response:
            received = 0
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    received += 1
                if received == 3:
                    break  # leave: the connection closes here
        deadline = time.monotonic() + 30
        while not usage_rows(gw):
            assert time.monotonic() < deadline, gw.log_text()
            time.sleep(0.2)
        row = usage_rows(gw)[-1]
        assert row["status"] == 499 and "client_disconnected" in row["fallback_reason"]
        assert 3 <= row["completion_tokens"] < 400  # what it got (and what was in flight), not the 400 it asked for
        assert row["cost_usd"] > 0
        with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0


def test_serves_tls_itself_when_given_a_certificate(tmp_path: Path, local_engine: Engine) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    config, port = write_config(tmp_path, route("qwen3-14b", local(local_engine.url)), server=f'tls_cert = "{cert}"\ntls_key = "{key}"')
    gateway_key = add_key(config, "alice")
    log = tmp_path / "gateway.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "tierlocal", "gateway", "--config", str(config)], stdout=handle, stderr=subprocess.STDOUT, cwd=REPO_ROOT
        )
    try:
        deadline = time.monotonic() + 60
        while "gateway on https://" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as http:
            api = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key=gateway_key, max_retries=0, http_client=http)
            answer = api.chat.completions.create(model="qwen3-14b", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert answer.usage is not None and answer.usage.completion_tokens == 2
        with pytest.raises(httpx2.HTTPError):
            httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5)  # no plain HTTP on that port
    finally:
        process.terminate()
        process.wait(20)


def test_bodies_are_stored_only_where_enabled_capped_and_redacted(tmp_path: Path, local_engine: Engine) -> None:
    kept = f'[[routes]]\nmodel = "kept"\nstore_bodies = true\nmax_stored_body_bytes = 300\ntargets = [ {local(local_engine.url)} ]\n'
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url)) + kept) as gw:
        secretive = {"messages": [{"role": "user", "content": "my key is sk-live-abcdef123456 for org-7a7a7a7a, " + "pad " * 200}], "max_tokens": 3}
        for model in ("qwen3-14b", "kept"):
            assert httpx2.post(gw.url + "/chat/completions", json={**secretive, "model": model}, headers=gw.headers(), timeout=60).status_code == 200
        with httpx2.stream(
            "POST", gw.url + "/chat/completions", json={**secretive, "model": "kept", "stream": True}, headers=gw.headers(), timeout=60
        ) as response:
            streamed = "".join(response.iter_text())
        plain, whole, stream = usage_rows(gw)
        assert plain["request_body"] is None and plain["response_body"] is None
        for row in (whole, stream):
            assert 0 < len(row["request_body"]) <= 300 and "abcdef123456" not in row["request_body"] and "7a7a7a7a" not in row["request_body"]
            assert "sk-[redacted]" in row["request_body"] and "org-[redacted]" in row["request_body"]
            assert row["response_body"] and len(row["response_body"]) <= 300
        assert whole["response_body"].startswith("{") and '"choices"' in whole["response_body"]
        assert streamed.startswith(stream["response_body"][:100])  # the stream's first bytes, as the client got them


def test_a_single_target_is_retried_with_backoff_within_the_deadline(tmp_path: Path, hosted_engine: Engine) -> None:
    with (
        FaultProxy(f"http://127.0.0.1:{hosted_engine.port}") as upstream,
        gateway(tmp_path, route("kimi-k3", hosted(upstream.url + "/v1")) + PRICES_TOML, env=ENV) as gw,
    ):
        upstream.queue(Fault(status=500, body=MOONSHOT_SERVER_ERROR))
        started_at = time.monotonic()
        answer = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
        assert answer.status_code == 200 and len(upstream.seen) == 2, gw.log_text()
        assert time.monotonic() - started_at >= 1.9  # it waited out the target's 2 s cooldown
        assert usage_rows(gw)[-1]["fallback_reason"] == "server_error"
        # An upstream that keeps failing: a bounded number of attempts, then 503 with Retry-After.
        upstream.reset()
        upstream.always = Fault(status=502, body=MOONSHOT_SERVER_ERROR)
        failed = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=120)
        assert failed.status_code == 503 and failed.headers["x-should-retry"] == "true" and int(failed.headers["Retry-After"]) >= 1
        assert 2 <= len(upstream.seen) <= 6
        assert "server_error" in failed.json()["error"]["message"]


def test_a_budget_fails_closed_when_a_target_has_no_price(tmp_path: Path, hosted_engine: Engine) -> None:
    unpriced = f'{{ url = "{hosted_engine.url}", model = "mystery-model", api_key_env = "HOSTED_KEY" }}'
    body = route("mystery", unpriced) + '[[users]]\nname = "alice"\nbudget_usd = 5.0\n[[users]]\nname = "bob"\n'
    with gateway(tmp_path, body, env=ENV) as gw:
        refused = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "mystery"}, headers=gw.headers(), timeout=60)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "price_unknown"
        assert 'add [prices."mystery-model"]' in refused.json()["error"]["message"]
        # A user without a budget is not held to a price.
        bob = add_key(gw.config, "bob")
        assert httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "mystery"}, headers=gw.headers(bob), timeout=60).status_code == 200


def test_a_body_that_arrives_in_pieces_is_read_whole(tmp_path: Path, hosted_engine: Engine) -> None:
    """An upstream answer split into 64-byte pieces (as a slow link delivers it) is relayed
    whole, streaming or not — one read() returns what has arrived, not the whole body."""
    with (
        FaultProxy(f"http://127.0.0.1:{hosted_engine.port}") as upstream,
        gateway(tmp_path, route("kimi-k3", hosted(upstream.url + "/v1")) + PRICES_TOML, env=ENV) as gw,
    ):
        upstream.always = Fault(trickle=True)
        whole = httpx2.post(gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3"}, headers=gw.headers(), timeout=60)
        assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 4
        with httpx2.stream(
            "POST", gw.url + "/chat/completions", json={**CHAT, "model": "kimi-k3", "stream": True}, headers=gw.headers(), timeout=60
        ) as response:
            lines = sse_lines(response)
        assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
        assert len(upstream.seen) == 2  # no attempt failed on the way
        assert [row["status"] for row in usage_rows(gw)] == [200, 200] and usage_rows(gw)[1]["completion_tokens"] == 4

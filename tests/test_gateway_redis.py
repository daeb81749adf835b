"""The gateway's Redis store, on a real redis-server (Debian's, unpacked by tests/assets):
the same budget guarantee as SQLite across racing processes, and two gateway replicas sharing
one user base — keys, budget and usage — in front of a real llama-server."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
import redis

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import free_port, llama_server_argv, running, started
from tierlocal.gateway.store import UsageRecord
from tierlocal.gateway.store.redis import RedisStore

HOSTED_KEY = "sk-hosted-redis-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def redis_url(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    argv = [str(assets.redis_server), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    with (directory / "log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LD_LIBRARY_PATH": str(assets.redis_libs)})
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (directory / "log").read_text()
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, (directory / "log").read_text()
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        process.terminate()
        process.wait(10)


@pytest.fixture()
def clean_redis(redis_url: str) -> str:
    with redis.Redis.from_url(redis_url) as client:
        client.flushdb()
    return redis_url


def _reserve_many(url: str, count: int, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = RedisStore(url)
    results.put(sum(store.reserve("alice", 0.01, 0.20, "month") is not None for _ in range(count)))
    store.close()


def test_racing_processes_cannot_overrun_a_budget_in_redis(clean_redis: str) -> None:
    """Ten processes race for 0.01 USD holds, 10 each, against 0.20 USD: exactly 20 win."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = context.Queue()
    workers = [context.Process(target=_reserve_many, args=(clean_redis, 10, results)) for _ in range(10)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sum(results.get(timeout=5) for _ in workers) == 20
    store = RedisStore(clean_redis)
    try:
        assert store.spent("alice", "month") == pytest.approx(0.20)
        # Settling replaces a hold by the actual cost; totals add up; keys are hashed.
        hold = store.reserve("bob", 0.05, 0.10, "day")
        assert hold is not None and store.reserve("bob", 0.06, 0.10, "day") is None
        store.settle(hold, UsageRecord("bob", "kimi-k3", "kimi-k3", "t", 200, 1000, 400, 100, 0.01, 5.0, None, "chatcmpl-1", tier=3))
        assert store.spent("bob", "day") == pytest.approx(0.01)
        assert store.reserve("bob", 0.06, 0.10, "day") is not None
        totals = store.totals(0)
        assert totals["users"]["bob"] == {"requests": 1, "prompt_tokens": 1000, "cached_tokens": 400, "completion_tokens": 100, "cost_usd": 0.01}
        assert totals["tiers"] == {"3": totals["users"]["bob"]}  # the tier that answered, as SQLite records it
        key = store.add_key("carol")
        assert store.authenticate(key) == "carol" and store.authenticate(key + "x") is None
        with redis.Redis.from_url(clean_redis) as client:
            assert key not in json.dumps({k.decode(): v.decode() for k, v in client.hgetall("tierlocal:gateway:keys").items()})
        assert store.revoke("carol") == 1 and store.authenticate(key) is None
    finally:
        store.close()


@contextmanager
def replicas(tmp_path: Path, body: str, user: str, env: dict[str, str]) -> Iterator[tuple[list[int], list[Path], str]]:
    """Two `tierlocal gateway` processes with the same routes and users, sharing the Redis in
    ``env``; a key for ``user`` made through the first. Yields their ports, configs and the key."""
    ports = [free_port(), free_port()]
    configs = []
    for index, port in enumerate(ports):
        config = tmp_path / f"replica{index}.toml"
        config.write_text(f'[server]\nport = {port}\nstate_dir = "{tmp_path / f"state{index}"}"\nredis_url_env = "TIERLOCAL_REDIS_URL"\n{body}')
        configs.append(config)
    added = run_cli("gateway", "keys", "add", user, "--config", str(configs[0]), "--json", env=env)
    assert added.returncode == 0, added.stderr
    command = [sys.executable, "-m", "tierlocal", "gateway", "--config"]
    environment = {**env, "PYTHONPATH": str(REPO_ROOT)}
    with started([*command, str(configs[0])], tmp_path / "r0.log", f"http://127.0.0.1:{ports[0]}/health", environment, timeout_s=60):
        with started([*command, str(configs[1])], tmp_path / "r1.log", f"http://127.0.0.1:{ports[1]}/health", environment, timeout_s=60):
            yield ports, configs, json.loads(added.stdout)["key"]


def test_two_replicas_share_keys_budget_and_usage(tmp_path: Path, assets: Assets, clean_redis: str) -> None:
    budget = 0.004
    engine_port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, engine_port, "--api-key", HOSTED_KEY, ctx=2048, parallel=4)
    with running(argv, tmp_path / "engine.log", f"http://127.0.0.1:{engine_port}/health"):
        body = (
            '[[routes]]\nmodel = "kimi-k3"\ntargets = [ '
            f'{{ url = "http://127.0.0.1:{engine_port}/v1", model = "kimi-k3", api_key_env = "HOSTED_KEY" }} ]\n'
            f'[prices."kimi-k3"]\ninput_cache_hit = 0.30\ninput_cache_miss = 3.00\noutput = 15.00\n'
            f'[[users]]\nname = "bob"\nbudget_usd = {budget}\nbudget_period = "day"\n'
        )
        env = {"TIERLOCAL_REDIS_URL": clean_redis, "HOSTED_KEY": HOSTED_KEY}
        with replicas(tmp_path, body, "bob", env) as (ports, configs, key):
            request = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4}

            def send(index: int) -> httpx2.Response:
                return httpx2.post(
                    f"http://127.0.0.1:{ports[index % 2]}/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {key}"}, timeout=120
                )

            served = 0
            for _ in range(20):  # bursts until the shared budget runs out
                with ThreadPoolExecutor(20) as pool:
                    statuses = [answer.status_code for answer in pool.map(send, range(20))]
                assert set(statuses) <= {200, 429}, statuses
                served += statuses.count(200)
                if statuses.count(200) == 0:
                    break
            usage = run_cli("usage", "--config", str(configs[1]), "--period", "day", "--json", env=env)
        assert usage.returncode == 0, usage.stderr
        bob = json.loads(usage.stdout)["users"]["bob"]
        assert bob["requests"] == served > 5
        assert bob["cost_usd"] <= budget
        recomputed = (bob["cached_tokens"] * 0.30 + (bob["prompt_tokens"] - bob["cached_tokens"]) * 3.00 + bob["completion_tokens"] * 15.00) / 1e6
        assert recomputed == pytest.approx(bob["cost_usd"], abs=1e-6) and recomputed <= budget
        with redis.Redis.from_url(clean_redis) as client:
            assert client.zcard("tierlocal:gateway:holds:bob") == 0  # every hold settled
        for log in ("r0.log", "r1.log"):
            assert "status=200" in (tmp_path / log).read_text()  # both replicas served


def test_rate_limits_are_shared_by_replicas(tmp_path: Path, assets: Assets, clean_redis: str) -> None:
    engine_port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, engine_port, ctx=1024, parallel=2)
    with running(argv, tmp_path / "engine.log", f"http://127.0.0.1:{engine_port}/health"):
        body = (
            f'[[routes]]\nmodel = "local"\ntargets = [ {{ url = "http://127.0.0.1:{engine_port}/v1", model = "local" }} ]\n[[users]]\nname = '
            '"carol"\nrequests_per_minute = 3\n'
        )
        env = {"TIERLOCAL_REDIS_URL": clean_redis}
        with replicas(tmp_path, body, "carol", env) as (ports, _configs, key):
            request = {"model": "local", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            statuses = []
            for index in range(4):  # alternating replicas: 3 per minute in all, not per replica
                answer = httpx2.post(
                    f"http://127.0.0.1:{ports[index % 2]}/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {key}"}, timeout=60
                )
                statuses.append(answer.status_code)
            assert statuses == [200, 200, 200, 429]
            assert 1 <= int(answer.headers["Retry-After"]) <= 60
        with redis.Redis.from_url(clean_redis) as client:
            assert client.zcard("tierlocal:gateway:limit:carol:flight") == 0  # every ticket released
            assert client.zcard("tierlocal:gateway:limit:carol:requests") == 3

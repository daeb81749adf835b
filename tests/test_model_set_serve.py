"""``tierlocal serve A B C`` and ``serve --set FILE`` with real engines: the Gemma file and two
sparse files of real shapes (Qwen3-1.7B, LFM2-1.2B; byte tokens so they take a chat) on one
endpoint, under a RAM budget that holds any two of them and not the three. The real ``openai``
client asks for each in turn; the engines' resident memory is sampled all along."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import httpx
import openai
import psutil
import pytest
from rich.console import Console

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.doc_json import assert_documented
from tests.support.engines import first_json_document, free_port, process_gone
from tests.support.gatewayrun import gateway
from tests.support.sparse_models import LFM2_1_2B, QWEN3_1_7B, write_sparse_gguf
from tierlocal.gateway.runner import served_engines
from tierlocal.report.set_page import sets_section
from tierlocal.tui.live import set_table
from tierlocal.tui.live_data import LiveFeed, LiveSample

pytestmark = pytest.mark.engines

QWEN, LFM = "qwen3-1.7b-text", "lfm2-1.2b-text"
CTX = "2048"


@dataclass
class Memory:
    """The largest resident memory seen: of every engine together, and of each engine by its model file (bytes)."""

    total: int = 0
    by_model: dict[str, int] = field(default_factory=dict)
    samples: int = 0


def _models(tmp_path: Path, gemma: Path) -> list[Path]:
    qwen = write_sparse_gguf(tmp_path / f"{QWEN}.gguf", replace(QWEN3_1_7B, text_vocab=True))
    lfm = write_sparse_gguf(tmp_path / f"{LFM}.gguf", replace(LFM2_1_2B, text_vocab=True))
    return [gemma, qwen, lfm]


def _two_of_three_ram(models: list[Path]) -> tuple[str, dict[str, int], int]:
    """A --ram that holds any two of the members and not the three (from `check`'s plan on a big
    machine), each member's host bytes by name, and the budget those bytes must stay within."""
    result = run_cli("check", *map(str, models), "--ctx", CTX, "--gpu", "none", "--ram", "64GiB", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    planned = {m["name"]: m["device_bytes"][-1] for m in plan["members"]}
    budget = sum(sorted(planned.values())[1:]) // 2**20 * 2**20 + 32 * 2**20
    assert budget < sum(planned.values()), planned
    return f"{(budget + plan['margin_bytes']) // 2**20}MiB", planned, budget


@contextmanager
def _serving(assets: Assets, *args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, object], Memory]]:
    """`tierlocal serve` of a set, ready (its --json object read), with its engines' memory sampled
    every 0.1 s until it stops; SIGTERM afterwards."""
    port = free_port()
    argv = [sys.executable, "-m", "tierlocal", "serve", *args, "--port", str(port), "--llama-server", str(assets.llama_server_cpu), "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    memory, done = Memory(), threading.Event()
    sampler = threading.Thread(target=_sample, args=(process.pid, memory, done), daemon=True)
    sampler.start()
    try:
        yield process, first_json_document(process), memory
    finally:
        done.set()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)  # its pipes closed too


def _sample(supervisor: int, memory: Memory, done: threading.Event) -> None:
    while not done.is_set():
        try:
            engines = [p for p in psutil.Process(supervisor).children(recursive=True) if p.name() == "llama-server"]
            sizes = {}
            for engine in engines:
                cmdline = engine.cmdline()
                name = Path(cmdline[cmdline.index("-m") + 1]).stem
                if name != "tierlocal-probe":  # serve's look at the binary's options, not a member
                    sizes[name] = engine.memory_info().rss
        except (psutil.Error, ValueError, IndexError):
            time.sleep(0.05)
            continue
        memory.total = max(memory.total, sum(sizes.values()))
        for name, rss in sizes.items():
            memory.by_model[name] = max(memory.by_model.get(name, 0), rss)
        memory.samples += 1
        time.sleep(0.1)


def _set(url: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{url}/set", timeout=10).json()  # type: ignore[no-any-return]


def _loads_and_unloads(url: str) -> list[tuple[str, str, str | None]]:
    return [(e["event"], e["member"], e.get("reason")) for e in _set(url)["events"] if e["event"] in ("loaded", "unloaded")]


def test_a_set_loads_each_member_on_demand_and_unloads_the_least_recently_used_within_its_plan(tmp_path: Path, assets: Assets, gemma: Path) -> None:
    models = _models(tmp_path, gemma)
    ram, planned, budget = _two_of_three_ram(models)
    with _serving(assets, *map(str, models), "--ctx", CTX, "--ram", ram) as (process, ready, memory):
        url = str(ready["url"])
        assert_documented("set-status", ready)
        assert [m["state"] for m in ready["members"]] == ["unloaded"] * 3  # type: ignore[index]
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in listed] == [gemma.stem, QWEN, LFM]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        for name in (gemma.stem, QWEN, LFM, gemma.stem):
            answer = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
            assert answer.model == name and answer.choices[0].message.content is not None
        events = _loads_and_unloads(url)
        state = _set(url)
        shown = run_cli("status", "--port", url.rsplit(":", 1)[1], "--json")
        assert shown.returncode == 0, shown.stderr
        assert_documented("set-status", json.loads(shown.stdout))
        assert [m["state"] for m in json.loads(shown.stdout)["members"]] == ["loaded", "unloaded", "loaded"]
        _shown_in_the_live_views(gemma.stem)
        assert served_engines() == (f"{url}/v1",)  # the gateway's own routes reach the set, not its members' serves
        engines = list(psutil.Process(process.pid).children(recursive=True))
        process.send_signal(signal.SIGKILL)  # the supervisor dies without a word: no engine stays
        assert all(process_gone(p.pid) for p in engines), [p.pid for p in engines if p.is_running()]
    assert events == [
        ("loaded", gemma.stem, None),
        ("loaded", QWEN, None),
        ("unloaded", gemma.stem, "memory"),  # the least recently used makes room for the third
        ("loaded", LFM, None),
        ("unloaded", QWEN, "memory"),  # now Qwen is: Gemma comes back in its place
        ("loaded", gemma.stem, None),
    ]
    assert state["counts"].get("load_failed", 0) == 0
    held = sum(1 for log in (tmp_path / "tierlocal-home" / "run").glob("set-member-*.log") if "plan held" in log.read_text())
    assert held == 4  # every load checked its own plan
    assert memory.samples > 20
    assert memory.total <= budget, (memory.total, budget)
    for name, rss in memory.by_model.items():
        planned_bytes = planned[name]
        assert rss <= planned_bytes * 1.05, (name, rss, planned_bytes)


def _shown_in_the_live_views(gemma: str) -> None:
    """The Live screen's sample and the dashboard's Live page show each member with its state."""
    feed = asyncio.run(_sample_once())
    (state,) = feed.sets
    table = Console(record=True, width=200)
    table.print(set_table(state))
    text = table.export_text()
    html = sets_section(feed.sets)
    for name, current in ((gemma, "loaded"), (QWEN, "unloaded"), (LFM, "loaded")):
        assert any(name in line and current in line for line in text.splitlines()), text
        assert f'<td>{name}</td><td>chat</td><td><span data-field="state">{current}</span>' in html, html


async def _sample_once() -> LiveSample:
    async with aiohttp.ClientSession() as session:
        return await LiveFeed().sample(session)


def test_a_pinned_member_stays_an_idle_one_goes_and_a_request_during_a_load_is_told_to_retry(tmp_path: Path, assets: Assets, gemma: Path) -> None:
    models = _models(tmp_path, gemma)
    ram, _, _ = _two_of_three_ram(models)
    set_file = tmp_path / "team.toml"
    set_file.write_text(
        "[set]\nload_wait_s = 0.5\n\n"
        f'[[model]]\nname = "chat"\nsource = "{gemma}"\npinned = true\n\n'
        f'[[model]]\nname = "qwen"\nsource = "{models[1]}"\nidle_unload_s = 2\n\n'
        f'[[model]]\nname = "lfm"\nsource = "{models[2]}"\n'
    )
    with _serving(assets, "--set", str(set_file), "--ctx", CTX, "--ram", ram) as (_process, ready, _memory):
        url = str(ready["url"])
        assert {m["name"]: m["state"] for m in ready["members"]} == {"chat": "loaded", "qwen": "unloaded", "lfm": "unloaded"}  # type: ignore[index]
        _ask_while_it_loads(url, "qwen")
        deadline = time.monotonic() + 15
        while _state_of(url, "qwen") != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _state_of(url, "qwen") == "unloaded"
        _ask_while_it_loads(url, "lfm")
        _ask_while_it_loads(url, "qwen")  # Gemma is the least recently used, but pinned: lfm makes room
        events = _loads_and_unloads(url)
        assert _state_of(url, "chat") == "loaded"
        counts = _set(url)["counts"]
    assert events == [
        ("loaded", "chat", None),
        ("loaded", "qwen", None),
        ("unloaded", "qwen", "idle"),
        ("loaded", "lfm", None),
        ("unloaded", "lfm", "memory"),
        ("loaded", "qwen", None),
    ]
    assert counts["wait_exceeded"] >= 3


def _state_of(url: str, name: str) -> str:
    return next(m["state"] for m in _set(url)["members"] if m["name"] == name)


def _ask_while_it_loads(url: str, name: str) -> None:
    """A request for ``name`` while it is not loaded: 503 model_loading with Retry-After (the set
    waits 0.5 s); once it is loaded, the same request is answered."""
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "model_loading" and int(refused.headers["Retry-After"]) >= 1
    deadline = time.monotonic() + 90
    while _state_of(url, name) != "loaded" and time.monotonic() < deadline:
        time.sleep(0.2)
    answered = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == name


def test_an_embeddings_member_answers_through_the_gateway_and_a_loading_member_spills_to_the_next_target(
    tmp_path: Path, assets: Assets, gemma: Path
) -> None:
    """The Gemma file twice — pinned for chat, pinned for embeddings — and a sparse Qwen3 on
    demand; a gateway in front: embeddings with the real openai client, and a request for Qwen
    while it loads (the set waits 0.5 s) goes to the route's next target, the chat member."""
    qwen = write_sparse_gguf(tmp_path / f"{QWEN}.gguf", replace(QWEN3_1_7B, text_vocab=True))
    set_file = tmp_path / "team.toml"
    set_file.write_text(
        "[set]\nload_wait_s = 0.5\n\n"
        f'[[model]]\nname = "chat"\nsource = "{gemma}"\npinned = true\n\n'
        f'[[model]]\nname = "embed"\nsource = "{gemma}"\nrole = "embeddings"\npinned = true\n\n'
        f'[[model]]\nname = "rank"\nsource = "{gemma}"\nrole = "rerank"\npinned = true\n\n'
        f'[[model]]\nname = "qwen"\nsource = "{qwen}"\n'
    )
    with _serving(assets, "--set", str(set_file), "--ctx", "1024") as (_process, ready, _memory):
        url = str(ready["url"])
        body = (
            f'[[routes]]\nmodel = "embed"\ntargets = [ {{ url = "{url}/v1", model = "embed" }} ]\n\n'
            f'[[routes]]\nmodel = "rank"\ntargets = [ {{ url = "{url}/v1", model = "rank" }} ]\n\n'
            f'[[routes]]\nmodel = "ask"\ntargets = [ {{ url = "{url}/v1", model = "qwen" }}, {{ url = "{url}/v1", model = "chat" }} ]\n'
        )
        (tmp_path / "gw").mkdir()
        with gateway(tmp_path / "gw", body) as gw:
            api = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0, timeout=60)
            vectors = api.embeddings.create(model="embed", input=["The cat sat.", "Stock prices fell."])
            first, second = (item.embedding for item in vectors.data)
            assert len(first) == len(second) == 640 and first != second  # Gemma 3 270M's width
            ranked = httpx.post(
                f"{gw.url}/rerank",
                json={"model": "rank", "query": "a cat", "documents": ["a cat sat", "stock prices fell", "the cat sat on a mat"]},
                headers=gw.headers(),
                timeout=60,
            )
            assert ranked.status_code == 200, ranked.text
            assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1, 2]
            answer = api.chat.completions.create(model="ask", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
            assert answer.choices[0].message.content is not None
            with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
                rows = [tuple(row) for row in db.execute("SELECT protocol, fallback_reason FROM usage ORDER BY id")]
        assert rows == [("embeddings", None), ("rerank", None), ("chat_completions", "unavailable")]  # the chat spilled
        counts = _set(url)["counts"]
        assert counts["wait_exceeded"] == 1
        embed_plan = next(m for m in ready["members"] if m["name"] == "embed")  # type: ignore[union-attr]
        chat_plan = next(m for m in ready["members"] if m["name"] == "chat")  # type: ignore[union-attr]
        # An embeddings server outputs every token of a micro-batch: llama.cpp reserved a 514.5 MiB
        # compute buffer for Gemma 3 270M with --embeddings against 21.8 MiB for chat (this build,
        # -c 2048 -np 4, 2026-12-06); the plan counts it, and the member's serve found it held.
        assert embed_plan["planned_bytes"][-1] - chat_plan["planned_bytes"][-1] > 450 * 2**20
        embed_log = next((tmp_path / "tierlocal-home" / "run").glob("set-member-embed-*.log")).read_text()
        assert "answered a first short embeddings request" in embed_log and "plan held" in embed_log


def test_a_member_that_fails_to_load_is_refused_and_the_others_go_on_serving(tmp_path: Path, assets: Assets, gemma: Path) -> None:
    """A member whose file is cut short after the set was planned (a download replaced under
    it): its serve refuses the file, the request is answered 503 model_unavailable with why, and
    the pinned member goes on answering."""
    broken = write_sparse_gguf(tmp_path / "broken.gguf", replace(QWEN3_1_7B, text_vocab=True))
    set_file = tmp_path / "team.toml"
    set_file.write_text(f'[[model]]\nname = "chat"\nsource = "{gemma}"\npinned = true\n\n[[model]]\nname = "broken"\nsource = "{broken}"\n')
    with _serving(assets, "--set", str(set_file), "--ctx", CTX) as (_process, ready, _memory):
        url = str(ready["url"])
        with broken.open("r+b") as handle:
            handle.truncate(broken.stat().st_size // 2)
        body = {"model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        answered = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "chat"}, timeout=60)
        state = _set(url)
        # The pinned member's engine dies: its serve exits, and the set loads it again without being asked.
        engine = next(m["engine_pid"] for m in state["members"] if m["name"] == "chat")
        os.kill(engine, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (_state_of(url, "chat") == "loaded" and _set(url)["counts"].get("exited")):
            time.sleep(0.2)
        again = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "chat"}, timeout=60)
        after = _set(url)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "model_unavailable", refused.text
    assert "broken did not load" in refused.json()["error"]["message"] and "runs past the end of the file" in refused.json()["error"]["message"]
    assert answered.status_code == 200
    assert state["counts"]["load_failed"] == 1
    assert {m["name"]: m["state"] for m in state["members"]} == {"chat": "loaded", "broken": "unloaded"}
    assert again.status_code == 200 and after["counts"]["exited"] == 1
    assert next(m["loads"] for m in after["members"] if m["name"] == "chat") == 2

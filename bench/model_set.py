"""A model set served on this machine (issue 50): three members whose three do not fit the RAM
budget and any two do — the real Gemma 3 270M and sparse GGUFs of Qwen3-1.7B and LFM2-1.2B
(byte tokens, so they take a chat) — asked for in turn on the one endpoint. Prints the loads
and unloads in order, and each engine's largest resident memory (sampled every 0.1 s from
/proc) beside the bytes the joint plan counts for it, with the ratio; and the most all the
engines held together against the budget.

    .venv/bin/python -m bench.model_set [--json]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil

from tests.support.assets import load_assets
from tests.support.engines import first_json_document, free_port
from tests.support.sparse_models import LFM2_1_2B, QWEN3_1_7B, write_sparse_gguf

MIB = 2**20
CTX = "2048"
ORDER = ("gemma-3-270m-q4_k_m", "qwen3-1.7b-text", "lfm2-1.2b-text", "gemma-3-270m-q4_k_m", "qwen3-1.7b-text")


def main() -> None:
    assets = load_assets()
    assert assets is not None, "run tests/assets/prepare.py first"
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        models = [
            assets.gemma_gguf,
            write_sparse_gguf(home / "qwen3-1.7b-text.gguf", replace(QWEN3_1_7B, text_vocab=True)),
            write_sparse_gguf(home / "lfm2-1.2b-text.gguf", replace(LFM2_1_2B, text_vocab=True)),
        ]
        env = {**os.environ, "TIERLOCAL_HOME": str(home / "tl")}
        plan = json.loads(_tierlocal(env, "check", *map(str, models), "--ctx", CTX, "--gpu", "none", "--ram", "64GiB", "--json"))
        planned = {m["name"]: m["device_bytes"][-1] for m in plan["members"]}
        budget = sum(sorted(planned.values())[1:]) // MIB * MIB + 32 * MIB
        ram = f"{(budget + plan['margin_bytes']) // MIB}MiB"
        argv = [sys.executable, "-m", "tierlocal", "serve", *map(str, models), "--ctx", CTX, "--ram", ram, "--port", str(free_port())]
        argv += ["--llama-server", str(assets.llama_server_cpu), "--json"]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        peaks: dict[str, int] = {}
        total = [0]
        done = threading.Event()
        threading.Thread(target=_sample, args=(process.pid, peaks, total, done), daemon=True).start()
        try:
            url = first_json_document(process)["url"]
            seconds = []
            for name in ORDER:
                started = time.monotonic()
                body = {"model": name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
                assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
                seconds.append(time.monotonic() - started)
            events = [e for e in httpx.get(f"{url}/set").json()["events"] if e["event"] in ("loaded", "unloaded")]
        finally:
            done.set()
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
    _report(planned, peaks, total[0], budget, events, seconds, "--json" in sys.argv)


def _tierlocal(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "tierlocal", *args], capture_output=True, text=True, env=env, check=True).stdout


def _sample(supervisor: int, peaks: dict[str, int], total: list[int], done: threading.Event) -> None:
    while not done.is_set():
        try:
            sizes = {}
            for engine in psutil.Process(supervisor).children(recursive=True):
                if engine.name() == "llama-server":
                    cmdline = engine.cmdline()
                    name = Path(cmdline[cmdline.index("-m") + 1]).stem
                    if name != "tierlocal-probe":
                        sizes[name] = engine.memory_info().rss
        except (psutil.Error, ValueError, IndexError):
            continue
        total[0] = max(total[0], sum(sizes.values()))
        for name, rss in sizes.items():
            peaks[name] = max(peaks.get(name, 0), rss)
        time.sleep(0.1)


def _report(planned: dict[str, int], peaks: dict[str, int], total: int, budget: int, events: list[dict], seconds: list[float], as_json: bool) -> None:  # type: ignore[type-arg]
    if as_json:
        print(json.dumps({"planned": planned, "peaks": peaks, "total": total, "budget": budget, "events": events, "request_s": seconds}, indent=2))
        return
    print(f"{'member':<22} {'planned MiB':>12} {'largest RSS MiB':>16} {'RSS/planned':>12}")
    for name, bytes_ in planned.items():
        peak = peaks.get(name, 0)
        print(f"{name:<22} {bytes_ / MIB:>12.0f} {peak / MIB:>16.0f} {peak / bytes_:>12.2f}")
    print(f"{'all engines at once':<22} {budget / MIB:>12.0f} {total / MIB:>16.0f} {total / budget:>12.2f}   (budget: free less margin)")
    print("\nrequests in turn:", ", ".join(f"{n} {s:.1f} s" for n, s in zip(ORDER, seconds, strict=True)))
    print("loads and unloads:")
    for event in events:
        extra = f"{event.get('seconds')} s" if event["event"] == "loaded" else f"{event.get('reason')}, for {event.get('for_member', '-')}"
        print(f"  {event['event']:<9} {event['member']:<22} {extra}")


if __name__ == "__main__":
    main()

"""Embedding servers on this machine (issue 50): what the plan counts against what the engine holds.

llama-server with --embeddings reserves one output row per sequence at load (the load log's
output buffer) and, at the first batch whose every token is an output, reallocates to one row of
n_vocab logits and n_embd floats per token: hundreds of MB that the load log never shows. This
serves the real Gemma 3 270M (``--role embeddings``) and a sparse GGUF of the catalog's
Qwen3-Embedding-0.6B shape (its header names last-token pooling, so it serves embeddings unasked)
with ``tierlocal serve``, sends inputs of its own per request (a shared prompt would be cached) of
about a micro-batch, and prints the engine's largest resident memory (sampled every 0.05 s from
/proc) beside the plan's ``in use`` (mmap), with the ratio — with and without the output
buffer's growth.

    .venv/bin/python -m bench.embeddings_memory [--json]
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
import tomllib
from pathlib import Path

import httpx
import psutil

from tests.support.assets import load_assets
from tests.support.catalog_headers import MODELS, shape_arch
from tests.support.engines import first_json_document, free_port
from tests.support.sparse_models import write_sparse_gguf

MIB = 2**20
CTX = "2048"
REQUESTS = 3


def _qwen3_embedding(directory: Path) -> Path:
    family = next(f for f in tomllib.loads(MODELS.read_text())["family"] if f["name"] == "qwen3-embedding-0.6b")
    arch = shape_arch("qwen3-embedding-0.6b-text", {**family["shape"], "text_vocab": True})
    return write_sparse_gguf(directory / "qwen3-embedding-0.6b-text.gguf", arch)


def _peak(pid: int, peak: list[int], done: threading.Event) -> None:
    while not done.is_set():
        try:
            peak[0] = max(peak[0], psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.05)


def _measure(model: Path, home: Path, llama_server: Path, role: tuple[str, ...]) -> dict[str, object]:
    env = {**os.environ, "TIERLOCAL_HOME": str(home)}
    argv = [sys.executable, "-m", "tierlocal", "serve", str(model), "--ctx", CTX, *role, "--port", str(free_port())]
    argv += ["--llama-server", str(llama_server), "--threads", "2", "--json"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        ready = first_json_document(process)
        engine = int(ready["engine_pid"])
        loaded = psutil.Process(engine).memory_info().rss
        peak, done = [loaded], threading.Event()
        threading.Thread(target=_peak, args=(engine, peak, done), daemon=True).start()
        tokens = []
        for n in range(REQUESTS):  # about 400-500 tokens each, none shared with another request
            text = " ".join(f"item {n}-{i} of list {n * 7 + i % 5}" for i in range(46))
            answer = httpx.post(f"{ready['url']}/v1/embeddings", json={"input": text}, timeout=300).json()
            assert "usage" in answer, answer
            tokens.append(answer["usage"]["prompt_tokens"])
        time.sleep(0.3)
        done.set()
        mmap = next(m for m in ready["plan"]["host_memory"]["modes"] if m["load_mode"] == "mmap")
        grows = int(mmap["output_grows_by_bytes"])
        return {
            "model": model.name,
            "tokens_per_request": tokens,
            "rss_after_load_mib": round(loaded / MIB, 1),
            "rss_peak_mib": round(peak[0] / MIB, 1),
            "planned_in_use_mib": round(mmap["in_use_bytes"] / MIB, 1),
            "planned_output_growth_mib": round(grows / MIB, 1),
            "peak_over_plan": round(peak[0] / mmap["in_use_bytes"], 3),
            "peak_over_plan_without_growth": round(peak[0] / (mmap["in_use_bytes"] - grows), 3),
        }
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def main() -> None:
    assets = load_assets()
    assert assets is not None, "run tests/assets/prepare.py first"
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        rows.append(_measure(assets.gemma_gguf, home, assets.llama_server_cpu, ("--role", "embeddings")))
        rows.append(_measure(_qwen3_embedding(home), home, assets.llama_server_cpu, ()))
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
        return
    print(f"llama-server --embeddings, {CTX} tokens of context, 1 slot, {REQUESTS} inputs of their own each")
    print(f"{'model':34} {'tokens':>12} {'RSS load':>9} {'RSS peak':>9} {'plan in use':>11} {'of it growth':>12} {'peak/plan':>9} {'w/o growth':>10}")
    for row in rows:
        tokens = "/".join(map(str, row["tokens_per_request"]))  # type: ignore[call-overload]
        print(f"{row['model']:34} {tokens:>12} {row['rss_after_load_mib']:>9} {row['rss_peak_mib']:>9} ", end="")
        print(f"{row['planned_in_use_mib']:>11} {row['planned_output_growth_mib']:>12} ", end="")
        print(f"{row['peak_over_plan']:>9} {row['peak_over_plan_without_growth']:>10}")


if __name__ == "__main__":
    main()

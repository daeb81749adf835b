"""The gateway's added latency and throughput against calling the upstream directly, side by
side in one run, and its memory over a soak.

A fast stand-in upstream (an aiohttp server answering chat completions at once: a JSON body, or
a stream of 8 content chunks, a usage chunk and [DONE]) runs in its own process; `tierlocal
gateway` runs in front of it as a user runs it (with usage rows written to SQLite for every
request). A load generator sends streaming requests at 1, 50 and 200 concurrent streams,
alternating direct and through-gateway rounds, and prints p50/p99 of the time to the end of
each stream, the added latency (gateway − direct) and requests/s. Then it soaks the gateway at
50 streams for --soak-s seconds, sampling its RSS. With --litellm PATH (a LiteLLM proxy binary,
installed apart: it is not a tierlocal dependency) the same load runs through LiteLLM too.

    .venv/bin/python -m bench.gateway_overhead [--requests 2000] [--soak-s 600] [--litellm /tmp/llvenv/bin/litellm]
    .venv/bin/python -m bench.gateway_overhead --wrk [--workers 2] [--litellm …]   # bench/gateway_wrk.py

``--wrk`` runs the other measurement instead: wrk against a static nginx upstream, non-streaming,
with a budgeted user (bench/gateway_wrk.py).

Everything shares this machine's cores, so absolute times drift; the ratios are the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

UPSTREAM = r"""
import json, sys
from aiohttp import web
CHUNK = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench",
         "choices": [{"index": 0, "delta": {"content": "token"}, "finish_reason": None}]}
USAGE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "bench", "choices": [],
         "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}}
BODY = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "token " * 8}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}}
async def chat(request):
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(BODY)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(8):
        await response.write(b"data: " + json.dumps(CHUNK).encode() + b"\n\n")
    if (body.get("stream_options") or {}).get("include_usage"):
        await response.write(b"data: " + json.dumps(USAGE).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response
async def health(request):
    return web.json_response({"status": "ok"})
async def props(request):
    return web.json_response({"total_slots": 100000})
async def models(request):
    return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/health", health)
app.router.add_get("/props", props)
app.router.add_get("/v1/models", models)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None, backlog=2048)
"""

REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "stream": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, headers: dict[str, str] | None = None, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s} s")


async def one(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=REQUEST, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(await response.text())[:200]}")
        body = await response.read()
    if not body.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError(f"{url}: the stream did not end with [DONE]")
    return time.perf_counter() - started


async def load(url: str, headers: dict[str, str], concurrency: int, total: int) -> tuple[list[float], float]:
    """Latencies of ``total`` streaming requests at ``concurrency``, and requests/s."""
    latencies: list[float] = []
    queue = iter(range(total))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def worker() -> None:
            for _ in queue:
                latencies.append(await one(session, url, headers))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return latencies, total / elapsed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def start_gateway(directory: Path, upstream_port: int) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    config = directory / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nstate_dir = "{directory / "state"}"\n'
        f'[[routes]]\nmodel = "bench"\ntargets = [ {{ url = "http://127.0.0.1:{upstream_port}/v1", model = "bench" }} ]\n'
        '[[users]]\nname = "bench"\n'
    )
    added = subprocess.run(
        [sys.executable, "-m", "tierlocal", "gateway", "keys", "add", "bench", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    key = json.loads(added.stdout)["key"]
    log = (directory / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tierlocal", "gateway", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
    )
    wait_for(f"http://127.0.0.1:{port}/health")
    return process, f"http://127.0.0.1:{port}/v1/chat/completions", key


def start_litellm(binary: str, directory: Path, upstream_port: int) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    config = directory / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n"
        f"      model: openai/bench\n      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: none\n"
        "general_settings:\n  master_key: sk-bench\nlitellm_settings:\n  num_retries: 0\n"
    )
    log = (directory / "litellm.log").open("wb")
    process = subprocess.Popen(
        [binary, "--config", str(config), "--port", str(port), "--host", "127.0.0.1", "--num_workers", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=directory,
    )
    wait_for(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=300)
    return process, f"http://127.0.0.1:{port}/v1/chat/completions", "sk-bench"


def main() -> None:
    if "--wrk" in sys.argv[1:]:
        from bench import gateway_wrk

        sys.argv = [arg for arg in sys.argv if arg != "--wrk"]
        gateway_wrk.main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per round at 50 and 200 streams (a tenth at 1)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per concurrency")
    parser.add_argument("--soak-s", type=float, default=600, help="seconds of soak at 50 streams while sampling RSS")
    parser.add_argument("--litellm", help="a LiteLLM proxy binary to measure side by side")
    args = parser.parse_args()

    upstream_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(upstream_port)])
    processes = [upstream]
    try:
        wait_for(f"http://127.0.0.1:{upstream_port}/health")
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            gateway, gateway_url, key = start_gateway(directory, upstream_port)
            processes.append(gateway)
            targets = {
                "direct": (f"http://127.0.0.1:{upstream_port}/v1/chat/completions", {}),
                "tierlocal": (gateway_url, {"Authorization": f"Bearer {key}"}),
            }
            if args.litellm:
                litellm, litellm_url, litellm_key = start_litellm(args.litellm, directory, upstream_port)
                processes.append(litellm)
                targets["litellm"] = (litellm_url, {"Authorization": f"Bearer {litellm_key}"})
            for _name, (url, headers) in targets.items():
                asyncio.run(load(url, headers, 4, 40))  # warm up connections and code paths
            print(f"{'streams':>7} {'path':>9} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10} {'req/s':>8} {'req/s ratio':>11}")
            for concurrency in (1, 50, 200):
                total = max(args.requests // 10, 100) if concurrency == 1 else args.requests
                results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in targets}
                for _ in range(args.rounds):
                    for name, (url, headers) in targets.items():
                        latencies, rate = asyncio.run(load(url, headers, concurrency, total))
                        results[name][0].extend(latencies)
                        results[name][1].append(rate)
                direct_p50 = percentile(results["direct"][0], 0.5)
                direct_p99 = percentile(results["direct"][0], 0.99)
                direct_rate = statistics.median(results["direct"][1])
                for name, (latencies, rates) in results.items():
                    p50, p99, rate = percentile(latencies, 0.5), percentile(latencies, 0.99), statistics.median(rates)
                    added = "" if name == "direct" else f"{(p50 - direct_p50) * 1000:>10.2f} {(p99 - direct_p99) * 1000:>10.2f}"
                    print(f"{concurrency:>7} {name:>9} {p50 * 1000:>8.2f} {p99 * 1000:>8.2f} {added:>21} {rate:>8.0f} {rate / direct_rate:>11.2f}")
            if args.soak_s > 0:
                soak(gateway, gateway_url, {"Authorization": f"Bearer {key}"}, args.soak_s)
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def soak(gateway: subprocess.Popen[bytes], url: str, headers: dict[str, str], seconds: float) -> None:
    """Run 50 streams for ``seconds`` and print the gateway's RSS every tenth of the way."""
    process = psutil.Process(gateway.pid)
    samples: list[tuple[float, float, int]] = []

    async def run() -> None:
        deadline = time.monotonic() + seconds
        done = 0
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def worker() -> None:
                nonlocal done
                while time.monotonic() < deadline:
                    await one(session, url, headers)
                    done += 1

            async def sampler() -> None:
                started = time.monotonic()
                while time.monotonic() < deadline:
                    samples.append((time.monotonic() - started, process.memory_info().rss / 2**20, done))
                    await asyncio.sleep(seconds / 10)

            await asyncio.gather(sampler(), *(worker() for _ in range(50)))
        samples.append((seconds, process.memory_info().rss / 2**20, done))

    asyncio.run(run())
    print(f"\nsoak: 50 streams for {seconds:.0f} s through the gateway")
    print(f"{'t s':>6} {'RSS MiB':>8} {'requests':>9}")
    for moment, rss, count in samples:
        print(f"{moment:>6.0f} {rss:>8.1f} {count:>9}")
    after_warmup = [rss for moment, rss, _ in samples if moment >= seconds / 10]
    if after_warmup:
        print(
            f"RSS growth after the first tenth: {after_warmup[-1] - after_warmup[0]:+.1f} MiB "
            f"({(after_warmup[-1] / after_warmup[0] - 1) * 100:+.1f}%)"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""The gateway under wrk: non-streaming chat completions against a static nginx upstream, at 1,
50 and 200 connections, directly and through `tierlocal gateway` (a budgeted user: every request
reserved, settled and written to SQLite), and through LiteLLM's proxy when given one — in one run,
on this machine's shared cores, so the ratios are the figure.

    .venv/bin/python -m bench.gateway_wrk [--seconds 10] [--workers N] [--litellm /tmp/llvenv/bin/litellm]

Needs wrk and nginx (Debian's packages); neither is a tierlocal dependency. LiteLLM runs with as
many workers as the gateway (``--num_workers``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "token " * 8}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
}
REQUEST = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
CONCURRENCY = (1, 50, 200)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s} s")


def start_nginx(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """nginx answering every chat completion with one fixed JSON body."""
    port = free_port()
    body = json.dumps(BODY).replace("'", "\\'")
    config = directory / "nginx.conf"
    config.write_text(
        f"worker_processes 1; pid {directory}/nginx.pid; error_log {directory}/nginx-error.log; daemon off;\n"
        "events { worker_connections 8192; }\n"
        f"http {{ access_log off; client_body_temp_path {directory}/body;\n"
        f"  server {{ listen 127.0.0.1:{port}; location /v1/chat/completions {{ default_type application/json; return 200 '{body}'; }} }} }}\n"
    )
    process = subprocess.Popen(["nginx", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(port)
    return process, port


def start_gateway(directory: Path, upstream: int, workers: int | None) -> tuple[subprocess.Popen[bytes], int, str]:
    """tierlocal gateway with one budgeted user on a priced hosted route (reserve + settle +
    a usage row per request); returns the process, its port and the user's key."""
    port = free_port()
    config = directory / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nstate_dir = "{directory / "state"}"\n'
        '[[routes]]\nmodel = "bench"\ntargets = [ '
        f'{{ url = "http://127.0.0.1:{upstream}/v1", model = "bench", api_key_env = "BENCH_UPSTREAM_KEY" }} ]\n'
        '[prices."bench"]\ninput_cache_hit = 0.3\ninput_cache_miss = 3.0\noutput = 15.0\n'
        '[[users]]\nname = "alice"\nbudget_usd = 1000000.0\nbudget_period = "month"\n'
    )
    added = subprocess.run(
        [sys.executable, "-m", "tierlocal", "gateway", "keys", "add", "alice", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    key = json.loads(added.stdout)["key"]
    argv = [sys.executable, "-m", "tierlocal", "gateway", "--config", str(config)]
    argv += ["--workers", str(workers)] if workers else []
    env = {**os.environ, "BENCH_UPSTREAM_KEY": "sk-bench"}
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(directory / "gateway.log").open("w"), env=env, cwd=ROOT)
    wait_for(port)
    return process, port, key


def start_litellm(binary: str, directory: Path, upstream: int, workers: int) -> tuple[subprocess.Popen[bytes], int, str]:
    """LiteLLM's proxy on the same upstream, with a master key (it refuses to start without
    one) that the load sends; no database."""
    port = free_port()
    master_key = "sk-" + os.urandom(16).hex()
    config = directory / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n"
        f"      model: openai/bench\n      api_base: http://127.0.0.1:{upstream}/v1\n      api_key: sk-bench\n"
        f"general_settings:\n  master_key: {master_key}\n"
    )
    argv = [binary, "--config", str(config), "--port", str(port), "--host", "127.0.0.1", "--num_workers", str(workers)]
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=(directory / "litellm.log").open("w"), env={**os.environ, "LITELLM_LOG": "ERROR"}
    )
    wait_for(port, timeout_s=180)
    return process, port, master_key


def wrk(port: int, connections: int, seconds: int, key: str | None, directory: Path) -> dict[str, float]:
    """requests/s and p50/p99 (ms) from one wrk run of non-streaming POSTs."""
    script = directory / f"post-{port}.lua"
    headers = "".join(
        f'wrk.headers["{name}"] = "{value}"\n'
        for name, value in {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}.items()
    )
    script.write_text(f"wrk.method = 'POST'\nwrk.body = '{json.dumps(REQUEST)}'\n{headers}")
    threads = 1 if connections < 50 else 2
    done = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True,
        text=True,
        check=True,
    )
    text = done.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors += int(non_2xx.group(1)) if non_2xx else 0
    return {"rps": rate, "p50_ms": _ms(text, "50%"), "p99_ms": _ms(text, "99%"), "errors": errors}


def _ms(text: str, label: str) -> float:
    value, unit = re.search(rf"{re.escape(label)}\s+([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=None, help="tierlocal gateway --workers (default: the gateway's own default)")
    parser.add_argument("--litellm", help="a LiteLLM proxy binary, installed apart")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: apt-get install wrk nginx")
    directory = Path(tempfile.mkdtemp(prefix="tierlocal-wrk-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        nginx, upstream = start_nginx(directory)
        processes.append(nginx)
        gateway, gateway_port, key = start_gateway(directory, upstream, args.workers)
        processes.append(gateway)
        targets = {"direct": (upstream, None), "tierlocal": (gateway_port, key)}
        if args.litellm:
            litellm, litellm_port, master_key = start_litellm(args.litellm, directory, upstream, args.workers or 1)
            processes.append(litellm)
            targets["litellm"] = (litellm_port, master_key)
        for port, token in targets.values():  # warm up: connections, caches, the first rows
            wrk(port, 10, 2, token, directory)
        results = {name: {c: wrk(port, c, args.seconds, token, directory) for c in CONCURRENCY} for name, (port, token) in targets.items()}
    finally:
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'clients':>7}  " + "  ".join(f"{name:>40}" for name in results) + "   (ms; errors: wrk's socket errors and timeouts, non-2xx)")
    for c in CONCURRENCY:
        cells = (
            f"{r[c]['rps']:>9,.0f} req/s p50 {r[c]['p50_ms']:7.2f} p99 {r[c]['p99_ms']:7.2f} err {r[c]['errors']:>4.0f}" for r in results.values()
        )
        print(f"{c:>7}  " + "  ".join(cells))
    ours = results["tierlocal"]
    direct = results["direct"][1]
    print(f"added at 1 client: p50 {ours[1]['p50_ms'] - direct['p50_ms']:.2f} ms, p99 {ours[1]['p99_ms'] - direct['p99_ms']:.2f} ms")
    print(f"50 → 200 clients: {ours[200]['rps'] / ours[50]['rps'] - 1:+.1%} requests/s")
    if "litellm" in results:
        print("tierlocal ÷ LiteLLM requests/s: " + ", ".join(f"{c}: {ours[c]['rps'] / results['litellm'][c]['rps']:.1f}×" for c in CONCURRENCY))


if __name__ == "__main__":
    main()

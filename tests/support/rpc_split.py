"""Several devices without GPUs: llama.cpp's RPC backend. Two (or more) ``ggml-rpc-server``
processes on loopback are devices to a llama-server started with ``--rpc``; it splits a model
across them by layer exactly as across GPUs, and its load log reports each device's weights,
KV cache and compute buffer. The plan for the same split (``tierlocal check --gpu N×SIZE``)
is compared with those buffers.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tierlocal.engines.loadlog import LoadReport, parse_load_log

__all__ = ["rpc_servers", "load_split", "SplitLoad"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def rpc_servers(binary: Path, count: int) -> Iterator[list[str]]:
    """``count`` ggml-rpc-server processes on loopback; yields their ``host:port`` endpoints."""
    endpoints, processes = [], []
    try:
        for _ in range(count):
            port = _free_port()
            processes.append(
                subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            endpoints.append(f"127.0.0.1:{port}")
        for endpoint in endpoints:
            host, port = endpoint.split(":")
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ggml-rpc-server at {endpoint} did not listen within 30 s")
                time.sleep(0.1)
        yield endpoints
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class SplitLoad:
    """A finished load: the report and, per RPC device in order, its buffers (bytes)."""

    report: LoadReport
    devices: list[dict[str, int]]
    host: dict[str, int]


def load_split(llama_server: Path, model: Path, endpoints: Sequence[str], planned_args: Sequence[str], log: Path, timeout: float = 300) -> SplitLoad:
    """Start llama-server on ``model`` with the RPC devices and the planned options (``-c``,
    ``-np``, ``-ngl``, ``-ts`` …), wait until it has loaded (or failed), stop it, and read the
    per-device buffers from its log."""
    argv = [str(llama_server), "-m", str(model), "--rpc", ",".join(endpoints), *planned_args, "--fit", "off", "-lv", "4", "--port", str(_free_port())]
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                if "compute buffer size" in log.read_text() and "sched_reserve: reserve took" in log.read_text():
                    break
                time.sleep(0.2)
        finally:
            process.kill()
            process.wait(timeout=30)
    report = parse_load_log(log.read_text())
    devices = []
    for endpoint in endpoints:
        name = next(name for name in report.buffers if name.endswith(f"[{endpoint}]"))
        sizes = report.buffers[name]
        devices.append({"weights": sizes.weights, "kv": sizes.kv + sizes.recurrent, "compute": sizes.compute})
    host = report.host_bytes()
    return SplitLoad(report, devices, {"weights": host.weights, "kv": host.kv + host.recurrent, "compute": host.compute})

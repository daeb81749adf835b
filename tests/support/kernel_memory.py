"""What the kernel says a real llama-server holds: start the CPU build on a model with a load
mode, wait until it answers, send one short completion, and read /proc/PID/status (VmHWM,
RssAnon, RssFile, VmLck) before stopping it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx2

from tests.support.engines import free_port, llama_server_argv, started

__all__ = ["KernelMemory", "measure_load"]


@dataclass(frozen=True)
class KernelMemory:
    """Bytes, as /proc/PID/status reports them after the load and one short request."""

    peak_bytes: int  # VmHWM
    anonymous_bytes: int  # RssAnon
    file_bytes: int  # RssFile (the model's mapped pages and the engine's own binary)
    locked_bytes: int  # VmLck
    log: str


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "RssAnon", "RssFile", "VmLck"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def measure_load(binary: Path, model: Path, directory: Path, *, ctx: int, load_mode: str) -> KernelMemory:
    """Load ``model`` with ``--load-mode load_mode`` and one slot of ``ctx`` tokens."""
    port = free_port()
    log = directory / f"{model.stem}-{load_mode}-{ctx}.log"
    argv = llama_server_argv(binary, model, port, "--load-mode", load_mode, ctx=ctx, parallel=1)
    with started(argv, log, f"http://127.0.0.1:{port}/health") as process:
        httpx2.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hello there, how are you", "n_predict": 4}, timeout=600)
        status = _status(process.pid)
    return KernelMemory(status["VmHWM"], status["RssAnon"], status["RssFile"], status.get("VmLck", 0), log.read_text(errors="replace"))

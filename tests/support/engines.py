"""Running the real engines in tests: free ports, servers with their logs in files, readiness."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest

_LOAD_TIMEOUT_S = 600
#: Mesa 22.3.6 llvmpipe's maxStorageBufferRange (vulkaninfo): llama.cpp's Vulkan backend
#: keeps any weight larger than this on the CPU.
LLVMPIPE_MAX_TENSOR_BYTES = 134_217_728


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTaken(Exception):
    """The server could not bind: another process holds the port :func:`free_port` gave."""


@contextmanager
def started(
    argv: list[str],
    log_path: Path,
    ready_url: str,
    env: dict[str, str] | None = None,
    timeout_s: float = _LOAD_TIMEOUT_S,
    is_ours: Callable[[httpx2.Response], bool] = lambda _response: True,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server with its output going to a file (never a pipe that can fill), wait until
    ``ready_url`` answers 200 with what ``is_ours`` recognises (a port another test's server took
    meanwhile answers too), stop it gracefully afterwards (unless the test already did).

    Raises:
        PortTaken: the server exited saying its address is in use.
    """
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                if "in use" in log_path.read_text().lower():
                    raise PortTaken(f"{argv[0]} could not bind {ready_url}:\n{log_path.read_text()[-3000:]}")
                pytest.fail(f"{argv[0]} exited with {process.returncode} while loading:\n{log_path.read_text()[-3000:]}")
            try:
                response = httpx2.get(ready_url, timeout=2)
                if response.status_code == 200 and is_ours(response):
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{argv[0]} not ready after {timeout_s} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running(argv: list[str], log_path: Path, ready_url: str, env: dict[str, str] | None = None) -> Iterator[Path]:
    """:func:`started`, yielding the log's path."""
    with started(argv, log_path, ready_url, env):
        yield log_path


#: CPU threads of an engine a test starts beside other tests (``-t`` / serve's ``--threads``;
#: tests/conftest.py sets ``LLAMA_ARG_THREADS`` to the same for engines started without one).
#: llama.cpp's threads wait for each other spinning: four 2-thread engines on 2 cores took 55 s
#: of CPU and 28 s for what four 1-thread ones did in 13 s and 7 s.
ENGINE_THREADS = "1"


def own_home(path: Path) -> dict[str, str]:
    """``HOME`` for an Ollama of its own (its keys live in ``~/.ollama``), keeping the user's
    cache directory: a tierlocal run in that environment finds its planning cache there instead
    of building it again (about 2.5 s of CPU each)."""
    return {"HOME": str(path), "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")}


def llama_server_argv(binary: Path, model: Path, port: int, *extra: str, ctx: int = 1024, parallel: int | None = 1) -> list[str]:
    """llama-server on loopback with trace-level logs (-lv 4: offload and buffer lines);
    ``parallel=None`` leaves -np at llama-server's auto default."""
    slots = [] if parallel is None else ["-np", str(parallel)]
    return [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx),
        *slots,
        "-t",
        ENGINE_THREADS,
        "-lv",
        "4",
        *extra,
    ]


def process_gone(pid: int, timeout_s: float = 20) -> bool:
    """Whether ``pid`` has exited (a zombie counts as exited) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def first_json_document(process: subprocess.Popen[str]) -> dict:  # type: ignore[type-arg]
    """The first JSON object a still-running `tierlocal … --json` prints (indented, ending in a
    line "}"); fails the test with its stderr when it prints none."""
    assert process.stdout is not None
    text = ""
    for line in process.stdout:
        text += line
        if line.startswith("}"):
            return json.loads(text)  # type: ignore[no-any-return]
    process.kill()
    pytest.fail(f"no JSON on stdout; stderr:\n{process.communicate()[1][-3000:]}")

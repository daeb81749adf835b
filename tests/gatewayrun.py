"""Running `tierlocal gateway` in tests as a user runs it: a TOML file, a key made with the CLI,
the server as a child process with its log in a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from conftest import REPO_ROOT, run_cli
from engines import free_port


@dataclass
class RunningGateway:
    url: str  # the OpenAI base URL, …/v1
    key: str  # a gateway key for the first user
    config: Path
    state_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def write_config(directory: Path, body: str, *, server: str = "") -> tuple[Path, int]:
    """A config file with a [server] section (plus ``server`` lines) on a free port and its
    state in ``directory``."""
    port = free_port()
    path = directory / "gateway.toml"
    path.write_text(f'[server]\nhost = "127.0.0.1"\nport = {port}\nstate_dir = "{directory / "state"}"\n{server}\n\n{body}')
    return path, port


def add_key(config: Path, user: str) -> str:
    result = run_cli("gateway", "keys", "add", user, "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["key"])


@contextmanager
def gateway(directory: Path, body: str, *, user: str | None = "alice", env: dict[str, str] | None = None, server: str = "") -> Iterator[RunningGateway]:
    """Write the config, make a key for ``user`` (None: none), start the gateway, wait for
    /health, stop it with SIGTERM afterwards."""
    config, port = write_config(directory, body, server=server)
    key = add_key(config, user) if user else ""
    log = directory / "gateway.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "tierlocal", "gateway", "--config", str(config)],
            stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=REPO_ROOT,
        )  # fmt: skip
    running = RunningGateway(f"http://127.0.0.1:{port}/v1", key, config, directory / "state", log, process)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"the gateway exited with {process.returncode}:\n{running.log_text()[-3000:]}")
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway did not answer /health:\n{running.log_text()[-3000:]}")
            time.sleep(0.1)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

"""Running `tierlocal gateway` in tests as a user runs it: a TOML file, a key made with the CLI,
the server as a child process with its log in a file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import PortTaken, free_port, llama_server_argv, running, started


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
def gateway(
    directory: Path, body: str, *, user: str | None = "alice", env: dict[str, str] | None = None, server: str = "", workers: int = 1
) -> Iterator[RunningGateway]:
    """Write the config, make a key for ``user`` (None: none), start the gateway (with
    ``workers`` processes), wait for /health, stop it with SIGTERM afterwards."""
    config, port = write_config(directory, body, server=server)
    key = add_key(config, user) if user else ""
    log = directory / "gateway.log"
    argv = [sys.executable, "-m", "tierlocal", "gateway", "--config", str(config), "--workers", str(workers)]
    environment = {**(env or {}), "PYTHONPATH": str(REPO_ROOT)}
    for attempt in range(3):
        # The port free_port gave may be taken by another test's server before the gateway binds
        # it (CI once read that llama-server's /health and /v1/models as the gateway's): only the
        # gateway's own /health (its routes) is ready, and a taken port is tried again with another.
        try:
            with started(argv, log, f"http://127.0.0.1:{port}/health", environment, timeout_s=60, is_ours=_routes_listed) as process:
                yield RunningGateway(f"http://127.0.0.1:{port}/v1", key, config, directory / "state", log, process)
            return
        except PortTaken:
            if attempt == 2:
                raise
            config, port = write_config(directory, body, server=server)


def _routes_listed(response: httpx2.Response) -> bool:
    """The gateway's /health lists its routes; an engine's does not."""
    try:
        return "routes" in response.json()
    except ValueError:
        return False


@dataclass
class Engine:
    """A real llama-server on loopback serving the Gemma model: its port and OpenAI base URL."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextmanager
def gemma_server(assets: Assets, directory: Path, *extra: str, ctx: int, parallel: int) -> Iterator[Engine]:
    """llama-server on the Gemma model with ``extra`` arguments (e.g. --api-key: a hosted API's
    stand-in, with real 401s), its log in ``directory``, until the block ends."""
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, *extra, ctx=ctx, parallel=parallel)
    with running(argv, directory / "llama.log", f"http://127.0.0.1:{port}/health"):
        yield Engine(port)

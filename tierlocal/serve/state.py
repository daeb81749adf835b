"""What a running ``tierlocal serve`` leaves for others to read: ``$TIERLOCAL_HOME/run/serve-PORT.json``
(its plan, what the engine did, the delta, where it serves and logs). ``tierlocal status``
shows it and the gateway's built-in configuration finds local engines through it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import constants

__all__ = [
    "state_path",
    "log_path",
    "write_state",
    "write_starting",
    "clear_state",
    "running_servers",
    "starting_servers",
    "MAX_STATE_BYTES",
    "MAX_SERVERS",
]

#: Longest state file read, in bytes.
MAX_STATE_BYTES = 1 << 20
#: Most state files read.
MAX_SERVERS = 64


def state_path(port: int) -> Path:
    """The state file of the server on ``port``."""
    return constants.run_dir() / f"serve-{port}.json"


def starting_path(port: int) -> Path:
    """The file that says a server on ``port`` is starting (loading, then being checked)."""
    return constants.run_dir() / f"starting-{port}.json"


def write_starting(port: int, payload: dict[str, object]) -> Path:
    """Say that the server on ``port`` is starting: ``status`` then says so, not "no serve
    running", until the state file takes over once the load is checked against the plan."""
    path = starting_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload))
    os.replace(temporary, path)
    return path


def clear_state(port: int) -> None:
    """The server on ``port`` stopped: neither file stays."""
    state_path(port).unlink(missing_ok=True)
    starting_path(port).unlink(missing_ok=True)


def log_path(engine: str, port: int) -> Path:
    """Where the engine on ``port`` logs: ``serve-PORT.log`` (``ollama-PORT.log`` for Ollama)."""
    return constants.run_dir() / f"{'ollama' if engine == 'ollama' else 'serve'}-{port}.log"


def write_state(port: int, payload: dict[str, object]) -> Path:
    """Write the state file atomically (a reader never sees half of it)."""
    path = state_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, path)
    starting_path(port).unlink(missing_ok=True)
    return path


def running_servers(port: int | None = None) -> list[dict[str, object]]:
    """The state of every server whose process is alive (the one on ``port``, if given),
    by port; unreadable or stale files are skipped."""
    return _alive(state_path(port) if port is not None else None, "serve-*.json")


def starting_servers(port: int | None = None) -> list[dict[str, object]]:
    """Servers still starting (``url``, ``pid``, ``phase``) whose process is alive."""
    return _alive(starting_path(port) if port is not None else None, "starting-*.json")


def _alive(path: Path | None, pattern: str) -> list[dict[str, object]]:
    if path is not None:
        candidates = [path]
    else:
        directory = constants.run_dir()
        candidates = sorted(directory.glob(pattern))[:MAX_SERVERS] if directory.is_dir() else []
    running = []
    for path in candidates:
        try:
            payload = json.loads(path.read_bytes()[:MAX_STATE_BYTES])
            os.kill(int(payload["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        running.append(payload)
    return running

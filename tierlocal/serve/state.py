"""What a running ``tierlocal serve`` leaves for others to read: ``$TIERLOCAL_HOME/run/serve-PORT.json``
(its plan, what the engine did, the delta, where it serves and logs). ``tierlocal status``
shows it and the gateway's built-in configuration finds local engines through it."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import constants

__all__ = [
    "ServeState",
    "UsersPoint",
    "state_path",
    "log_path",
    "write_state",
    "write_starting",
    "clear_state",
    "running_servers",
    "starting_servers",
    "set_state_path",
    "write_set_state",
    "running_sets",
    "MAX_STATE_BYTES",
    "MAX_SERVERS",
]

#: Longest state file read, in bytes.
MAX_STATE_BYTES = 1 << 20
#: Most state files read.
MAX_SERVERS = 64


#: Most rows of a plan's users table read from a state file.
MAX_USERS_ROWS = 64


@dataclass(frozen=True)
class UsersPoint:
    """One row of a serve's users table: ``users`` at once on its slots, each user's decode
    (tokens/s after the first token) and the median wait for the first token (seconds; None
    where the plan could not price prompts), and the figure's basis."""

    users: int
    per_user_decode_tokens_per_s: float
    first_token_p50_s: float | None
    basis: str


@dataclass(frozen=True)
class ServeState:
    """What a verified `tierlocal serve` is: where it serves (``url``), its own and its engine's
    process, the plan (``check --json``'s object), what the engine did (``actual``), the delta,
    and ``details`` an engine adds (``chat_template``, ``api_key_file``, ``ollama_template``).
    ``tierlocal status --json`` prints :meth:`to_json`."""

    url: str
    pid: int
    engine: str
    engine_pid: int | None
    log: str | None
    plan: dict[str, Any]
    actual: dict[str, Any]
    delta: dict[str, Any]
    first_answer_s: float | None = None
    engine_version: str | None = None
    argv: tuple[str, ...] | None = None
    estimate_correction_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "pid": self.pid,
            "engine": self.engine,
            "engine_pid": self.engine_pid,
            "engine_version": self.engine_version,
            "log": self.log,
            "argv": None if self.argv is None else list(self.argv),
            "plan": self.plan,
            "actual": self.actual,
            "delta": self.delta,
            "estimate_correction_bytes": self.estimate_correction_bytes,
            "first_answer_s": self.first_answer_s,
            **self.details,
        }

    @classmethod
    def from_json(cls, payload: object) -> ServeState:
        """Read a state file's object.

        Raises:
            ValueError: it is not one (no url, pid or engine; a part of the wrong type).
        """
        if not isinstance(payload, dict):
            raise ValueError("a serve state is a JSON object")
        data = dict(payload)
        url, pid, engine = data.pop("url", None), data.pop("pid", None), data.pop("engine", None)
        if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(engine, str):
            raise ValueError("a serve state names its url, pid and engine")
        plan, actual, delta = (({} if part is None else part) for part in (data.pop(name, None) for name in ("plan", "actual", "delta")))
        argv = data.pop("argv", None)
        if not all(isinstance(part, dict) for part in (plan, actual, delta)) or not (argv is None or isinstance(argv, list)):
            raise ValueError("a serve state's plan, actual and delta are objects and its argv a list")
        return cls(
            url,
            pid,
            engine,
            _optional(data.pop("engine_pid", None), int),
            _optional(data.pop("log", None), str),
            plan,
            actual,
            delta,
            _optional(data.pop("first_answer_s", None), float),
            _optional(data.pop("engine_version", None), str),
            None if argv is None else tuple(str(arg) for arg in argv),
            _optional(data.pop("estimate_correction_bytes", None), int),
            data,
        )

    @property
    def request(self) -> dict[str, Any]:
        """The plan's ``request`` (its ``-c``, ``-np``, … as ``check --json`` gives them)."""
        request = self.plan.get("request")
        return request if isinstance(request, dict) else {}

    @property
    def model_file(self) -> str:
        """The model file the engine was started with (its ``-m``), or ``unknown``."""
        argv = self.argv or ()
        return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "unknown"

    @property
    def model_source(self) -> str | None:
        """The source the plan was made for (a catalog name, a file, an hf:// address)."""
        model = self.plan.get("model")
        source = model.get("source") if isinstance(model, dict) else None
        return source if isinstance(source, str) else None

    @property
    def api_key_file(self) -> str | None:
        """The engine's key file (the path, never the key); None: it takes no key."""
        path = self.details.get("api_key_file")
        return path if isinstance(path, str) and path else None

    @property
    def users_curve(self) -> tuple[UsersPoint, ...]:
        """The plan's users table (measured rows where `bench --users` recorded them), by users."""
        rows = self.plan.get("users")
        points = []
        for row in rows[:MAX_USERS_ROWS] if isinstance(rows, list) else []:
            try:
                first = row.get("first_token_p50_s")
                point = UsersPoint(
                    int(row["users"]), float(row["per_user_decode_tokens_per_s"]), None if first is None else float(first), str(row.get("basis"))
                )
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
            if point.users > 0 and point.per_user_decode_tokens_per_s > 0:
                points.append(point)
        return tuple(sorted({point.users: point for point in points}.values(), key=lambda point: point.users))


def _optional(value: object, kind: type) -> Any:
    """``value`` when it is a ``kind`` (an int counts as a float), else None."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


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
    _replace_whole(path, json.dumps(payload))
    return path


def _replace_whole(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a reader never sees half of it), through a
    temporary file of this process and thread: a model set writes its state from the event loop
    and from the threads that load members, and two writers sharing one temporary file lost it
    between write and rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def clear_state(port: int) -> None:
    """The server on ``port`` stopped: neither file stays."""
    state_path(port).unlink(missing_ok=True)
    starting_path(port).unlink(missing_ok=True)


def log_path(engine: str, port: int) -> Path:
    """Where the engine on ``port`` logs: ``serve-PORT.log`` (``ollama-PORT.log`` for Ollama)."""
    return constants.run_dir() / f"{'ollama' if engine == 'ollama' else 'serve'}-{port}.log"


def write_state(port: int, state: ServeState) -> Path:
    """Write the state file atomically (a reader never sees half of it): the one writer."""
    path = state_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_whole(path, json.dumps(state.to_json(), indent=2))
    starting_path(port).unlink(missing_ok=True)
    return path


def running_servers(port: int | None = None) -> list[ServeState]:
    """The state of every server whose process is alive (the one on ``port``, if given),
    by port; unreadable, malformed or stale files are skipped."""
    states = []
    for payload in _alive(state_path(port) if port is not None else None, "serve-*.json"):
        try:
            states.append(ServeState.from_json(payload))
        except ValueError:
            continue
    return states


def starting_servers(port: int | None = None) -> list[dict[str, object]]:
    """Servers still starting (``url``, ``pid``, ``phase``) whose process is alive."""
    return _alive(starting_path(port) if port is not None else None, "starting-*.json")


def set_state_path(port: int) -> Path:
    """The state file of the model set served on ``port``."""
    return constants.run_dir() / f"set-{port}.json"


def write_set_state(port: int, payload: dict[str, object]) -> None:
    """What the model set on ``port`` is doing now (``pid`` and ``url`` among it), replaced whole."""
    path = set_state_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_whole(path, json.dumps(payload))


def running_sets(port: int | None = None) -> list[dict[str, object]]:
    """The state of every model set whose supervisor is alive (the one on ``port``, if given)."""
    return _alive(set_state_path(port) if port is not None else None, "set-*.json")


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

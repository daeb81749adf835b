"""Environment variables and named defaults; the only module that reads os.environ.

Values are read inside functions, never at import, so tests can change the
environment per test without patching module globals.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "TIERLOCAL_HOME"
ENV_DEBUG = "TIERLOCAL_DEBUG"
ENV_LLAMA_SERVER = "TIERLOCAL_LLAMA_SERVER"

#: Seconds to wait for one HTTP request (connect and each read).
DEFAULT_HTTP_TIMEOUT_S = 30.0
#: Seconds to wait for ``llama-server --list-devices``.
DEFAULT_LIST_DEVICES_TIMEOUT_S = 30.0
#: First ranged read of a remote header, in bytes; later reads grow with what was read.
REMOTE_FIRST_READ_BYTES = 256 * 1024
#: Largest single ranged read of a remote header, in bytes.
REMOTE_MAX_READ_BYTES = 8 * 1024 * 1024


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def debug_enabled() -> bool:
    """Whether ``TIERLOCAL_DEBUG`` asks for tracebacks."""
    return _is_true(os.environ.get(ENV_DEBUG))


def home_dir() -> Path:
    """tierlocal's own directory (engines, state): ``$TIERLOCAL_HOME`` or ``~/.local/share/tierlocal``."""
    configured = os.environ.get(ENV_HOME)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "tierlocal"


def engine_dir() -> Path:
    """Where ``tierlocal engine build`` installs binaries."""
    return home_dir() / "engines"


def models_dir() -> Path:
    """Where models are stored by default (used for the free-disk figure)."""
    return home_dir() / "models"


def llama_server_override() -> str | None:
    """An explicit llama-server path from ``$TIERLOCAL_LLAMA_SERVER``, if set."""
    return os.environ.get(ENV_LLAMA_SERVER) or None


def search_path() -> str:
    """``$PATH`` for finding engine binaries."""
    return os.environ.get("PATH", "")


def notify_socket() -> str | None:
    """systemd's ``$NOTIFY_SOCKET`` (set for Type=notify units), if any."""
    return os.environ.get("NOTIFY_SOCKET") or None


def credentials_dir() -> Path | None:
    """systemd's ``$CREDENTIALS_DIRECTORY`` (LoadCredential=), if any."""
    value = os.environ.get("CREDENTIALS_DIRECTORY")
    return Path(value) if value else None


def child_environment() -> dict[str, str]:
    """The environment for an engine child: ours without systemd's notify socket (the child
    must not claim readiness for us)."""
    return {key: value for key, value in os.environ.items() if key != "NOTIFY_SOCKET"}


def run_dir() -> Path:
    """Where running servers leave their state for ``tierlocal status``."""
    return home_dir() / "run"


def secret_from_env(variable: str) -> str | None:
    """A secret (a hosted API's key, a Redis URL with its password) from the environment
    variable the gateway's config names, if set."""
    return os.environ.get(variable) or None


def ollama_models_dir() -> Path:
    """Ollama's model store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    value = os.environ.get("OLLAMA_MODELS")
    return Path(value) if value else Path.home() / ".ollama" / "models"

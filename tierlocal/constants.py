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
#: Where `tierlocal engine build` keeps its build trees (a rebuild is then incremental).
ENV_BUILD_CACHE = "TIERLOCAL_BUILD_CACHE"

# --- what a run is planned with -------------------------------------------------------------
#: Context tokens planned when none is given (per slot for the catalog recommendation).
DEFAULT_CTX = 8192
#: llama.cpp's physical batch (``-ub``), tokens.
DEFAULT_UBATCH = 512
#: llama-server's slot count when ``-np`` is left at auto (they share one unified KV cache).
AUTO_SLOTS = 4
#: What ``-ngl all`` asks for: every layer (a plan resolves it to the model's layer count).
NGL_ALL = 2**31 - 1
#: Slowest decode speed (tokens/s) the catalog recommendation accepts: a comfortable reading
#: pace for chat (--min-speed 0: the largest model that runs at all).
DEFAULT_MIN_TOKENS_PER_S = 10.0
#: Context tokens per slot ``check --for long-context`` plans when --ctx is not given.
LONG_CONTEXT_CTX = 32768

# --- where servers listen ---------------------------------------------------------------------
#: The address servers bind unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: llama-server's own default port.
LLAMA_SERVER_PORT = 8080
#: Ollama's own port.
OLLAMA_PORT = 11434
#: The gateway's port.
GATEWAY_PORT = 8088
#: `tierlocal dashboard`'s port (loopback only) when no gateway serves /ui.
DASHBOARD_PORT = 8089
#: Output tokens the gateway reserves (and sends upstream) for a budgeted request naming none.
GATEWAY_DEFAULT_MAX_TOKENS = 8192

# --- timeouts and sizes -----------------------------------------------------------------------
#: Seconds to wait for one HTTP request (connect and each read).
DEFAULT_HTTP_TIMEOUT_S = 30.0
#: Seconds to wait for ``llama-server --list-devices``.
DEFAULT_LIST_DEVICES_TIMEOUT_S = 30.0
#: Seconds to wait for ``llama-server --help`` / ``--version``.
HELP_TIMEOUT_S = 30.0
#: Seconds a model load may take at least, plus one per LOAD_BYTES_PER_S bytes of model file.
LOAD_TIMEOUT_BASE_S = 120.0
LOAD_BYTES_PER_S = 50_000_000
#: Seconds systemd's start timeout is extended by, each time a load reports progress.
EXTEND_TIMEOUT_S = 60
#: Seconds to wait for a started ``ollama serve`` to answer /api/version.
OLLAMA_START_TIMEOUT_S = 60.0
#: Seconds serve waits for the first short chat it sends before saying ready (a slow device's
#: prompt processing included).
#: Seconds an engine gets to exit after SIGTERM before it is killed (SIGKILL to its group).
ENGINE_STOP_GRACE_S = 15.0
FIRST_ANSWER_TIMEOUT_S = 300.0
#: Output tokens of that first chat.
FIRST_ANSWER_TOKENS = 2
#: First read of a header (a ranged request for a remote one), in bytes; later reads grow with
#: what was read (tierlocal.gguf.parse.HeaderLimits).
REMOTE_FIRST_READ_BYTES = 256 * 1024
#: Largest single read of a header, in bytes.
REMOTE_MAX_READ_BYTES = 8 * 1024 * 1024
#: Free disk kept after a download unless --keep-free says otherwise (bytes).
DEFAULT_KEEP_FREE_BYTES = 1 << 30

# --- tier-1 / tier-3 assumptions (``tierlocal plan``) -------------------------------------------
#: Download bandwidths the plan shows when none is given.
DEFAULT_DOWNLOAD_BANDWIDTHS = ("125MB/s", "1GB/s", "10GB/s")
#: Share of tokens that are input, and of input tokens that hit the API's cache.
DEFAULT_INPUT_SHARE = 0.75
DEFAULT_CACHE_HIT = 0.5
#: Context lengths (tokens) the KV-cache-per-user table shows.
PLAN_KV_CONTEXTS = (8_192, 32_768, 131_072, 1_048_576)


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


def cache_dir() -> Path:
    """What tierlocal can always make again: ``$XDG_CACHE_HOME/tierlocal`` (``~/.cache/tierlocal``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tierlocal"


def build_cache_dir() -> Path:
    """`tierlocal engine build`'s build trees and unpacked sources: ``$TIERLOCAL_BUILD_CACHE``,
    else ``$XDG_CACHE_HOME/tierlocal/engine-build`` (``~/.cache/…``)."""
    configured = os.environ.get(ENV_BUILD_CACHE)
    return Path(configured) if configured else cache_dir() / "engine-build"


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


def use_metrics_dir(path: str) -> None:
    """Point prometheus_client's multiprocess mode at ``path`` (PROMETHEUS_MULTIPROC_DIR,
    which it reads as each metric is made): a gateway worker's metrics go there."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path

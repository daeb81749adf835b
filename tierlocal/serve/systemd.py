"""systemd: the units tierlocal installs, rendered from the templates in systemd/ (packed into
the wheel as tierlocal/_systemd), what ``systemctl show`` says about them, and the readiness
protocol without libsystemd (:func:`notify`: datagrams to ``$NOTIFY_SOCKET``).

``READY=1`` once the engine answers health and the load is verified; ``EXTEND_TIMEOUT_USEC``
while a big model loads (so the unit's start timeout does not kill it); ``STOPPING=1`` on the
way out. Without ``$NOTIFY_SOCKET`` (not under systemd) :func:`notify` does nothing.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from ..engines.ollama import OllamaSettings
from ..errors import TierlocalError

__all__ = [
    "STATUS_PROPERTIES",
    "UNIT_HOME",
    "GatewayUnit",
    "ServeUnit",
    "describe_unit",
    "memory_limits",
    "notify",
    "parse_systemctl_show",
    "render_gateway_unit",
    "render_ollama_dropin",
    "render_serve_unit",
    "systemd_quote",
    "templates_dir",
    "tierlocal_command",
    "write_unit",
]

#: The TIERLOCAL_HOME (and HOME) the units give their service (Environment= in systemd/*.service.in).
UNIT_HOME = Path("/var/lib/tierlocal")

_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def templates_dir() -> Path:
    """systemd/ beside the package in a source tree, or the copy packed inside the wheel."""
    package = Path(__file__).parent.parent
    for candidate in (package / "_systemd", package.parent / "systemd"):
        if candidate.is_dir():
            return candidate
    raise TierlocalError("the systemd/ templates are missing from this installation", hint="reinstall tierlocal")


def systemd_quote(argument: str) -> str:
    """One ExecStart argument: systemd expands % specifiers and $ variables and splits on
    spaces, so those are escaped and anything unusual is double-quoted."""
    escaped = argument.replace("%", "%%").replace("$", "$$")
    if _SAFE.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def tierlocal_command() -> list[str]:
    """How a unit starts this tierlocal: the console script beside this Python, else -m."""
    script = Path(sys.executable).parent / "tierlocal"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "tierlocal"]


@dataclass(frozen=True)
class ServeUnit:
    """What `tierlocal-serve.service` runs: the serve arguments (absolute paths), the user,
    and the key file to hand over as a systemd credential."""

    serve_args: tuple[str, ...]
    model: Path
    user: str
    api_key_file: Path | None
    #: MemoryHigh=/MemoryMax= lines (or a comment saying why there are none).
    memory: str = ""


#: The groups that open GPU device nodes: DRM render nodes (render) and older /dev/dri, NVIDIA's
#: nodes on some distributions (video).
GPU_GROUPS = ("render", "video")


def primary_group(user: str) -> str:
    """The account's primary group (``nobody``'s is ``nogroup`` on Debian); for an account not
    created yet, the group of its own name that ``useradd`` makes with it."""
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return user


def gpu_groups_line() -> str:
    """SupplementaryGroups= with the GPU groups this machine has: systemd refuses to start a unit
    that names a group that does not exist (216/GROUP; no ``render`` without GPU drivers)."""
    present = []
    for name in GPU_GROUPS:
        try:
            grp.getgrnam(name)
        except KeyError:
            continue
        present.append(name)
    if not present:
        return f"# No SupplementaryGroups: none of {', '.join(GPU_GROUPS)} exists on the machine this unit was written on."
    return f"SupplementaryGroups={' '.join(present)}"


def render_serve_unit(unit: ServeUnit) -> str:
    """The unit text."""
    template = (templates_dir() / "tierlocal-serve.service.in").read_text()
    exec_start = " ".join(systemd_quote(part) for part in [*tierlocal_command(), "serve", *unit.serve_args])
    credentials = f"LoadCredential=api-key:{unit.api_key_file}\n" if unit.api_key_file else ""
    return template.format(
        description=unit.model.name,
        exec_start=exec_start,
        user=unit.user,
        group=primary_group(unit.user),
        supplementary_groups=gpu_groups_line(),
        environment="",
        credentials=credentials,
        memory=unit.memory,
        model_dir=systemd_quote(str(unit.model.parent)),
    )


#: Head room above the planned host memory: MemoryHigh (reclaim, then throttle) and MemoryMax (the OOM line).
MEMORY_HIGH_MARGIN = 0.10
MEMORY_MAX_MARGIN = 0.25
#: What the unit's cgroup is charged besides llama-server: `tierlocal serve`'s own Python process
#: (RSS 43 MiB for a Gemma 3 270M serve, 2026-12-05) and the page cache of what it reads while it
#: runs (its modules, the model's header, the engine's log it writes).
SUPERVISOR_BYTES = 96 * 2**20


def memory_limits(in_use_bytes: int, prompt_cache_bytes: int, ram_total_bytes: int) -> str:
    """The unit's memory lines for a plan whose llama-server holds ``in_use_bytes`` serving
    full prompts and may add ``prompt_cache_bytes`` of saved prompts (its --cache-ram): the cgroup
    is charged all of that (anonymous memory and the mapped model's page cache alike) plus
    :data:`SUPERVISOR_BYTES`, so MemoryHigh is that plus a margin — a unit throttled below what
    its own plan lets the engine hold stalls in normal use — and MemoryMax a wider margin above
    it; a line that would be more than the machine has is left out, with a comment saying so."""
    planned = in_use_bytes + SUPERVISOR_BYTES + prompt_cache_bytes
    high = -(-int(planned * (1 + MEMORY_HIGH_MARGIN)) // 2**20)
    limit = -(-int(planned * (1 + MEMORY_MAX_MARGIN)) // 2**20)
    ram = ram_total_bytes / 2**20
    lines = (
        "# From the plan (tierlocal check SOURCE: system RAM as the kernel counts it): llama-server in use "
        f"{in_use_bytes / 2**20:.0f} MiB, + up to {prompt_cache_bytes / 2**20:.0f} MiB of saved prompts (--cache-ram), "
        f"+ {SUPERVISOR_BYTES / 2**20:.0f} MiB for tierlocal itself; MemoryHigh +10%, MemoryMax +25%.\n"
    )
    if high > ram:
        return lines + f"# No MemoryHigh or MemoryMax: {high} MiB would be more than this machine's {ram:.0f} MiB of RAM."
    if limit > ram:
        return lines + f"MemoryHigh={high}M\n# No MemoryMax: {limit} MiB would be more than this machine's {ram:.0f} MiB of RAM."
    return lines + f"MemoryHigh={high}M\nMemoryMax={limit}M"


@dataclass(frozen=True)
class GatewayUnit:
    """What `tierlocal-gateway.service` runs: the gateway's arguments (absolute config path),
    the user, its state directory, and (name, file) pairs handed over as credentials."""

    gateway_args: tuple[str, ...]
    config: Path | None
    user: str
    state_dir: Path
    credentials: tuple[tuple[str, Path], ...]


def render_gateway_unit(unit: GatewayUnit) -> str:
    """The unit text."""
    template = (templates_dir() / "tierlocal-gateway.service.in").read_text()
    exec_start = " ".join(systemd_quote(part) for part in [*tierlocal_command(), "gateway", *unit.gateway_args])
    credentials = "".join(f"LoadCredential={name}:{path}\n" for name, path in unit.credentials)
    return template.format(
        config="built-in configuration" if unit.config is None else unit.config.name,
        exec_start=exec_start,
        user=unit.user,
        group=primary_group(unit.user),
        state_dir=systemd_quote(str(unit.state_dir)),
        credentials=credentials.rstrip("\n") or "# (none given: add --credential NAME=FILE)",
    )


#: What `tierlocal service status` asks systemd for.
STATUS_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainStatus", "ActiveEnterTimestamp", "StatusText")


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``systemctl show``'s ``Name=value`` lines as a dict (a value may itself hold ``=``)."""
    properties: dict[str, str] = {}
    for line in text.splitlines():
        name, separator, value = line.partition("=")
        if separator and name:
            properties[name] = value
    return properties


def describe_unit(unit: str, properties: dict[str, str]) -> str:
    """One line: state, main PID, restarts, since when, and tierlocal's own STATUS= text."""
    state = f"{properties.get('ActiveState', '?')} ({properties.get('SubState', '?')})"
    parts = [f"{unit}: {state}"]
    if properties.get("MainPID", "0") not in ("", "0"):
        parts.append(f"pid {properties['MainPID']}")
    if properties.get("NRestarts", "0") not in ("", "0"):
        parts.append(f"restarted {properties['NRestarts']} time(s)")
    if properties.get("Result") not in (None, "", "success"):
        parts.append(f"last result {properties['Result']} (exit status {properties.get('ExecMainStatus', '?')})")
    if properties.get("ActiveEnterTimestamp"):
        parts.append(f"since {properties['ActiveEnterTimestamp']}")
    line = ", ".join(parts)
    return line + (f" — {properties['StatusText']}" if properties.get("StatusText") else "")


def write_unit(directory: Path, name: str, text: str) -> Path:
    """Write ``directory/name`` atomically (never a half-written unit)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    temporary = directory / f".{name}.tmp"
    temporary.write_text(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, target)
    return target


def render_ollama_dropin(settings: OllamaSettings, model: Path, ollama_host: str | None) -> str:
    """The drop-in text: one ``Environment=`` per planned Ollama server setting, and
    ``OLLAMA_HOST`` when it is not Ollama's default."""
    env = dict(settings.env)
    if ollama_host is not None:
        env["OLLAMA_HOST"] = ollama_host
    lines = [
        f"# Written by `tierlocal service install serve {model.name} --engine ollama`: the plan's server",
        f"# settings for {model}. num_ctx {settings.num_ctx} and num_gpu {settings.num_gpu} are set on the model",
        "# itself by `tierlocal serve MODEL --engine ollama`. Delete this file to return to Ollama's defaults.",
        "[Service]",
        *(f'Environment="{key}={value}"' for key, value in env.items()),
    ]
    return "\n".join(lines) + "\n"


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=…"``) to systemd as one message; True if sent."""
    address = constants.notify_socket()
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
        except OSError:
            return False
    return True

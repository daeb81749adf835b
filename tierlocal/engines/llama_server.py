"""The llama-server binary: finding it, asking it which devices it sees and which options it
accepts (``--help`` and ``--version``, read once). I/O: runs the binary."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from ..errors import EngineError, UsageError
from .flags import EngineFlags, parse_help

__all__ = [
    "EngineDevice",
    "find_llama_server",
    "parse_list_devices",
    "list_devices",
    "read_engine_flags",
    "build_cpu_features",
    "parse_system_info",
    "RunCommand",
]

#: Runs argv with a timeout in seconds and returns (exit code, stdout + stderr).
RunCommand = Callable[[list[str], float], tuple[int, str]]

# common/arg.cpp: "  %s: %s (%zu MiB, %zu MiB free)"
_DEVICE_LINE = re.compile(r"^\s+(?P<name>[A-Za-z_]+\d*): (?P<description>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
_MIB = 1024 * 1024


@dataclass(frozen=True)
class EngineDevice:
    """One device as llama.cpp lists it. Memory in bytes (llama.cpp rounds to MiB)."""

    name: str
    backend: str
    description: str
    total_bytes: int
    free_bytes: int


def find_llama_server(explicit: str | None = None) -> Path | None:
    """The llama-server to use: ``explicit``, ``$TIERLOCAL_LLAMA_SERVER``, PATH, then tierlocal's engine dir."""
    for candidate in (explicit, constants.llama_server_override()):
        if candidate:
            path = Path(candidate)
            return path if path.is_file() else None
    on_path = shutil.which("llama-server", path=constants.search_path())
    if on_path:
        return Path(on_path)
    engine_dir = constants.engine_dir()
    if engine_dir.is_dir():
        for path in sorted(engine_dir.glob("*/bin/llama-server")):
            if not path.parent.parent.name.startswith("."):  # a build in progress
                return path
    return None


def llama_server_missing(explicit: str | Path | None = None) -> UsageError:
    """The error for "no llama-server": which of ``--llama-server``, ``$TIERLOCAL_LLAMA_SERVER``,
    PATH and the engine directory was looked at, and how to get one."""
    build = "build one: tierlocal engine build"
    if explicit:
        return UsageError(f"--llama-server {explicit}: no such file", hint=f"give the path of a llama-server binary, or {build}")
    configured = constants.llama_server_override()
    if configured:
        return UsageError(f"{constants.ENV_LLAMA_SERVER}={configured}: no such file", hint=f"point it at a llama-server binary, unset it, or {build}")
    return UsageError(
        f"no llama-server found (none on PATH, none in {constants.engine_dir()})",
        hint=f"{build} (or pass --llama-server PATH, or set {constants.ENV_LLAMA_SERVER})",
    )


def parse_list_devices(output: str) -> list[EngineDevice]:
    """Parse ``llama-server --list-devices`` output into devices (the CPU is not listed)."""
    devices = []
    for line in output.splitlines():
        match = _DEVICE_LINE.match(line)
        if match is None:
            continue
        name = match.group("name")
        devices.append(
            EngineDevice(
                name=name,
                backend=name.rstrip("0123456789"),
                description=match.group("description"),
                total_bytes=int(match.group("total")) * _MIB,
                free_bytes=int(match.group("free")) * _MIB,
            )
        )
    return devices


def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    return completed.returncode, completed.stdout + completed.stderr


def list_devices(binary: Path, *, run: RunCommand = _run) -> list[EngineDevice]:
    """The devices ``binary --list-devices`` reports; empty if it fails or times out."""
    try:
        code, output = run([str(binary), "--list-devices"], constants.DEFAULT_LIST_DEVICES_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_list_devices(output) if code == 0 else []


# ggml's system_info names → the /proc/cpuinfo names tierlocal uses.
_SYSTEM_INFO_FEATURES = {"AVX2": "avx2", "AVX512": "avx512f", "DOTPROD": "asimddp", "MATMUL_INT8": "i8mm", "SVE": "sve"}


def parse_system_info(output: str) -> tuple[str, ...] | None:
    """The CPU features a build was compiled for, from its ``system_info: … CPU : AVX2 = 1 |
    … | REPACK = 1 |`` line (None: no such line). Without ``REPACK = 1`` nothing is repacked,
    so no feature is reported."""
    line = next((line for line in output.splitlines() if "system_info:" in line and "CPU :" in line), None)
    if line is None:
        return None
    present = {name for name, value in re.findall(r"\b([A-Z0-9_]+) = (\d+)", line.split("CPU :", 1)[1]) if value != "0"}
    if "REPACK" not in present:
        return ()
    return tuple(feature for name, feature in _SYSTEM_INFO_FEATURES.items() if name in present)


def build_cpu_features(binary: Path, *, run: RunCommand = _run) -> tuple[str, ...] | None:
    """The CPU features ``binary`` was built with (its own report, printed before it tries a
    model that does not exist); None when it prints none (another build or version)."""
    try:
        _code, output = run([str(binary), "-m", "/nonexistent/tierlocal-probe.gguf", "--port", "0", "-lv", "4"], constants.HELP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_system_info(output)


def read_engine_flags(binary: Path) -> EngineFlags:
    """Run ``binary --help`` and ``--version`` once.

    Raises:
        EngineError: it does not run, or its help is not llama-server's.
    """
    try:
        help_run = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=constants.HELP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL
        )
        version_run = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=constants.HELP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{binary}: cannot run it ({type(exc).__name__})", hint="check the path, or pass --llama-server PATH") from None
    flags = parse_help(help_run.stdout + help_run.stderr, version_run.stdout + version_run.stderr)
    if not flags.knows("--port") or not flags.knows("-ngl"):
        raise EngineError(f"{binary}: its --help does not look like llama-server's", hint="pass the llama-server binary with --llama-server PATH")
    return flags

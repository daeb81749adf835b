"""What a llama-server binary accepts, read once from its ``--help`` (llama.cpp renames flags
between releases: ``--no-mmap`` became ``--load-mode``, ``-fa`` took a value, ``--fit``
appeared), and the argv that realises a plan with it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import TierlocalError

__all__ = ["EngineFlags", "read_engine_flags", "parse_help", "plan_argv"]

# "-fa,   --flash-attn [on|off|auto]   set ..." : an option, an optional argument after one
# space, then ", " and the next alias; the description starts after two or more spaces.
_ALIAS = re.compile(r"(-{1,2}[A-Za-z0-9][\w.-]*)(?: [^\s,-][^\s,]*)?(?:,\s+|(?=\s{2,})|$)")
_VERSION = re.compile(r"version: (\S+) \(build (\d+), commit (\S+)\)")
#: Seconds to wait for ``--help`` / ``--version``.
HELP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EngineFlags:
    """The options one binary knows, and its version string."""

    options: frozenset[str]
    flash_attn_takes_value: bool
    version: str

    def knows(self, option: str) -> bool:
        return option in self.options


def parse_help(help_text: str, version_text: str = "") -> EngineFlags:
    """Options from ``llama-server --help`` (each line that starts with ``-``, every alias)."""
    options: set[str] = set()
    flash_takes_value = False
    for line in help_text.splitlines():
        names = []
        position = 0
        while match := _ALIAS.match(line, position):
            names.append(match.group(1))
            position = match.end()
            if not line[match.end() - 1 : match.end()].isspace() and not line[position:].startswith("-"):
                break
        options.update(names)
        if "--flash-attn" in names and re.search(r"--flash-attn \[?on\|off", line):
            flash_takes_value = True
    version = _VERSION.search(version_text)
    return EngineFlags(frozenset(options), flash_takes_value, f"{version.group(1)}-b{version.group(2)}-{version.group(3)}" if version else "unknown")


def read_engine_flags(binary: Path) -> EngineFlags:
    """Run ``binary --help`` and ``--version`` once."""
    try:
        help_run = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
        version_run = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TierlocalError(f"{binary}: cannot run it ({type(exc).__name__})", hint="check the path, or pass --llama-server PATH") from None
    flags = parse_help(help_run.stdout + help_run.stderr, version_run.stdout + version_run.stderr)
    if not flags.knows("--port") or not flags.knows("-ngl"):
        raise TierlocalError(f"{binary}: its --help does not look like llama-server's", hint="pass the llama-server binary with --llama-server PATH")
    return flags


def plan_argv(
    binary: Path,
    flags: EngineFlags,
    command: list[str],
    *,
    host: str,
    port: int,
    api_key_file: Path | None,
    threads: int | None = None,
) -> list[str]:
    """The planned ``llama-server`` command (``check``'s ``command``) adapted to ``binary``:
    its path, the bind address, ``--fit off`` so llama.cpp does not re-plan what we planned,
    verbose load lines for the log parser, the key by file (never on the command line)."""
    argv = [str(binary), *command[1:]]
    if not flags.flash_attn_takes_value and "-fa" in argv:
        index = argv.index("-fa")
        value = argv.pop(index + 1)
        if value != "on":
            argv.pop(index)
    argv += ["--host", host, "--port", str(port)]
    if flags.knows("--fit"):
        argv += ["--fit", "off"]
    if flags.knows("-lv"):
        argv += ["-lv", "4"]
    if threads:
        argv += ["-t", str(threads)]
    if api_key_file is not None:
        if not flags.knows("--api-key-file"):
            raise TierlocalError(f"{binary} has no --api-key-file", hint="use a newer llama-server; tierlocal never puts the key on the command line")
        argv += ["--api-key-file", str(api_key_file)]
    return argv

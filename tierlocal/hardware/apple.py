"""Apple silicon: the chip and its unified memory, from ``sysctl``, and how much of that memory
Metal lets the GPU wire.

- ``machdep.cpu.brand_string``: the chip (``Apple M3 Max``; the first M1 builds said ``Apple
  processor``), looked up in recipes/gpus.toml [[unified]] for its memory bandwidth;
- ``hw.memsize``: the pool, in bytes;
- ``iogpu.wired_limit_mb``: the GPU's limit when someone set one (MiB; ``0`` is macOS's own
  default). Without one, the share of RAM devices have reported (recipes/gpus.toml
  [apple_metal_working_set]: 2/3 up to 36 GB, 3/4 above); llama.cpp's Metal backend reads the
  exact figure (``recommendedMaxWorkingSetSize``), and :func:`tierlocal.hardware.detect.detect`
  takes it from ``llama-server --list-devices`` when a Metal build is found.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable

from ..catalog import find_unified
from .types import Device, Probe

__all__ = ["probe_apple", "Sysctl"]

#: ``sysctl -n NAME`` → its value, or None when the name is unknown or the call fails.
Sysctl = Callable[[str], str | None]

_MIB = 1024**2
#: Without a chip the recipes know, the share Macs up to 36 GB have reported, and above.
_DEFAULT_SHARES = (2 / 3, 3 / 4)
_SMALL_RAM_BYTES = 36 * 1024**3


def _sysctl(name: str) -> str | None:
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = done.stdout.strip()
    return value if done.returncode == 0 and value else None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def probe_apple(
    ram_total_bytes: int, *, system: str | None = None, machine: str | None = None, sysctl: Sysctl = _sysctl
) -> tuple[list[Device], Probe]:
    """The Mac's GPU as one device over its unified memory (``unified_pool_bytes``), or absent
    when this is not Apple silicon. ``ram_total_bytes`` stands in where ``hw.memsize`` is not read."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system != "Darwin" or machine != "arm64":
        return [], Probe("apple", "absent", "not an Apple silicon Mac")
    brand = sysctl("machdep.cpu.brand_string") or "Apple silicon"
    pool = _int(sysctl("hw.memsize")) or ram_total_bytes
    spec = find_unified(brand)
    wired_mib = _int(sysctl("iogpu.wired_limit_mb")) or 0
    if wired_mib:
        usable = min(wired_mib * _MIB, pool)
        how = f"iogpu.wired_limit_mb = {wired_mib} (set on this Mac)"
    else:
        share = spec.gpu_share(pool) if spec else _DEFAULT_SHARES[0] if pool <= _SMALL_RAM_BYTES else _DEFAULT_SHARES[1]
        usable = int(pool * share)
        how = f"~{share:.0%} of RAM, macOS's default as Macs have reported it (sudo sysctl iogpu.wired_limit_mb raises it)"
    name = spec.name if spec else brand
    device = Device(name, "metal", usable, usable, spec.bandwidth_bytes_per_s if spec else None, "apple:sysctl", unified_pool_bytes=pool)
    known = "" if spec else f"; {brand!r} is not in recipes/gpus.toml, so its bandwidth is unknown"
    return [device], Probe("apple", "found", f"{name}, {pool / 1024**3:.0f} GiB unified; the GPU may wire {how}{known}")

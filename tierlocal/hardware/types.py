"""A machine as the planner sees it: accelerators, host memory, disk and cores. Pure data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Device", "Probe", "Hardware"]


@dataclass(frozen=True)
class Device:
    """One accelerator. Memory in bytes, bandwidth in bytes/s (None when unknown)."""

    name: str
    backend: str
    total_bytes: int
    free_bytes: int
    bandwidth_bytes_per_s: int | None = None
    source: str = ""
    #: The largest tensor the device binds (bytes); None: no known limit.
    max_tensor_bytes: int | None = None
    #: A unified-memory machine's whole pool (bytes): the GPU's share is ``total_bytes``, the
    #: host has the rest, and both read it at ``bandwidth_bytes_per_s``; 0 for a discrete GPU.
    unified_pool_bytes: int = 0


@dataclass(frozen=True)
class Probe:
    """One detection method and what it found (``found``) or why not (``absent``)."""

    name: str
    status: str
    detail: str


@dataclass(frozen=True)
class Hardware:
    """A machine: GPUs plus host memory (bytes), disk (bytes) and cores."""

    gpus: tuple[Device, ...]
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_cores: int
    cpu_threads: int
    disk_path: str
    disk_free_bytes: int | None
    probes: tuple[Probe, ...] = field(default=())
    overridden: bool = False
    #: ``x86_64``, ``aarch64`` …, and the CPU features that matter to llama.cpp's CPU backend
    #: (from /proc/cpuinfo: avx2, avx512f, asimddp, i8mm, sve).
    cpu_arch: str = ""
    cpu_features: tuple[str, ...] = ()
    #: ``--ram``: the RAM is another machine's (this CPU's calibration does not apply), and
    #: ``--ram-bandwidth``: its memory bandwidth (bytes/s; None: the planning assumption).
    ram_overridden: bool = False
    ram_bandwidth_bytes_per_s: int | None = None

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--json``."""
        return asdict(self)

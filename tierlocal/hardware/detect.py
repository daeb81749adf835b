"""What this machine has: GPUs (NVML, AMD sysfs, Apple unified memory, whatever
llama-server sees), system RAM, free disk and CPU cores.

Every probe that fails or is absent is reported as absent with a reason; a machine with
no GPU is a normal result, not an error.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from .. import constants
from ..catalog import GpuSpec, load_device_limits, load_gpus, normalise_gpu_name
from ..engines.llama_server import build_cpu_features, find_llama_server, list_devices
from .types import Device, Hardware, Probe

__all__ = ["detect", "probe_nvml", "probe_amd_sysfs", "probe_apple", "probe_llama_server", "probe_cpu", "cpu_features"]

_GIB = 1024**3
#: macOS lets Metal wire about 2/3 of RAM up to 36 GiB and 3/4 above (iogpu.wired_limit_mb
#: changes it); llama.cpp reads the exact figure from Metal's recommendedMaxWorkingSetSize.
_APPLE_SMALL_RAM_BYTES = 36 * _GIB


ProbeFn = Callable[[], tuple[list[Device], Probe]]


def _bandwidth_for(description: str) -> int | None:
    spec = _spec_for_description(description)
    return spec.bandwidth_bytes_per_s if spec else None


def _max_buffer_for(description: str) -> int | None:
    limits = [limit.max_buffer_bytes for limit in load_device_limits() if limit.match.lower() in description.lower()]
    return min(limits) if limits else None


def _spec_for_description(description: str) -> GpuSpec | None:
    """The recipes GPU whose longest name or alias appears in a driver's device name."""
    text = f" {normalise_gpu_name(description)} "
    best: tuple[int, GpuSpec] | None = None
    for spec in load_gpus():
        for alias in (spec.name, *spec.aliases):
            needle = f" {normalise_gpu_name(alias)} "
            if needle in text and (best is None or len(needle) > best[0]):
                best = (len(needle), spec)
    return best[1] if best else None


def probe_nvml() -> tuple[list[Device], Probe]:
    """NVIDIA GPUs through NVML (nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return [], Probe("nvml", "absent", "nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], Probe("nvml", "absent", f"no NVIDIA driver ({exc})")
    devices = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(Device(name, "cuda", int(memory.total), int(memory.free), _bandwidth_for(name), f"nvml:{index}"))
    except pynvml.NVMLError as exc:
        return devices, Probe("nvml", "absent" if not devices else "found", f"NVML error: {exc}")
    finally:
        pynvml.nvmlShutdown()
    return devices, Probe("nvml", "found" if devices else "absent", f"{len(devices)} NVIDIA GPU(s)")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def probe_amd_sysfs(sysfs_root: Path = Path("/sys")) -> tuple[list[Device], Probe]:
    """AMD GPUs through the amdgpu driver's sysfs files (``mem_info_vram_total`` / ``_used``)."""
    devices = []
    drm = sysfs_root / "class" / "drm"
    for card in sorted(drm.glob("card[0-9]*")) if drm.is_dir() else []:
        if not re.fullmatch(r"card\d+", card.name):
            continue
        device_dir = card / "device"
        if _read_text(device_dir / "vendor") != "0x1002":
            continue
        total = _read_text(device_dir / "mem_info_vram_total")
        used = _read_text(device_dir / "mem_info_vram_used")
        if total is None or not total.isdigit():
            continue
        name = _read_text(device_dir / "product_name") or f"AMD GPU ({card.name})"
        total_bytes = int(total)
        free_bytes = total_bytes - int(used) if used and used.isdigit() else total_bytes
        devices.append(Device(name, "rocm", total_bytes, max(free_bytes, 0), _bandwidth_for(name), f"amd-sysfs:{card.name}"))
    if not devices:
        return [], Probe("amd-sysfs", "absent", f"no amdgpu device under {drm}")
    return devices, Probe("amd-sysfs", "found", f"{len(devices)} AMD GPU(s)")


def probe_apple(ram_total_bytes: int) -> tuple[list[Device], Probe]:
    """Apple silicon: unified memory, of which Metal may use a share."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return [], Probe("apple", "absent", "not an Apple silicon Mac")
    share = 2 / 3 if ram_total_bytes <= _APPLE_SMALL_RAM_BYTES else 3 / 4
    usable = int(ram_total_bytes * share)
    device = Device("Apple unified memory (Metal share)", "metal", usable, usable, None, "apple")
    return [device], Probe("apple", "found", f"Metal may use ~{share:.0%} of RAM by default (sysctl iogpu.wired_limit_mb changes it)")


def probe_llama_server(binary: Path | None = None) -> tuple[list[Device], Probe]:
    """Every non-CPU device that ``llama-server --list-devices`` reports."""
    path = binary or find_llama_server()
    if path is None:
        return [], Probe(
            "llama-server", "absent", "no llama-server found (build one: tierlocal engine build; or set TIERLOCAL_LLAMA_SERVER, or put it on PATH)"
        )
    engine_devices = list_devices(path)
    devices = [
        Device(
            f"{device.name}: {device.description}",
            device.backend.lower(),
            device.total_bytes,
            device.free_bytes,
            _bandwidth_for(device.description),
            f"llama-server:{device.name}",
            _max_buffer_for(device.description),
        )
        for device in engine_devices
    ]
    detail = f"{len(devices)} device(s) from {path} --list-devices"
    return devices, Probe("llama-server", "found" if devices else "absent", detail)


def _disk_free(path: Path) -> tuple[str, int | None]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return str(path), int(psutil.disk_usage(str(probe)).free)
    except OSError:
        return str(path), None


def _same_device(engine_device: Device, vendor_devices: Sequence[Device]) -> bool:
    description = engine_device.name.split(": ", 1)[-1].lower()
    return any(vendor.name.lower() in description for vendor in vendor_devices)


def detect(
    *,
    models_dir: Path | None = None,
    llama_server: Path | None = None,
    vendor_probes: Sequence[ProbeFn] | None = None,
) -> Hardware:
    """Detect this machine.

    Args:
        models_dir: where models go (for the free-disk figure); default ``$TIERLOCAL_HOME/models``.
        llama_server: a llama-server binary to ask for its devices; default: the one found.
        vendor_probes: the driver probes to run (default NVML, AMD sysfs); tests pass others.
    """
    memory = psutil.virtual_memory()
    probes: list[Probe] = []
    gpus: list[Device] = []
    for probe in vendor_probes if vendor_probes is not None else (probe_nvml, probe_amd_sysfs):
        found, result = probe()
        gpus.extend(found)
        probes.append(result)
    apple, apple_probe = probe_apple(int(memory.total))
    gpus.extend(apple)
    probes.append(apple_probe)
    engine = llama_server or find_llama_server()  # found once, asked for devices and CPU features
    engine_gpus, engine_probe = probe_llama_server(engine)
    gpus.extend(device for device in engine_gpus if not _same_device(device, gpus))
    probes.append(engine_probe)
    features, cpu_probe = probe_cpu(engine)
    probes.append(cpu_probe)
    disk_path, disk_free = _disk_free(models_dir or constants.models_dir())
    return Hardware(
        gpus=tuple(gpus),
        ram_total_bytes=int(memory.total),
        ram_available_bytes=int(memory.available),
        cpu_cores=psutil.cpu_count(logical=False) or psutil.cpu_count() or 1,
        cpu_threads=psutil.cpu_count() or 1,
        disk_path=disk_path,
        disk_free_bytes=disk_free,
        probes=tuple(probes),
        cpu_arch=platform.machine().lower(),
        cpu_features=features,
    )


#: The CPU features llama.cpp's CPU backend chooses kernels by (repacking among them).
CPU_FEATURES = ("avx2", "avx512f", "asimddp", "i8mm", "sve")


def probe_cpu(engine: Path | None) -> tuple[tuple[str, ...], Probe]:
    """The CPU features llama.cpp's CPU backend will use: what ``engine`` was built for and
    this CPU has, or (no engine, or one that does not say) what /proc/cpuinfo lists."""
    built_for = build_cpu_features(engine) if engine is not None else None
    if built_for is None or engine is None:
        features = cpu_features()
        return features, Probe("cpu", "found", f"features {', '.join(features) or 'none'} (from /proc/cpuinfo; the build may use fewer)")
    features = tuple(feature for feature in built_for if feature in cpu_features())
    return features, Probe("cpu", "found", f"features {', '.join(features) or 'none'} (as {engine.name} was built)")


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """Which of :data:`CPU_FEATURES` this CPU has, from the first processor's ``flags`` (x86)
    or ``Features`` (ARM) line; none when the file cannot be read (not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")[: 1 << 20]
    except OSError:
        return ()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(feature for feature in CPU_FEATURES if feature in present)
    return ()

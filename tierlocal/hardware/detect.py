"""What this machine has: GPUs (NVML, AMD and Intel sysfs, Apple unified memory, whatever
llama-server sees), system RAM, free disk and CPU cores.

Every probe that fails or is absent is reported as absent with a reason; a machine with
no GPU is a normal result, not an error. A GPU that shares the host's RAM (Apple silicon, an
AMD APU working from GTT, DGX Spark) is one pool counted once: what the GPU may use is not
also the host's (:func:`one_pool`).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from .. import constants
from ..catalog import GpuSpec, UnifiedSpec, find_pci_device, gpu_named_in, load_device_limits
from ..engines.llama_server import build_cpu_features, find_llama_server, list_devices
from .apple import probe_apple
from .types import Device, Hardware, Probe

__all__ = [
    "detect",
    "probe_nvml",
    "probe_amd_sysfs",
    "probe_intel_sysfs",
    "probe_apple",
    "probe_llama_server",
    "probe_cpu",
    "cpu_features",
    "cpu_vendor",
    "merge_engine_devices",
    "one_pool",
]

_GIB = 1024**3


ProbeFn = Callable[[], tuple[list[Device], Probe]]


def _bandwidth_for(description: str) -> int | None:
    spec = gpu_named_in(description)
    return spec.bandwidth_bytes_per_s if spec else None


def _max_buffer_for(description: str) -> int | None:
    limits = [limit.max_buffer_bytes for limit in load_device_limits() if limit.match.lower() in description.lower()]
    return min(limits) if limits else None


def _unified_nvidia(name: str, index: int, ram_total_bytes: int | None) -> Device | None:
    """A GPU NVML gives no memory for (DGX Spark's GB10 answers NOT_SUPPORTED): its unified
    machine's share of the host's RAM, if recipes/gpus.toml knows it."""
    spec = gpu_named_in(name)
    if not isinstance(spec, UnifiedSpec):
        return None
    pool = ram_total_bytes or int(psutil.virtual_memory().total)
    usable = int(pool * spec.gpu_share(pool))
    return Device(spec.name, spec.backend, usable, usable, spec.bandwidth_bytes_per_s, f"nvml:{index}", unified_pool_bytes=pool)


def probe_nvml(ram_total_bytes: int | None = None) -> tuple[list[Device], Probe]:
    """NVIDIA GPUs through NVML (nvidia-ml-py); a unified-memory GPU (GB10) as its share of
    ``ram_total_bytes`` (default: this machine's RAM)."""
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
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError_NotSupported:
                # DGX Spark (GB10): one coherent pool, no memory figure from NVML.
                unified = _unified_nvidia(name, index, ram_total_bytes)
                if unified is None:
                    raise
                devices.append(unified)
                continue
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


def _drm_cards(sysfs_root: Path, vendor_id: str) -> list[tuple[str, Path]]:
    """``(cardN, its device directory)`` for every DRM card of PCI vendor ``vendor_id``."""
    drm = sysfs_root / "class" / "drm"
    cards = []
    for card in sorted(drm.glob("card[0-9]*")) if drm.is_dir() else []:
        if re.fullmatch(r"card\d+", card.name) and _read_text(card / "device" / "vendor") == vendor_id:
            cards.append((card.name, card / "device"))
    return cards


def _sysfs_int(path: Path) -> int | None:
    """An integer sysfs file, decimal or ``0x`` hex; None when absent or not a number."""
    text = _read_text(path)
    try:
        return int(text, 0) if text else None
    except ValueError:
        return None


def probe_amd_sysfs(sysfs_root: Path = Path("/sys"), ram_total_bytes: int | None = None) -> tuple[list[Device], Probe]:
    """AMD GPUs through the amdgpu driver's sysfs files (``mem_info_vram_total`` / ``_used``).

    An APU that recipes/gpus.toml knows by its PCI id (Strix Halo) works from GTT — system RAM
    it maps, ``mem_info_gtt_total`` — when that is larger than its BIOS carve-out: then it is
    planned as a share of ``ram_total_bytes`` (one pool), not as VRAM beside the RAM."""
    devices, notes = [], []
    for card, device_dir in _drm_cards(sysfs_root, "0x1002"):
        total, used = _sysfs_int(device_dir / "mem_info_vram_total"), _sysfs_int(device_dir / "mem_info_vram_used")
        if total is None:
            continue
        spec = find_pci_device("amd", _read_text(device_dir / "device") or "")
        name = _read_text(device_dir / "product_name") or (spec.name if spec else f"AMD GPU ({card})")
        gtt = _sysfs_int(device_dir / "mem_info_gtt_total") or 0
        if isinstance(spec, UnifiedSpec) and gtt > total:
            gtt_used = _sysfs_int(device_dir / "mem_info_gtt_used") or 0
            pool = ram_total_bytes or int(psutil.virtual_memory().total)
            cap = int(pool * spec.gpu_share(pool))
            usable = min(gtt, cap)
            device = Device(
                spec.name, "rocm", usable, max(usable - gtt_used, 0), spec.bandwidth_bytes_per_s, f"amd-sysfs:{card}", unified_pool_bytes=pool
            )
            devices.append(device)
            note = f"{spec.name} maps {gtt / _GIB:.1f} GiB of system RAM as GTT (ttm.pages_limit sets it) beside {total / _GIB:.1f} GiB of VRAM"
            notes.append(
                note + (f", planned at {spec.gpu_share(pool):.0%} of RAM ({cap / _GIB:.1f} GiB) to leave the host its share" if gtt > cap else "")
            )
            continue
        bandwidth = spec.bandwidth_bytes_per_s if spec else _bandwidth_for(name)
        free = total - used if used is not None else total
        devices.append(Device(name, "rocm", total, max(free, 0), bandwidth, f"amd-sysfs:{card}"))
    if not devices:
        return [], Probe("amd-sysfs", "absent", f"no amdgpu device under {sysfs_root / 'class' / 'drm'}")
    return devices, Probe("amd-sysfs", "found", "; ".join([f"{len(devices)} AMD GPU(s)", *notes]))


def probe_intel_sysfs(sysfs_root: Path = Path("/sys")) -> tuple[list[Device], Probe]:
    """Intel Arc GPUs (xe or i915) that recipes/gpus.toml knows by PCI id. Their VRAM: the xe
    driver's ``tile0/physical_vram_size_bytes``, else Intel's out-of-tree i915's
    ``lmem_total_bytes``, else the card's datasheet size (neither mainline driver exposes the
    used share: free is reported as the total). Integrated GPUs are not listed."""
    devices, notes = [], []
    for card, device_dir in _drm_cards(sysfs_root, "0x8086"):
        spec = find_pci_device("intel", _read_text(device_dir / "device") or "")
        if not isinstance(spec, GpuSpec):
            continue
        total = _sysfs_int(device_dir / "tile0" / "physical_vram_size_bytes") or _sysfs_int(device_dir.parent / "lmem_total_bytes")
        if total is None:
            total = spec.memory_bytes
            notes.append(f"{card}: the driver gives no VRAM size, {spec.name}'s datasheet {total / _GIB:.0f} GiB used")
        devices.append(Device(spec.name, "sycl", total, total, spec.bandwidth_bytes_per_s, f"intel-sysfs:{card}"))
    if not devices:
        return [], Probe("intel-sysfs", "absent", "no Intel Arc GPU that recipes/gpus.toml knows by PCI id")
    return devices, Probe("intel-sysfs", "found", "; ".join([f"{len(devices)} Intel GPU(s)", *notes]))


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


def _same_device(engine_device: Device, vendor_device: Device) -> bool:
    description = engine_device.name.split(": ", 1)[-1]
    if vendor_device.name.lower() in description.lower():
        return True
    known = gpu_named_in(description)
    return known is not None and known == gpu_named_in(vendor_device.name)


def merge_engine_devices(vendor_devices: Sequence[Device], engine_devices: Sequence[Device]) -> list[Device]:
    """The vendor probes' devices and the engine's that none of them found. Where both see a
    unified-memory GPU, the engine's figures win: llama.cpp reads what the GPU may really use
    (Metal's recommendedMaxWorkingSetSize, HIP's or Vulkan's heap), which a wired limit or a
    newer macOS moves."""
    merged = list(vendor_devices)
    for device in engine_devices:
        same = next((index for index, vendor in enumerate(vendor_devices) if _same_device(device, vendor)), None)
        if same is None:
            merged.append(device)
        elif merged[same].unified_pool_bytes:
            vendor = merged[same]
            pool = vendor.unified_pool_bytes
            merged[same] = replace(
                vendor, total_bytes=min(device.total_bytes, pool), free_bytes=min(device.free_bytes, pool), source=f"{vendor.source}, {device.source}"
            )
    return merged


def one_pool(gpus: Sequence[Device], ram_available_bytes: int) -> tuple[tuple[Device, ...], int]:
    """A unified-memory GPU's free memory and the host's, counted once: what is free now, split
    as the pool is (the GPU's share of it, the host the rest; ``--gpu "M3 Max 64GB"`` plans the
    whole pool the same way), the GPU never above its own free figure."""
    unified = next((device for device in gpus if device.unified_pool_bytes), None)
    if unified is None:
        return tuple(gpus), ram_available_bytes
    share = min(unified.total_bytes / unified.unified_pool_bytes, 1.0)
    free = max(min(unified.free_bytes, int(ram_available_bytes * share)), 0)
    return tuple(replace(device, free_bytes=free) if device is unified else device for device in gpus), ram_available_bytes - free


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
        vendor_probes: the driver probes to run (default NVML, AMD and Intel sysfs); tests pass others.
    """
    memory = psutil.virtual_memory()
    total = int(memory.total)
    probes: list[Probe] = []
    gpus: list[Device] = []
    defaults: Sequence[ProbeFn] = (lambda: probe_nvml(total), lambda: probe_amd_sysfs(ram_total_bytes=total), probe_intel_sysfs)
    for probe in vendor_probes if vendor_probes is not None else defaults:
        found, result = probe()
        gpus.extend(found)
        probes.append(result)
    apple, apple_probe = probe_apple(total)
    gpus.extend(apple)
    probes.append(apple_probe)
    engine = llama_server or find_llama_server()  # found once, asked for devices and CPU features
    engine_gpus, engine_probe = probe_llama_server(engine)
    merged, available = one_pool(merge_engine_devices(gpus, engine_gpus), int(memory.available))
    probes.append(engine_probe)
    features, cpu_probe = probe_cpu(engine)
    probes.append(cpu_probe)
    disk_path, disk_free = _disk_free(models_dir or constants.models_dir())
    unified = next((device for device in merged if device.unified_pool_bytes), None)
    return Hardware(
        gpus=merged,
        ram_total_bytes=total,
        ram_available_bytes=available,
        cpu_cores=psutil.cpu_count(logical=False) or psutil.cpu_count() or 1,
        cpu_threads=psutil.cpu_count() or 1,
        disk_path=disk_path,
        disk_free_bytes=disk_free,
        probes=tuple(probes),
        cpu_arch=platform.machine().lower(),
        cpu_features=features,
        # The host reads the same memory as the GPU of a unified machine.
        ram_bandwidth_bytes_per_s=unified.bandwidth_bytes_per_s if unified else None,
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


#: /proc/cpuinfo's vendor_id → the vendor recipes/cpu_speed.toml names.
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``intel``, ``amd``, or "" (another vendor, or no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text(errors="replace")[: 1 << 20]
    except OSError:
        return ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "vendor_id":
            return _VENDORS.get(value.strip(), "")
    return ""


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

"""``--gpu``: the accelerators of another machine (or of this one with another size), by size
(``24GiB``), by name from recipes/gpus.toml (``RTX 4090``), or ``N×`` either; ``--ram`` and
``--ram-bandwidth``: another machine's system memory. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..catalog import close_gpu_names, find_gpu, find_unified, load_gpus
from ..errors import HardwareError, UsageError
from ..units import parse_bytes, parse_memory_size
from .types import Device, Hardware

__all__ = ["parse_gpu_override", "with_gpu_override", "with_ram_override"]

_MAX_OVERRIDE_COUNT = 1024
_VENDOR_BACKEND = {"nvidia": "cuda", "amd": "rocm", "apple": "metal"}
_COUNT_PREFIX = re.compile(r"^\s*(\d+)\s*[x×*]\s*(.+)$", re.IGNORECASE)
#: A unified-memory machine and its RAM: ``M3 Max 64GB``, ``Ryzen AI Max+ 395 128GB``.
_UNIFIED = re.compile(r"^(?P<name>.+?)\s*(?P<ram>\d+)\s*(?:GB|G|GiB)$", re.IGNORECASE)
#: A number with no unit or a size unit (``24``, ``24GiB``, ``0.5 TB``): read as a size, not a name.
_SIZE_LIKE = re.compile(r"^\s*\d+(?:\.\d+)?\s*(?:[kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_gpu_override(values: Sequence[str]) -> list[Device]:
    """Devices for ``--gpu`` values: a size (``24GiB``), a name (``RTX 4090``), or ``N×`` either (``2xH100``).

    Raises:
        HardwareError: a value is neither a size nor a GPU in recipes/gpus.toml.
    """
    devices: list[Device] = []
    for value in values:
        count, what = 1, value.strip()
        match = _COUNT_PREFIX.match(what)
        if match:
            count, what = int(match.group(1)), match.group(2).strip()
        if not 1 <= count <= _MAX_OVERRIDE_COUNT:
            raise HardwareError(f"--gpu {value!r}: count must be 1..{_MAX_OVERRIDE_COUNT}")
        spec = find_gpu(what)
        unified = _unified_device(what, value)
        if unified is not None:
            device = unified
        elif spec is not None:
            backend = _VENDOR_BACKEND.get(spec.vendor, spec.vendor)
            device = Device(spec.name, backend, spec.memory_bytes, spec.memory_bytes, spec.bandwidth_bytes_per_s, "--gpu")
        else:
            if _SIZE_LIKE.match(what):
                size = parse_memory_size(what, "--gpu")
            else:
                close = close_gpu_names(what)
                raise HardwareError(
                    f"--gpu {value!r} is neither a size nor a GPU we know" + (f" (did you mean {_either(close)}?)" if close else ""),
                    hint=(
                        f"give a size (24GiB), one of the {len(load_gpus())} GPUs of recipes/gpus.toml by name (RTX 4060, RTX 4090, H100 …), "
                        "a unified-memory machine with its RAM (M3 Max 64GB), or none"
                    ),
                )
            device = Device(f"{what} GPU", "override", size, size, None, "--gpu")
        devices.extend(replace(device, name=f"{device.name} #{index}") if count > 1 else device for index in range(count))
    return devices


def _unified_device(what: str, value: str) -> Device | None:
    """The GPU of a unified-memory machine (``M3 Max 64GB``): its default share of the pool,
    the pool itself carried along for the host's part; None when ``what`` names none.

    Raises:
        HardwareError: the machine is named without its RAM, or with a size it is not sold with.
    """
    match = _UNIFIED.match(what)
    spec = find_unified(match.group("name")) if match else None
    if spec is None:
        bare = find_unified(what)
        if bare is not None:
            example = bare.memory_options_gb[-1] if bare.memory_options_gb else 64
            raise HardwareError(f"--gpu {value!r}: how much RAM has it?", hint=f'name its unified memory too, e.g. --gpu "{bare.name} {example}GB"')
        return None
    assert match is not None
    ram_gb = int(match.group("ram"))
    if spec.memory_options_gb and ram_gb not in spec.memory_options_gb:
        sold = ", ".join(f"{size}GB" for size in spec.memory_options_gb)
        raise HardwareError(f"--gpu {value!r}: the {spec.name} is not sold with {ram_gb} GB", hint=f"its RAM options: {sold}")
    pool = ram_gb * 2**30  # unified memory is sold in binary gigabytes
    share = int(pool * spec.gpu_share(pool))
    name = f"{spec.name} {ram_gb}GB (unified)"
    return Device(name, spec.backend, share, share, spec.bandwidth_bytes_per_s, "--gpu", unified_pool_bytes=pool)


def _either(names: list[str]) -> str:
    """``A``, ``A or B``, ``A, B or C``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def with_gpu_override(hardware: Hardware, values: Sequence[str]) -> Hardware:
    """``hardware`` with its GPUs replaced by the ``--gpu`` values (host RAM and disk kept;
    ``--gpu none``: no GPU, a CPU-only machine planned from anywhere).

    Raises:
        HardwareError: a value is not a GPU, a size or a unified-memory machine.
    """
    if not values:
        return hardware
    if [value.strip().lower() for value in values] == ["none"]:
        return replace(hardware, gpus=(), overridden=True)
    devices = parse_gpu_override(values)
    # "--gpu 24GiB" on a machine with a GPU means "this GPU, with that much memory": the
    # detected device's binding limit still holds.
    limits = [device.max_tensor_bytes for device in hardware.gpus if device.max_tensor_bytes]
    if limits:
        devices = [replace(device, max_tensor_bytes=min(limits)) if device.backend == "override" else device for device in devices]
    unified = [device for device in devices if device.unified_pool_bytes]
    if not unified:
        return replace(hardware, gpus=tuple(devices), overridden=True)
    if len(devices) > 1:
        raise HardwareError("a unified-memory machine has one GPU: give it alone to --gpu", hint='e.g. --gpu "M3 Max 64GB"')
    (device,) = unified
    # One pool: what the GPU may use is not the host's as well.
    host = device.unified_pool_bytes - device.total_bytes
    return replace(
        hardware,
        gpus=(device,),
        ram_total_bytes=device.unified_pool_bytes,
        ram_available_bytes=host,
        ram_bandwidth_bytes_per_s=device.bandwidth_bytes_per_s,
        ram_overridden=True,
        overridden=True,
    )


def with_ram_override(hardware: Hardware, ram: str | None, bandwidth: str | None) -> Hardware:
    """``hardware`` with ``--ram SIZE`` as its system memory (all of it available: a machine
    planned for, not this one's current use) and ``--ram-bandwidth RATE`` (``80GB/s``).

    Raises:
        UsageError: a size or rate that is not one.
    """
    if ram is None and bandwidth is None:
        return hardware
    unified = next((device for device in hardware.gpus if device.unified_pool_bytes), None)
    if unified is not None and unified.source == "--gpu":
        raise UsageError(
            f"--gpu {unified.name.removesuffix(' (unified)')!r} already gives the machine's memory: one pool for its GPU and CPU",
            hint='leave out --ram and --ram-bandwidth (give the machine\'s RAM in --gpu, e.g. "M3 Max 64GB")',
        )
    if unified is not None:
        raise UsageError(
            f"this machine's {unified.name} shares one pool of memory between its GPU and CPU: --ram cannot describe its RAM apart",
            hint='describe another machine whole with --gpu (e.g. --gpu "M3 Max 64GB", or --gpu none --ram 64GiB for a CPU-only one)',
        )
    if ram is not None:
        size = parse_memory_size(ram, "--ram")
        hardware = replace(hardware, ram_total_bytes=size, ram_available_bytes=size, ram_overridden=True, overridden=True)
    if bandwidth is not None:
        text = bandwidth.strip()
        rate = parse_bytes(text[:-2] if text.lower().endswith("/s") else text)
        if rate <= 0:
            raise UsageError(f"--ram-bandwidth {bandwidth!r}: the rate must be positive", hint="e.g. --ram-bandwidth 80GB/s")
        hardware = replace(hardware, ram_bandwidth_bytes_per_s=rate, ram_overridden=True, overridden=True)
    return hardware

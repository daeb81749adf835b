"""The planner's view of a machine (:class:`~tierlocal.fit.estimate.Machine`) from the detected or
described hardware and the planning assumptions of recipes/gpus.toml [host]. Pure.
"""

from __future__ import annotations

from dataclasses import replace

from ..catalog import HostDefaults
from ..fit.estimate import GpuDevice, Machine
from ..fit.split import split_ratio
from ..hardware.types import Hardware

__all__ = ["machine_for", "without_gpu"]


def machine_for(hardware: Hardware, host: HostDefaults) -> Machine:
    """The GPUs (or none) and the host, with the planning assumptions. Several GPUs are split
    by layer in proportion to their free memory, as llama.cpp does by default."""
    if len(hardware.gpus) > 1:
        return _split_machine(hardware, host)
    gpu = max(hardware.gpus, key=lambda device: device.free_bytes) if hardware.gpus else None
    return Machine(
        gpu_name=gpu.name if gpu else None,
        gpu_backend=gpu.backend if gpu else None,
        gpu_total_bytes=gpu.total_bytes if gpu else 0,
        gpu_free_bytes=gpu.free_bytes if gpu else 0,
        gpu_bandwidth=gpu.bandwidth_bytes_per_s if gpu else None,
        host_total_bytes=hardware.ram_total_bytes,
        host_free_bytes=hardware.ram_available_bytes,
        host_bandwidth=hardware.ram_bandwidth_bytes_per_s or host.assumed_ram_bandwidth_bytes_per_s,
        gpu_overhead_bytes=host.gpu_runtime_overhead_bytes if gpu else 0,
        margin_bytes=host.fit_margin_bytes,
        max_tensor_bytes=gpu.max_tensor_bytes if gpu else None,
        cpu_arch=hardware.cpu_arch,
        cpu_features=hardware.cpu_features,
    )


def _split_machine(hardware: Hardware, host: HostDefaults) -> Machine:
    gpus = hardware.gpus
    first = gpus[0]
    bandwidths = [gpu.bandwidth_bytes_per_s for gpu in gpus]
    limits = [gpu.max_tensor_bytes for gpu in gpus if gpu.max_tensor_bytes]
    return Machine(
        gpu_name=first.name,
        gpu_backend=first.backend,
        gpu_total_bytes=sum(gpu.total_bytes for gpu in gpus),
        gpu_free_bytes=sum(gpu.free_bytes for gpu in gpus),
        # A token passes through every device in turn: the slowest bounds the read rate.
        gpu_bandwidth=None if None in bandwidths else min(b for b in bandwidths if b is not None),
        host_total_bytes=hardware.ram_total_bytes,
        host_free_bytes=hardware.ram_available_bytes,
        host_bandwidth=hardware.ram_bandwidth_bytes_per_s or host.assumed_ram_bandwidth_bytes_per_s,
        gpu_overhead_bytes=host.gpu_runtime_overhead_bytes,
        margin_bytes=host.fit_margin_bytes,
        max_tensor_bytes=min(limits) if limits else None,
        cpu_arch=hardware.cpu_arch,
        cpu_features=hardware.cpu_features,
        gpu_devices=tuple(GpuDevice(gpu.name, gpu.backend, gpu.total_bytes, gpu.free_bytes, gpu.max_tensor_bytes) for gpu in gpus),
        tensor_split=split_ratio([gpu.free_bytes for gpu in gpus]),
    )


def without_gpu(machine: Machine) -> Machine:
    """``machine`` with its GPUs left out: the CPU alone (llama-server's ``-dev none``)."""
    return replace(
        machine,
        gpu_name=None,
        gpu_backend=None,
        gpu_total_bytes=0,
        gpu_free_bytes=0,
        gpu_bandwidth=None,
        gpu_overhead_bytes=0,
        max_tensor_bytes=None,
        gpu_devices=(),
        tensor_split=(),
    )

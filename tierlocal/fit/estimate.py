"""The per-device memory of one llama-server run and whether it fits the machine. Pure.

Per device: weights + KV cache + compute buffer + output buffer + backend overhead, from the
rules in memory.py. The GPU must keep ``margin`` bytes free (llama.cpp's fit target); the
host must hold its resident part in available RAM. :mod:`.search` finds the run that fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .. import constants
from .memory import (
    ContextParams,
    compute_buffer_bytes,
    gpu_layers,
    host_compute_bytes,
    kv_cache,
    output_buffer_bytes,
    output_growth_bytes,
    server_context,
    weights_split,
)
from .model import ModelSpec
from .offload import partial_offload_compute_bytes
from .projector import ProjectorSpec, ProjectorUsage, projector_usage
from .split import PIPELINE_COPIES, boundary_copies_bytes, layer_devices, pipeline_inputs_bytes, weights_by_device

__all__ = ["RunRequest", "GpuDevice", "Machine", "DeviceUsage", "RunEstimate", "estimate_run"]


@dataclass(frozen=True)
class RunRequest:
    """What llama-server is asked for. ``ctx`` 0 = the model's trained context; ``parallel``
    None = llama-server's auto (4 slots, unified KV); ``ngl`` and ``n_cpu_moe`` None = let the
    planner choose, as llama-server's ``-ngl auto`` does (``ngl`` above the layer count, e.g.
    ``constants.NGL_ALL``, is every layer; ``n_cpu_moe``: keep the experts of the first N blocks
    on the CPU)."""

    ctx: int = 0
    parallel: int | None = 1
    ngl: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = True
    n_ubatch: int = constants.DEFAULT_UBATCH
    n_cpu_moe: int | None = None
    #: Full-size KV for sliding-window layers (llama.cpp's library default; llama-server turns
    #: it off, llama-cpp-python's server leaves it on).
    swa_full: bool = False
    #: Logits for every micro-batch token (llama-cpp-python) rather than one per sequence.
    all_outputs: bool = False
    #: A multimodal projector loaded beside the model (``--mmproj``), on the GPU unless
    #: ``projector_offload`` is False (``--no-mmproj-offload``).
    projector: ProjectorSpec | None = None
    projector_offload: bool = True
    #: One KV cache every slot shares (``--kv-unified``; None: llama-server's default, unified
    #: only for its auto slots). Without it, one batch holds only the requests of consecutive
    #: slots (``split_equal`` in src/llama-batch.cpp), so users at once share fewer steps.
    kv_unified: bool | None = None


@dataclass(frozen=True)
class GpuDevice:
    """One of several GPUs a model is split across. Bytes."""

    name: str
    backend: str
    total_bytes: int
    free_bytes: int
    max_tensor_bytes: int | None = None


@dataclass(frozen=True)
class Machine:
    """One GPU (or none) and the host. Bytes; bandwidth in bytes/s (None: unknown).

    With several GPUs, ``gpu_devices`` lists them in device order and ``tensor_split`` gives
    each one's share of the layers (llama-server's ``-ts``); the ``gpu_*`` fields then describe
    the first (its name, backend and bandwidth; free and total summed over all)."""

    gpu_name: str | None
    gpu_backend: str | None
    gpu_total_bytes: int
    gpu_free_bytes: int
    gpu_bandwidth: int | None
    host_total_bytes: int
    host_free_bytes: int
    host_bandwidth: int
    gpu_overhead_bytes: int
    margin_bytes: int
    max_tensor_bytes: int | None = None
    #: Added to the GPU's compute buffer: what recorded loads of the same model with the same
    #: engine showed the estimate to miss (bytes; 0 without a record).
    gpu_compute_correction_bytes: int = 0
    #: The host CPU's architecture (``x86_64``, ``aarch64``) and the instruction-set features
    #: that decide which weights the CPU backend repacks (``avx2``, ``avx512f``, ``asimddp``).
    cpu_arch: str = ""
    cpu_features: tuple[str, ...] = ()
    gpu_devices: tuple[GpuDevice, ...] = ()
    tensor_split: tuple[int, ...] = ()


@dataclass(frozen=True)
class DeviceUsage:
    """What one device holds, in bytes."""

    name: str
    backend: str
    total_bytes: int
    free_bytes: int
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    #: A multimodal projector's weights and compute buffer on this device.
    projector_bytes: int = 0
    #: What the output buffer grows by after load when every token is an output (embeddings):
    #: not in the load log, in what the device needs (:func:`~tierlocal.fit.memory.output_growth_bytes`).
    output_grows_by_bytes: int = 0

    @property
    def total_needed_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.output_bytes
            + self.output_grows_by_bytes
            + self.overhead_bytes
            + self.projector_bytes
        )

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "backend": self.backend,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "compute_bytes": self.compute_bytes,
            "output_bytes": self.output_bytes,
            "output_grows_by_bytes": self.output_grows_by_bytes,
            "overhead_bytes": self.overhead_bytes,
            "projector_bytes": self.projector_bytes,
            "total_needed_bytes": self.total_needed_bytes,
        }


@dataclass(frozen=True)
class RunEstimate:
    """The estimate of one configuration and whether it fits."""

    request: RunRequest
    params: ContextParams
    devices: tuple[DeviceUsage, ...]
    layers_offloaded: int
    layers_total: int
    fits: bool
    est_decode_tokens_per_s: float | None
    host_read_bytes_per_token: int = 0
    gpu_read_bytes_per_token: int = 0
    projector: ProjectorUsage | None = None
    #: Each GPU's share of the layers (``-ts``) when the model is split across several.
    tensor_split: tuple[int, ...] = ()


def estimate_run(spec: ModelSpec, request: RunRequest, machine: Machine) -> RunEstimate:
    """Memory per device for ``request`` with ``request.ngl`` layers offloaded (0 without a GPU)."""
    ngl = min(request.ngl, spec.n_layer + 1) if request.ngl is not None else 0  # -ngl all (or more) is every layer
    n_cpu_moe = request.n_cpu_moe or 0
    if machine.gpu_name is None:
        ngl = n_cpu_moe = 0
    params = _context(spec, request)
    on_gpu = gpu_layers(spec, ngl)
    kv = kv_cache(spec, params)
    kv_gpu = sum(size for size, offloaded in zip(kv.layer_bytes, on_gpu, strict=False) if offloaded)
    weights = weights_split(spec, ngl, n_cpu_moe=n_cpu_moe, max_tensor_bytes=machine.max_tensor_bytes)
    compute = compute_buffer_bytes(spec, params, flash_attn=request.flash_attn)
    output = output_buffer_bytes(spec, params)
    offloaded = sum(on_gpu)
    projector, gpu_projector, host_projector = _projector(request, machine)
    devices: list[DeviceUsage] = []
    host_compute = compute
    if machine.gpu_name is not None:
        gpu_compute = compute
        if (offloaded <= spec.n_layer or n_cpu_moe) and request.n_ubatch >= 32:
            gpu_compute = partial_offload_compute_bytes(spec, params, compute, on_gpu, n_cpu_moe, machine.max_tensor_bytes)
        gpu_compute = max(0, gpu_compute + machine.gpu_compute_correction_bytes)
        host_compute = host_compute_bytes(spec, params, flash_attn=request.flash_attn)
        if len(machine.gpu_devices) > 1:
            split, pipeline = _split_devices(spec, request, machine, params, ngl, n_cpu_moe, compute, gpu_compute, kv.layer_bytes)
            devices += [replace(split[0], projector_bytes=gpu_projector), *split[1:]]
            host_compute += pipeline
        else:
            devices.append(_one_gpu(machine, weights.gpu_bytes, kv_gpu, gpu_compute, gpu_projector))
    host = _host(machine, weights.cpu_bytes, kv.total_bytes - kv_gpu, host_compute, output, host_projector)
    devices.append(replace(host, output_grows_by_bytes=output_growth_bytes(spec, params)))
    gpu_ok = all(d.total_needed_bytes + machine.margin_bytes <= d.free_bytes for d in devices[:-1])
    host_ok = devices[-1].total_needed_bytes <= devices[-1].free_bytes
    return RunEstimate(
        request=replace(request, ngl=ngl, n_cpu_moe=n_cpu_moe),
        params=params,
        devices=tuple(devices),
        layers_offloaded=offloaded,
        layers_total=spec.n_layer + 1,
        fits=gpu_ok and host_ok,
        est_decode_tokens_per_s=_bandwidth_bound(weights.cpu_read_bytes, weights.gpu_read_bytes, machine),
        host_read_bytes_per_token=weights.cpu_read_bytes,
        gpu_read_bytes_per_token=weights.gpu_read_bytes,
        projector=projector,
        tensor_split=(machine.tensor_split or tuple(1 for _ in machine.gpu_devices)) if len(machine.gpu_devices) > 1 and machine.gpu_name else (),
    )


def _context(spec: ModelSpec, request: RunRequest) -> ContextParams:
    """The context llama-server creates for ``request``."""
    return server_context(
        spec,
        ctx=request.ctx,
        parallel=request.parallel,
        n_ubatch=request.n_ubatch,
        cache_type_k=request.cache_type_k,
        cache_type_v=request.cache_type_v,
        swa_full=request.swa_full,
        all_outputs=request.all_outputs,
        flash_attn=request.flash_attn,
        kv_unified=request.kv_unified,
    )


def _host(machine: Machine, weights: int, kv: int, compute: int, output: int, projector: int) -> DeviceUsage:
    """The host's part: weights and KV kept in RAM, its compute and output buffers (bytes)."""
    return DeviceUsage("host (CPU, RAM)", "cpu", machine.host_total_bytes, machine.host_free_bytes, weights, kv, compute, output, 0, projector)


def _bandwidth_bound(host_read_bytes: int, gpu_read_bytes: int, machine: Machine) -> float | None:
    """Tokens/s if each side read its weights at its memory bandwidth (None: the GPU's is unknown)."""
    seconds = host_read_bytes / machine.host_bandwidth
    if gpu_read_bytes:
        if machine.gpu_bandwidth is None:
            return None
        seconds += gpu_read_bytes / machine.gpu_bandwidth
    return None if not seconds else 1 / seconds


def _one_gpu(machine: Machine, weights: int, kv: int, compute: int, projector: int) -> DeviceUsage:
    assert machine.gpu_name is not None
    return DeviceUsage(
        machine.gpu_name,
        machine.gpu_backend or "gpu",
        machine.gpu_total_bytes,
        machine.gpu_free_bytes,
        weights,
        kv,
        compute,
        0,
        machine.gpu_overhead_bytes,
        projector,
    )


def _split_devices(
    spec: ModelSpec,
    request: RunRequest,
    machine: Machine,
    params: ContextParams,
    ngl: int,
    n_cpu_moe: int,
    compute: int,
    first_compute: int,
    kv_layer_bytes: Sequence[int],
) -> tuple[list[DeviceUsage], int]:
    """Each GPU of a layer split (:mod:`.split`), and the pipeline-parallel inputs the host's
    compute buffer adds (bytes). The first device takes the CPU layers' offloaded operations
    (``first_compute``); every device its own graph's peak, plus the pipeline copies when
    every layer is offloaded and no tensor is overridden."""
    gpus = machine.gpu_devices
    ratio = machine.tensor_split or tuple(1 for _ in gpus)
    placement = layer_devices(spec, ngl, ratio)
    max_tensor = min((g.max_tensor_bytes for g in gpus if g.max_tensor_bytes), default=None)
    weights = weights_by_device(spec, placement, len(gpus), n_cpu_moe=n_cpu_moe, max_tensor_bytes=max_tensor)
    pipelined = ngl > spec.n_layer and not n_cpu_moe
    pipeline = pipeline_inputs_bytes(spec, params, flash_attn=request.flash_attn) if pipelined else 0
    boundary = boundary_copies_bytes(spec, params, placement, len(gpus), copies=PIPELINE_COPIES if pipelined else 1, compute=compute)
    devices = []
    for index, gpu in enumerate(gpus):
        kv = sum(size for size, device in zip(kv_layer_bytes, placement, strict=False) if device == index)
        own = first_compute if index == 0 else compute
        devices.append(
            DeviceUsage(
                gpu.name,
                gpu.backend,
                gpu.total_bytes,
                gpu.free_bytes,
                weights[index],
                kv,
                own + pipeline + boundary[index],
                0,
                machine.gpu_overhead_bytes,
                0,
            )
        )
    return devices, pipeline


def _projector(request: RunRequest, machine: Machine) -> tuple[ProjectorUsage | None, int, int]:
    """The requested projector's usage, and its bytes on the GPU and in system RAM."""
    if request.projector is None:
        return None, 0, 0
    usage = projector_usage(
        request.projector,
        on_gpu=machine.gpu_name is not None and request.projector_offload,
        flash_attn=request.flash_attn,
        max_tensor_bytes=machine.max_tensor_bytes,
    )
    if usage.on_gpu:
        return usage, usage.device_bytes, usage.host_compute_bytes
    return usage, 0, usage.device_bytes

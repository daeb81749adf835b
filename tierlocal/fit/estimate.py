"""The per-device memory of one llama-server run, and the plan that fits a machine. Pure.

Per device: weights + KV cache + compute buffer + output buffer + backend overhead, from the
rules in memory.py. The GPU must keep ``margin`` bytes free (llama.cpp's fit target); the
host must hold its resident part in available RAM. The planner picks the largest ``-ngl``
that fits, and solves for the context (``--ctx max``) or the slots (``--parallel max``).
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
    server_context,
    weights_split,
)
from .model import ModelSpec
from .offload import partial_offload_compute_bytes
from .projector import ProjectorSpec, ProjectorUsage, projector_usage
from .split import PIPELINE_COPIES, boundary_copies_bytes, layer_devices, pipeline_inputs_bytes, weights_by_device

__all__ = ["RunRequest", "GpuDevice", "Machine", "DeviceUsage", "RunEstimate", "estimate_run", "plan_run", "max_context", "max_parallel"]

_CTX_STEP = 256
_MAX_SLOTS = 256


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

    @property
    def total_needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes + self.overhead_bytes + self.projector_bytes

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
    params = server_context(
        spec, ctx=request.ctx, parallel=request.parallel, n_ubatch=request.n_ubatch, cache_type_k=request.cache_type_k, cache_type_v=request.cache_type_v,
        swa_full=request.swa_full, all_outputs=request.all_outputs, flash_attn=request.flash_attn,
    )  # fmt: skip
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
    devices.append(
        DeviceUsage(
            "host (CPU, RAM)", "cpu", machine.host_total_bytes, machine.host_free_bytes,
            weights.cpu_bytes, kv.total_bytes - kv_gpu, host_compute, output, 0, host_projector,
        )
    )  # fmt: skip
    gpu_ok = all(d.total_needed_bytes + machine.margin_bytes <= d.free_bytes for d in devices[:-1])
    host_ok = devices[-1].total_needed_bytes <= devices[-1].free_bytes
    seconds: float | None = weights.cpu_read_bytes / machine.host_bandwidth
    if weights.gpu_read_bytes:
        seconds = None if machine.gpu_bandwidth is None else seconds + weights.gpu_read_bytes / machine.gpu_bandwidth  # type: ignore[operator]
    return RunEstimate(
        request=replace(request, ngl=ngl, n_cpu_moe=n_cpu_moe),
        params=params,
        devices=tuple(devices),
        layers_offloaded=offloaded,
        layers_total=spec.n_layer + 1,
        fits=gpu_ok and host_ok,
        est_decode_tokens_per_s=None if not seconds else 1 / seconds,
        host_read_bytes_per_token=weights.cpu_read_bytes,
        gpu_read_bytes_per_token=weights.gpu_read_bytes,
        projector=projector,
        tensor_split=(machine.tensor_split or tuple(1 for _ in machine.gpu_devices)) if len(machine.gpu_devices) > 1 and machine.gpu_name else (),
    )


def _one_gpu(machine: Machine, weights: int, kv: int, compute: int, projector: int) -> DeviceUsage:
    assert machine.gpu_name is not None
    return DeviceUsage(
        machine.gpu_name, machine.gpu_backend or "gpu", machine.gpu_total_bytes, machine.gpu_free_bytes, weights, kv, compute, 0, machine.gpu_overhead_bytes,
        projector,
    )  # fmt: skip


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
                gpu.name, gpu.backend, gpu.total_bytes, gpu.free_bytes, weights[index], kv, own + pipeline + boundary[index], 0,
                machine.gpu_overhead_bytes, 0,
            )
        )  # fmt: skip
    return devices, pipeline


def _projector(request: RunRequest, machine: Machine) -> tuple[ProjectorUsage | None, int, int]:
    """The requested projector's usage, and its bytes on the GPU and in system RAM."""
    if request.projector is None:
        return None, 0, 0
    usage = projector_usage(
        request.projector, on_gpu=machine.gpu_name is not None and request.projector_offload, flash_attn=request.flash_attn,
        max_tensor_bytes=machine.max_tensor_bytes,
    )  # fmt: skip
    if usage.on_gpu:
        return usage, usage.device_bytes, usage.host_compute_bytes
    return usage, 0, usage.device_bytes


def _gpu_fits(candidate: RunEstimate, machine: Machine) -> bool:
    return all(gpu.total_needed_bytes + machine.margin_bytes <= gpu.free_bytes for gpu in candidate.devices[:-1])


def _faster(a: RunEstimate, b: RunEstimate) -> RunEstimate:
    """The plan that decodes faster (bandwidth bound). Without the GPU's bandwidth, the one
    that reads fewer weight bytes from system RAM per token (RAM is the slow side); ``a``
    on a tie."""
    if a.est_decode_tokens_per_s is None or b.est_decode_tokens_per_s is None:
        return b if b.host_read_bytes_per_token < a.host_read_bytes_per_token else a
    return b if b.est_decode_tokens_per_s > a.est_decode_tokens_per_s else a


def plan_run(spec: ModelSpec, request: RunRequest, machine: Machine) -> RunEstimate:
    """The request with the largest ``-ngl`` that fits (the user's ``ngl`` is kept as given).
    For a MoE model that does not fit whole, also every layer on the GPU with the experts of
    the first N blocks on the CPU (``--n-cpu-moe N``, the smallest N that fits); the faster
    of the two wins. A projector that does not fit the GPU even with no layers there is
    planned in system RAM (``--no-mmproj-offload``). If nothing fits, the CPU-only estimate (``fits`` False when even that
    does not)."""
    if machine.gpu_name is None or (request.ngl is not None and request.n_cpu_moe is not None):
        return estimate_run(spec, request, machine)
    if request.projector is not None and request.projector_offload and not _gpu_fits(estimate_run(spec, replace(request, ngl=0), machine), machine):
        request = replace(request, projector_offload=False)  # the projector alone does not fit the GPU: keep it in RAM
    by_layers = (
        _largest_ngl(spec, replace(request, n_cpu_moe=request.n_cpu_moe or 0), machine)
        if request.ngl is None
        else estimate_run(spec, replace(request, n_cpu_moe=0), machine)
    )
    if request.n_cpu_moe is not None or not spec.n_expert or by_layers.layers_offloaded == by_layers.layers_total:
        return by_layers
    all_layers = replace(request, ngl=spec.n_layer + 1)
    low, high, by_experts = 1, spec.n_layer, None
    while low <= high:  # fewer blocks with experts on the CPU means more GPU memory
        middle = (low + high) // 2
        candidate = estimate_run(spec, replace(all_layers, n_cpu_moe=middle), machine)
        if _gpu_fits(candidate, machine):
            by_experts, high = candidate, middle - 1
        else:
            low = middle + 1
    return by_layers if by_experts is None else _faster(by_layers, by_experts)


def _largest_ngl(spec: ModelSpec, request: RunRequest, machine: Machine) -> RunEstimate:
    whole = estimate_run(spec, replace(request, ngl=spec.n_layer + 1), machine)
    if _gpu_fits(whole, machine):  # every layer fits: nothing to search
        return whole
    best = estimate_run(spec, replace(request, ngl=0), machine)
    low, high = 1, spec.n_layer
    while low <= high:  # memory grows with -ngl on the GPU: binary search the largest that fits
        middle = (low + high) // 2
        candidate = estimate_run(spec, replace(request, ngl=middle), machine)
        if _gpu_fits(candidate, machine):
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best


def max_context(spec: ModelSpec, request: RunRequest, machine: Machine) -> RunEstimate | None:
    """The largest context (a multiple of 256, up to the trained one per slot) that fits: keeping every
    layer on the GPU when the smallest context allows that, else with -ngl re-planned for
    each context (layers then run from RAM). None if even 256 tokens do not fit."""
    floor = plan_run(spec, replace(request, ctx=_CTX_STEP), machine)
    if not floor.fits:
        return None
    keep_full_offload = machine.gpu_name is not None and floor.layers_offloaded == floor.layers_total

    def acceptable(candidate: RunEstimate) -> bool:
        return candidate.fits and (not keep_full_offload or candidate.layers_offloaded == candidate.layers_total)

    best = floor
    low, high = 2, spec.n_ctx_train * (request.parallel or 1) // _CTX_STEP  # each slot up to the trained context
    while low <= high:
        middle = (low + high) // 2
        candidate = plan_run(spec, replace(request, ctx=middle * _CTX_STEP), machine)
        if acceptable(candidate):
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best


def max_parallel(spec: ModelSpec, request: RunRequest, machine: Machine) -> RunEstimate | None:
    """The most slots, each with ``request.ctx`` tokens of its own, that fit (None if one does not)."""
    per_slot = request.ctx or spec.n_ctx_train

    def with_slots(slots: int) -> RunEstimate:
        return plan_run(spec, replace(request, ctx=per_slot * slots, parallel=slots), machine)

    best = with_slots(1)
    if not best.fits:
        return None
    low, high = 2, _MAX_SLOTS
    while low <= high:
        middle = (low + high) // 2
        candidate = with_slots(middle)
        full_offload = candidate.layers_offloaded == best.layers_offloaded
        if candidate.fits and full_offload:
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best

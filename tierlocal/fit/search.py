"""The run that fits a machine: the largest ``-ngl`` (or, for a mixture of experts, every layer
on the GPU with the experts of the first blocks in RAM, when that decodes faster), the longest
context (``--ctx max``) or the most slots (``--parallel max``), each by a binary search over
:func:`~.estimate.estimate_run` (memory grows with each). Pure.
"""

from __future__ import annotations

from dataclasses import replace

from .estimate import Machine, RunEstimate, RunRequest, estimate_run
from .model import ModelSpec

__all__ = ["plan_run", "max_context", "max_parallel"]

_CTX_STEP = 256
_MAX_SLOTS = 256


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

"""Several GPUs: how llama.cpp splits a model's layers across them (``-sm layer``, ``-ts``) and
what each then holds. Pure.

The layers are assigned by cumulative share of ``-ts`` (by free memory when it is not given);
each device holds its layers' weights and KV cache and a compute buffer of its own; with every
layer offloaded llama.cpp also turns on pipeline parallelism, which keeps several copies of
each split's inputs (:func:`pipeline_inputs_bytes`). Checked with two of llama.cpp's RPC
devices on the CPU build (tests/test_split.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from .memory import ContextParams, has_attention, mask_cells
from .model import ModelSpec
from .placement import embedding_binds, placement_groups

__all__ = ["layer_devices", "weights_by_device", "pipeline_inputs_bytes", "boundary_copies_bytes", "PIPELINE_COPIES", "split_ratio"]


def layer_devices(spec: ModelSpec, ngl: int, split: Sequence[float]) -> tuple[int, ...]:
    """The GPU (0, 1 …; -1 the CPU) of each of the n_layer + 1 layers under ``-ngl ngl -ts
    split`` with llama.cpp's layer split (llama-model.cpp ``load_tensors``): the offloaded
    layers are the last ``ngl``; layer ``il`` goes to the first device whose cumulative share
    of ``split`` exceeds (il − first offloaded) ÷ offloaded (``std::upper_bound``)."""
    n_layers = spec.n_layer + 1
    start, offloaded = max(n_layers - max(ngl, 0), 0), min(max(ngl, 0), n_layers)
    total = sum(split)
    bounds = list(itertools.accumulate(share / total for share in split)) if total > 0 else [1.0]
    return tuple(
        -1 if il < start or offloaded == 0 else min(bisect.bisect_right(bounds, (il - start) / offloaded), len(bounds) - 1) for il in range(n_layers)
    )


def weights_by_device(
    spec: ModelSpec, devices: Sequence[int], n_devices: int, *, n_cpu_moe: int = 0, max_tensor_bytes: int | None = None
) -> list[int]:
    """Bytes of weights on each GPU for a layer split (``devices`` from :func:`layer_devices`),
    by the rules of :func:`weights_split` (whose ``gpu_bytes`` is their sum): experts of the
    first ``n_cpu_moe`` blocks and tensors the devices cannot bind stay on the CPU, a tied
    output is the embedding again on the output layer's device."""
    sizes = [0] * n_devices
    for group in placement_groups(spec, max_tensor_bytes):
        kept_on_cpu = group.expert and 0 <= group.layer < n_cpu_moe
        if group.layer >= 0 and devices[group.layer] >= 0 and group.binds and not kept_on_cpu:
            sizes[devices[group.layer]] += group.n_bytes
    output_device = devices[spec.n_layer]
    if spec.tied_output and output_device >= 0 and (max_tensor_bytes is None or embedding_binds(spec, max_tensor_bytes)):
        sizes[output_device] += spec.token_embd_bytes
    return sizes


#: Share of a device's compute buffer added where a Mamba-2 block's tail crosses onto it
#: (boundary_copies_bytes): the spread of the engine's peak over the layers the device holds.
BOUNDARY_MARGIN = 0.02
#: Copies of a split's inputs llama.cpp's scheduler keeps with pipeline parallelism
#: (GGML_SCHED_MAX_COPIES).
PIPELINE_COPIES = 4


def pipeline_inputs_bytes(spec: ModelSpec, params: ContextParams, *, flash_attn: bool = True) -> int:
    """What pipeline parallelism adds to each device's compute buffer, the host's included
    (bytes): the scheduler keeps PIPELINE_COPIES copies of a split's inputs — the hidden state
    (n_ubatch × n_embd f32) and the attention masks (f16 with flash attention) — where one
    would do. llama.cpp turns it on with several GPUs, every layer offloaded, a layer split and
    no tensor overrides (``--n-cpu-moe`` is one). Measured with two RPC devices on the CPU
    build: +24.04 MiB on each device and the host for Llama-3.2-1B at 4,096 tokens."""
    n_tokens = min(params.n_ctx_seq, params.n_ubatch)
    masks = sum(cells * n_tokens * (2 if flash_attn else 4) for cells in mask_cells(spec, params)) if has_attention(spec) else 0
    return (PIPELINE_COPIES - 1) * (n_tokens * spec.n_embd * 4 + masks)


def boundary_copies_bytes(
    spec: ModelSpec, params: ContextParams, placement: Sequence[int], n_devices: int, *, copies: int, compute: int = 0
) -> list[int]:
    """What each device's compute buffer adds where a recurrent block ends at a device boundary
    (bytes; ``copies``: PIPELINE_COPIES with pipeline parallelism, else 1; ``compute``: a
    device's own compute buffer, for the margin).

    llama.cpp's scheduler (ggml-backend.cpp) puts the state nodes of the first recurrent block on
    device k+1 there, and its "expand down" pass moves the weight-free tail of the block before
    them (device k) along: for Mamba-2 the ``ggml_cont`` of the gate, whose source — the block's
    whole input projection — is then copied to k+1 and the result back to k; for RWKV-7 the
    channel mix's token shift. Copies across devices are kept ``copies`` times and never freed.
    Nemotron-H and Granite-4.0-H expand only the final output, so a boundary after a Mamba-2
    block whose next attention-or-recurrent block is recurrent pays it; RWKV-7 pays at every
    boundary, and device 0 one hidden state more (block 0's value, needed everywhere).
    Measured with two RPC devices (CPU build): Nemotron-Nano-9B-v2, Granite-4.0-H-350M and
    RWKV-7-168M, every device within −1.9…+5.6% with the rest of the plan. Which layers a device
    holds moves its peak by up to ±1.5% (368–379 MiB for one Nemotron boundary), so a device
    that takes a Mamba-2 boundary's copies is planned BOUNDARY_MARGIN of its own compute buffer
    higher: the plan must not come out under the engine's."""
    extra = [0] * n_devices
    n_tokens = min(params.n_ctx_seq, params.n_ubatch)
    hidden = 4 * n_tokens * spec.n_embd
    d_inner, d_state, groups, heads = spec.mamba
    boundaries = [il for il in range(1, spec.n_layer) if placement[il - 1] >= 0 and placement[il] >= 0 and placement[il] != placement[il - 1]]
    if spec.architecture == "rwkv7" and boundaries:
        extra[placement[boundaries[0] - 1]] += hidden
        for il in boundaries:
            extra[placement[il]] += 3 * copies * hidden
            extra[placement[il - 1]] += copies * hidden
        return extra
    if not (groups and d_inner):  # Mamba-2 mixers only
        return extra
    d_in_proj = 2 * d_inner + 2 * groups * d_state + heads
    for il in boundaries:
        after = next((layer for layer in range(il, spec.n_layer) if placement[layer] == placement[il] and _mixes(spec, layer)), None)
        before = next((layer for layer in range(il - 1, -1, -1) if _mixes(spec, layer)), None)
        if after is not None and before is not None and spec.is_recurrent[after] and spec.is_recurrent[before]:
            extra[placement[il]] += copies * 4 * ((n_tokens - 1) * d_in_proj + d_inner) + round(BOUNDARY_MARGIN * compute)
            extra[placement[il - 1]] += copies * 4 * n_tokens * d_inner
    return extra


def _mixes(spec: ModelSpec, layer: int) -> bool:
    """Whether block ``layer`` attends or runs a recurrent mixer (not a feed-forward-only block)."""
    return spec.is_recurrent[layer] or spec.n_head_kv[layer] > 0


def split_ratio(free_bytes: Sequence[int]) -> tuple[int, ...]:
    """``-ts`` in proportion to free memory, as small whole numbers: the MiB each device has
    free, divided by their greatest common divisor (24 GiB and 12 GiB give 2,1)."""
    mib = [max(free // 2**20, 1) for free in free_bytes]
    divisor = 0
    for value in mib:
        divisor = math.gcd(divisor, value)
    return tuple(value // divisor for value in mib)

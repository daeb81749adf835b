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

from .memory import EXPERT_TENSOR, ContextParams, device_binds, mask_cells
from .model import ModelSpec

__all__ = ["layer_devices", "weights_by_device", "pipeline_inputs_bytes", "PIPELINE_COPIES", "split_ratio"]


def layer_devices(spec: ModelSpec, ngl: int, split: Sequence[float]) -> tuple[int, ...]:
    """The GPU (0, 1 …; -1 the CPU) of each of the n_layer + 1 layers under ``-ngl ngl -ts
    split`` with llama.cpp's layer split (llama-model.cpp ``load_tensors``): the offloaded
    layers are the last ``ngl``; layer ``il`` goes to the first device whose cumulative share
    of ``split`` exceeds (il − first offloaded) ÷ offloaded (``std::upper_bound``)."""
    n_layers = spec.n_layer + 1
    start, offloaded = max(n_layers - max(ngl, 0), 0), min(max(ngl, 0), n_layers)
    total = sum(split)
    bounds = list(itertools.accumulate(share / total for share in split)) if total > 0 else [1.0]
    return tuple(-1 if il < start or offloaded == 0 else min(bisect.bisect_right(bounds, (il - start) / offloaded), len(bounds) - 1) for il in range(n_layers))


def weights_by_device(spec: ModelSpec, devices: Sequence[int], n_devices: int, *, n_cpu_moe: int = 0, max_tensor_bytes: int | None = None) -> list[int]:
    """Bytes of weights on each GPU for a layer split (``devices`` from :func:`layer_devices`),
    by the rules of :func:`weights_split` (whose ``gpu_bytes`` is their sum): experts of the
    first ``n_cpu_moe`` blocks and tensors the devices cannot bind stay on the CPU, a tied
    output is the embedding again on the output layer's device."""
    sizes = [0] * n_devices
    for tensor in spec.tensors:
        kept_on_cpu = 0 <= tensor.layer < n_cpu_moe and EXPERT_TENSOR.search(tensor.name) is not None
        if tensor.layer >= 0 and devices[tensor.layer] >= 0 and not kept_on_cpu and device_binds(tensor, max_tensor_bytes, spec.n_expert_used or 1):
            sizes[devices[tensor.layer]] += tensor.n_bytes
    embedding = spec.embedding
    output_device = devices[spec.n_layer]
    if spec.tied_output and output_device >= 0 and (embedding is None or device_binds(embedding, max_tensor_bytes, spec.n_expert_used or 1)):
        sizes[output_device] += spec.token_embd_bytes
    return sizes


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
    masks = sum(cells * n_tokens * (2 if flash_attn else 4) for cells in mask_cells(spec, params))
    return (PIPELINE_COPIES - 1) * (n_tokens * spec.n_embd * 4 + masks)


def split_ratio(free_bytes: Sequence[int]) -> tuple[int, ...]:
    """``-ts`` in proportion to free memory, as small whole numbers: the MiB each device has
    free, divided by their greatest common divisor (24 GiB and 12 GiB give 2,1)."""
    mib = [max(free // 2**20, 1) for free in free_bytes]
    divisor = 0
    for value in mib:
        divisor = math.gcd(divisor, value)
    return tuple(value // divisor for value in mib)

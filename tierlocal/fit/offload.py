"""A GPU's compute buffer when some layers (or experts) stay on the CPU: llama.cpp offloads
their large-batch operations to the GPU and copies their weights in. Pure."""

from __future__ import annotations

from .memory import ContextParams, expert_flags, kv_cache, mask_cells, tensor_binds
from .model import ModelSpec

__all__ = ["partial_offload_compute_bytes", "largest_copies"]


def partial_offload_compute_bytes(
    spec: ModelSpec, params: ContextParams, compute: int, on_gpu: tuple[bool, ...], n_cpu_moe: int = 0, max_tensor_bytes: int | None = None
) -> int:
    """The GPU's compute buffer when some layers (or experts) stay on the CPU (bytes).

    llama.cpp offloads a CPU layer's large-batch operations to the GPU (``--op-offload``, on
    by default, for batches of 32+ tokens), copying their weights into this buffer. The peak
    is the largest of:

    - the graph's own peak (``compute``) plus one f32 hidden state (n_ubatch × n_embd) staged
      across the CPU/GPU boundary;
    - a dense weight copy with its f32 input and output (n_ubatch × (n_embd + n_ff)), plus the
      staged state: usually inside the graph's peak;
    - an expert tensor copy (all experts of one projection, for MUL_MAT_ID) with the expert
      feed-forward's f32 intermediates (n_ubatch × (3·n_used·n_ff_exp + n_used·n_embd)), the
      f16 masks, and one layer's K and V copied in when attention layers stay on the CPU.

    A weight larger than the device can bind (``max_tensor_bytes``) is not copied: its
    operation stays on the CPU (Qwen3-Next's 288 MiB expert tensors on llvmpipe's 128 MiB).

    Measured on the Vulkan build (llvmpipe) with bench/estimate_accuracy.py, -ngl 0..19 on
    Gemma 3 270M, Llama-3-8B, Qwen3-8B, Qwen3-30B-A3B (also --n-cpu-moe) and LFM2-1.2B: this
    buffer within 15%, per-device totals within −2.4…+4.8%. On CUDA (H200, 2026-11-30): 132 vs
    129.5 MiB for 14 of Llama-3-8B's 33 layers, 184 vs 176 MiB with Qwen3-30B-A3B's experts of
    27 blocks on the CPU.
    """
    n_tokens = min(params.n_ctx_seq, params.n_ubatch)
    staged = n_tokens * spec.n_embd * 4
    cpu_layers = [layer for layer in range(spec.n_layer) if not on_gpu[layer] or layer < n_cpu_moe]
    largest = largest_copies(spec, max_tensor_bytes)
    dense = max((largest[layer][0] for layer in cpu_layers), default=0)
    experts = max((largest[layer][1] for layer in cpu_layers), default=0)
    peak = max(compute, dense + n_tokens * 4 * (spec.n_embd + max(spec.n_ff, spec.n_ff_exp))) + staged
    if experts:
        kv = kv_cache(spec, params)
        attention_on_cpu = any(not on_gpu[layer] for layer in cpu_layers)
        expert_floats = 3 * spec.n_expert_used * spec.n_ff_exp + spec.n_expert_used * spec.n_embd
        expert_peak = (
            experts
            + n_tokens * 4 * expert_floats
            + sum(cells * n_tokens * 2 for cells in mask_cells(spec, params))
            + (max(kv.layer_bytes, default=0) if attention_on_cpu else 0)
        )
        peak = max(peak, expert_peak)
    return peak


def largest_copies(spec: ModelSpec, max_tensor_bytes: int | None) -> tuple[tuple[int, int], ...]:
    """Per block: the largest dense and the largest expert tensor the device can bind (bytes; 0
    where there is none) — what a CPU block's offloaded operation copies in. Computed once per
    spec and device limit (every -ngl a planner tries asks)."""
    table = spec.plan_cache.setdefault("largest_copies", {})
    if max_tensor_bytes not in table:
        expert, binds = expert_flags(spec), tensor_binds(spec, max_tensor_bytes)
        largest = [[0, 0] for _ in range(spec.n_layer)]
        for index, tensor in enumerate(spec.tensors):
            if 0 <= tensor.layer < spec.n_layer and binds[index]:
                sizes = largest[tensor.layer]
                kind = 1 if expert[index] else 0
                sizes[kind] = max(sizes[kind], tensor.n_bytes)
        table[max_tensor_bytes] = tuple((dense, experts) for dense, experts in largest)
    return table[max_tensor_bytes]

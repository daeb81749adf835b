"""Per-device memory of a llama.cpp load: layer placement and the KV cache. Pure.

Rules from llama.cpp (vendored in llama-cpp-python 0.3.36), src/llama-context.cpp and
src/llama-kv-cache-iswa.cpp:

- n_ctx is padded to 256. With a unified KV cache every sequence shares one stream of n_ctx
  cells; otherwise each of n_seq_max streams gets n_ctx_seq = pad(n_ctx / n_seq_max, 256).
- llama-server: ``-np`` left at auto means 4 slots sharing a unified cache; an explicit
  ``-np N`` means N separate streams.
- Sliding-window layers keep pad(min(n_ctx_seq, n_swa × (unified ? n_seq_max : 1) + n_ubatch), 256)
  cells per stream (all n_ctx_seq with ``--swa-full``).
- A layer's K and V take head size × KV heads elements per cell in the cache type
  (f16 2 bytes; q8_0 34 per 32; q4_0 18 per 32). MLA models (DeepSeek-V2 style GGUFs with
  key_length_mla) cache only K: the latent plus its rope part (kv_lora_rank + rope dims).
- Recurrent layers of hybrids keep (n_embd_r + n_embd_s) float32 values per sequence
  (max(1, n_seq_max) cells), independent of the context.
- ``-ngl N`` offloads the last N of the n_layer + 1 layers, the output layer first:
  layers il ≥ max(n_layer + 1 − N, 0) go to the GPU. A layer's KV lives with the layer
  (all on the CPU with ``--no-kv-offload``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import constants
from ..errors import UsageError
from ..gguf.tables import GGML_QUANT_SIZES, GGMLQuantizationType
from .model import ModelSpec
from .placement import EXPERT_TENSOR, SUPPORT_TEST_TOKENS, WeightsSplit, device_binds, expert_flags, gpu_layers, tensor_binds, weights_split
from .recurrent import rwkv7_compute_bytes

__all__ = [
    "ContextParams",
    "KvCache",
    "WeightsSplit",
    "server_context",
    "kv_cache",
    "gpu_layers",
    "weights_split",
    "expert_flags",
    "tensor_binds",
    "device_binds",
    "SUPPORT_TEST_TOKENS",
    "output_buffer_bytes",
    "output_growth_bytes",
    "compute_buffer_bytes",
    "host_compute_bytes",
    "has_attention",
    "cache_type_bytes",
    "mask_cells",
    "EXPERT_TENSOR",
]

_PAD = 256


def _pad(value: int, multiple: int = _PAD) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ContextParams:
    """What a llama context is created with: tokens, sequences, cache layout and types."""

    n_ctx: int
    n_seq_max: int
    kv_unified: bool
    n_ubatch: int = constants.DEFAULT_UBATCH
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    kv_offload: bool = True
    #: Logits reserved for every token of a micro-batch (llama.cpp's library default, which
    #: llama-cpp-python keeps) instead of one per sequence (llama-server).
    all_outputs: bool = False
    #: Without flash attention V is stored transposed, each row as wide as the widest layer's.
    flash_attn: bool = True

    @property
    def n_ctx_padded(self) -> int:
        """n_ctx as llama.cpp uses it: padded to 256, then rounded to whole streams."""
        n_ctx = _pad(self.n_ctx)
        return n_ctx if self.kv_unified else self.n_ctx_seq * self.n_seq_max

    @property
    def n_ctx_seq(self) -> int:
        """Cells per stream."""
        n_ctx = _pad(self.n_ctx)
        return n_ctx if self.kv_unified else _pad(n_ctx // self.n_seq_max)

    @property
    def n_stream(self) -> int:
        return 1 if self.kv_unified else self.n_seq_max


def server_context(
    spec: ModelSpec,
    *,
    ctx: int = 0,
    parallel: int | None = None,
    n_ubatch: int = constants.DEFAULT_UBATCH,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    swa_full: bool = False,
    kv_offload: bool = True,
    all_outputs: bool = False,
    flash_attn: bool = True,
    kv_unified: bool | None = None,
) -> ContextParams:
    """The context llama-server creates for ``-c ctx -np parallel`` (0 / None: its defaults; ``kv_unified``
    None: unified for its auto slots only, as llama-server decides)."""
    if parallel is not None and parallel < 1:
        raise UsageError(f"parallel slots must be at least 1, not {parallel}")
    return ContextParams(
        n_ctx=ctx or spec.n_ctx_train,
        n_seq_max=parallel or constants.AUTO_SLOTS,
        kv_unified=parallel is None if kv_unified is None else kv_unified,
        n_ubatch=n_ubatch,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        swa_full=swa_full,
        kv_offload=kv_offload,
        all_outputs=all_outputs,
        flash_attn=flash_attn,
    )


def cache_type_bytes(cache_type: str, elements: int) -> int:
    """Bytes of ``elements`` values of a KV cache type (f16, bf16, f32, q8_0, q4_0 …).

    Raises:
        UsageError: an unknown type, or a row that is not whole blocks of the type.
    """
    try:
        qtype = GGMLQuantizationType[cache_type.upper()]
    except KeyError:
        raise UsageError(f"unknown cache type {cache_type!r}", hint="use f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl") from None
    block, size = GGML_QUANT_SIZES[qtype]
    if elements % block:
        raise UsageError(f"cache type {cache_type} needs rows in blocks of {block}; this model's rows are {elements}")
    return elements // block * size


@dataclass(frozen=True)
class KvCache:
    """The KV cache of one context: cells per stream and bytes of every layer (all streams)."""

    cells_full: int
    cells_swa: int
    n_stream: int
    layer_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes)


def _cache_cells(spec: ModelSpec, params: ContextParams) -> tuple[int, int]:
    """Cells per stream of the full cache and of the sliding-window cache."""
    cells_full = params.n_ctx_seq
    window = spec.n_swa * (params.n_seq_max if params.kv_unified else 1) + params.n_ubatch
    return cells_full, cells_full if params.swa_full else _pad(min(cells_full, window))


def _kv_layout(spec: ModelSpec, cache_type_k: str, cache_type_v: str, flash_attn: bool) -> tuple[tuple[bool, bool, int], ...]:
    """Per layer: (keeps a recurrent state, sliding-window, K+V bytes per cell — 0 for none),
    which depend on the spec and the cache types only (computed once per spec and setting)."""
    table = spec.plan_cache.setdefault("kv_layout", {})
    key = (cache_type_k, cache_type_v, flash_attn)
    if key in table:
        return table[key]
    # Without flash attention V rows are padded to the widest layer's (Gemma 4: 4 × 512 to 16 × 256).
    v_widest = 0 if flash_attn else max((spec.n_embd_v_gqa(il) for il in range(spec.n_layer)), default=0)
    layout = []
    for il in range(spec.n_layer):
        recurrent = bool(spec.is_recurrent and spec.is_recurrent[il])
        if (recurrent and not spec.attention_in_recurrent) or spec.n_head_kv[il] == 0:
            layout.append((recurrent, False, 0))
            continue
        v_elements = spec.n_embd_v_gqa(il) and max(spec.n_embd_v_gqa(il), v_widest)
        per_cell = cache_type_bytes(cache_type_k, spec.n_embd_k_gqa(il)) + (cache_type_bytes(cache_type_v, v_elements) if v_elements else 0)
        layout.append((recurrent, bool(spec.is_swa[il]), per_cell))
    found = table[key] = tuple(layout)
    return found


def kv_cache(spec: ModelSpec, params: ContextParams) -> KvCache:
    """Bytes of the K and V cache per layer for ``params`` (attention and MLA layers), and of
    the fixed-size recurrent state for recurrent layers (:mod:`tierlocal.fit.recurrent`); a
    Falcon-H1 layer keeps both. Computed once per spec and context (the planners ask at every
    -ngl they try)."""
    table = spec.plan_cache.setdefault("kv_cache", {})
    found = table.get(params)
    if found is None:
        found = table[params] = _kv_cache(spec, params)
    return found


def _kv_cache(spec: ModelSpec, params: ContextParams) -> KvCache:
    cells_full, cells_swa = _cache_cells(spec, params)
    # Recurrent state: (n_embd_r + n_embd_s) float32 values per sequence, whatever the context.
    state = (spec.n_embd_r + spec.n_embd_s) * 4 * max(1, params.n_seq_max)
    layers = tuple(
        (state if recurrent else 0) + per_cell * (cells_swa if swa else cells_full) * params.n_stream
        for recurrent, swa, per_cell in _kv_layout(spec, params.cache_type_k, params.cache_type_v, params.flash_attn)
    )
    return KvCache(cells_full, cells_swa, params.n_stream, layers)


def output_buffer_bytes(spec: ModelSpec, params: ContextParams) -> int:
    """The logits buffer: n_vocab float32 values for each of n_seq_max sequences, in host
    memory (pinned when a GPU is used), not in llama.cpp's device breakdown."""
    return spec.n_vocab * 4 * params.n_seq_max


def output_growth_bytes(spec: ModelSpec, params: ContextParams) -> int:
    """What the output buffer grows by once a batch outputs every token (``all_outputs``:
    llama-server's --embeddings and --reranking), bytes; 0 otherwise. llama.cpp reserves
    :func:`output_buffer_bytes` at load (the load log's figure) and, for a batch with more
    outputs than that, allocates one row per output token: n_vocab logits (kept even for an
    embedding model) and n_embd embedding floats — up to a micro-batch of them (the server sets
    n_batch = n_ubatch with embeddings), at most the context. Measured on Gemma 3 270M with
    --embeddings (CPU build): one 401-token input raised the engine's resident memory by 822 MB,
    its 421 MB of output rows and the compute buffer's pages."""
    if not params.all_outputs:
        return 0
    rows = min(params.n_ctx, params.n_ubatch)
    return max((spec.n_vocab + spec.n_embd) * 4 * rows - output_buffer_bytes(spec, params), 0)


def has_attention(spec: ModelSpec) -> bool:
    """Whether any block attends (and so the graph carries attention masks)."""
    return not spec.is_recurrent or not all(spec.is_recurrent) or spec.attention_in_recurrent


def mask_cells(spec: ModelSpec, params: ContextParams) -> list[int]:
    """KV cells each attention mask spans: the full cache, and the SWA cache if any."""
    cells_full, cells_swa = _cache_cells(spec, params)
    return ([cells_full] if not all(spec.is_swa) else []) + ([cells_swa] if any(spec.is_swa) else [])


def _mamba_floats(spec: ModelSpec) -> int:
    """Floats per token a Mamba mixer's step holds at its peak: the input projection twice (it
    and its split views' copies), the convolution's input, the scan's output and three hidden
    states. Fitted on Granite-4.0-H-350M and Nemotron-Nano-9B-v2 (CPU build, n_ubatch 512):
    +6.1% and +2.0% of the buffer llama.cpp allocates (the safe side)."""
    d_inner, d_state, groups, heads = spec.mamba
    if not d_inner:
        return 0
    if not groups:  # Mamba-1: fitted on Mamba-2.8B (65.0 planned, 65.86 MiB allocated)
        return 6 * d_inner + spec.n_embd
    conv_dim = d_inner + 2 * groups * d_state
    return 2 * (conv_dim + d_inner + heads) + conv_dim + d_inner + 3 * spec.n_embd


def compute_buffer_bytes(spec: ModelSpec, params: ContextParams, *, flash_attn: bool = True) -> int:
    """The compute buffer of the backend that runs the layers (bytes). An approximation
    calibrated on llama.cpp's CPU backend.

    With flash attention (llama-server's ``-fa auto`` enables it on the CPU) the peak is the
    feed-forward step, n_ubatch × 4 B × floats per token, plus an f16 mask of n_kv × n_ubatch
    per cache (full and sliding-window). Floats per token: dense 3·n_ff + 3·n_embd + A;
    MoE 3·n_used·n_ff_exp + n_used·n_embd + 3·n_embd + A, where A = heads × value head size.
    Without flash attention the attention scores dominate: n_kv × n_ubatch × (4·n_head + 4)
    plus f32 masks plus n_ubatch × 4 B × (3.5·n_embd + 2·q_dim, + 2·n_head·kv_lora_rank for MLA).

    Measured on the CPU build (bench/estimate_accuracy.py) over Gemma 3 270M and sparse
    Llama-3-8B, Qwen3-8B, Qwen3-30B-A3B and DeepSeek-V2-Lite, n_ubatch 128/512, 4k/16k context:
    with flash attention within 0.2% (DeepSeek-V2-Lite +0.6%); without it within 3%, except
    MLA at long context (−10%). GPU backends differ by a few percent (Vulkan +4% on
    Llama-3-8B); on CUDA (an H200, bench/cuda_loads.py, 2026-11-30) it is 4–13 MiB above what
    the backend allocates for the five sparse models at 8k (+3…+16% of this buffer, at most
    +1% of the device's total); not yet corrected for.
    """
    n_tokens = min(params.n_ctx_seq, params.n_ubatch)
    if spec.architecture == "rwkv7":
        head_size = spec.n_embd_s // spec.n_embd if spec.n_embd else 0
        return rwkv7_compute_bytes(spec.n_embd, spec.n_ff, head_size, n_tokens, params.n_seq_max)
    masks = mask_cells(spec, params)
    attn_out = spec.attn_out_dim or spec.q_dim
    if spec.n_expert and spec.n_expert_used and spec.n_ff_exp:
        ffn_floats = 3 * spec.n_expert_used * spec.n_ff_exp + spec.n_expert_used * spec.n_embd + 3 * spec.n_embd + attn_out
    else:
        ffn_floats = 3 * spec.n_ff + 3 * spec.n_embd + attn_out
    # Per-layer input embeddings stay live through every block: two rows of n_layer × width.
    ffn_floats = max(ffn_floats, _mamba_floats(spec)) + 2 * spec.n_embd_per_layer * spec.n_layer
    # With logits for every token of the micro-batch the output step can be the peak: the
    # n_tokens × n_vocab f32 logits beside two hidden states (llama-cpp-python, measured exact
    # on Gemma 3 270M).
    logits = n_tokens * 4 * (spec.n_vocab + 2 * spec.n_embd) if params.all_outputs else 0
    if flash_attn:
        return max(n_tokens * 4 * ffn_floats + sum(cells * n_tokens * 2 for cells in masks), logits)
    rest = 3.5 * spec.n_embd + 2 * spec.q_dim + (2 * max(spec.n_head) * spec.kv_lora_rank if spec.mla else 0)
    scores = max(masks) * n_tokens * 4 * max(spec.n_head)
    attention = scores + sum(cells * n_tokens * 4 for cells in masks) + round(n_tokens * 4 * rest)
    feed_forward = n_tokens * 4 * ffn_floats + sum(cells * n_tokens * 4 for cells in masks)
    return max(attention, feed_forward, logits)


def host_compute_bytes(spec: ModelSpec, params: ContextParams, *, flash_attn: bool = True) -> int:
    """The host-side compute buffer a GPU backend adds (bytes): the input embeddings
    (2 × n_embd × n_ubatch float32) and the attention masks (f16 with flash attention, f32
    without). Measured on the Vulkan build: exact to 0.01 MiB for the four models above."""
    n_tokens = min(params.n_ctx_seq, params.n_ubatch)
    element = 2 if flash_attn else 4
    masks = sum(cells * n_tokens * element for cells in mask_cells(spec, params)) if has_attention(spec) else 0
    return 2 * spec.n_embd * n_tokens * 4 + masks

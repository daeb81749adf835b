"""Which layers of a model keep a recurrent (or linear-attention) state instead of a KV cache,
and how big that state is: llama.cpp's own rules, read from the header. Pure.

From llama.cpp (vendored in llama-cpp-python 0.3.36): ``llm_arch_is_recurrent`` /
``llm_arch_is_hybrid`` (src/llama-arch.cpp), each architecture's ``load_arch_hparams``
(src/models/*.cpp: which layers are recurrent), ``llama_hparams::n_embd_r()`` and
``n_embd_s()`` (src/llama-hparams.cpp: the state's sizes), and the memory each context creates
(src/llama-model.cpp ``create_memory``: F32 rows, ``max(1, n_seq_max)`` of them per layer;
which layers of a hybrid also keep attention KV).

Per recurrent layer, ``n_embd_r`` (the convolution / token-shift rows) and ``n_embd_s`` (the
state proper) float32 values per sequence:

- RWKV-6/7 (``wkv.head_size``): r = token_shift_count (2) × n_embd; s = n_embd × head size.
- LFM2 short convolutions (``shortconv.l_cache``): r = n_embd × (l_cache − 1); s = 0.
- Kimi Delta Attention (``kda.head_dim``): r = 3 × (d_conv − 1) × heads × head_dim (Q, K and V
  convolutions); s = head_dim² × heads.
- Mamba, Mamba-2 and gated delta nets (``ssm.*``): r = (d_conv − 1) × (d_inner + 2 × groups ×
  d_state); s = d_state × d_inner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "RecurrentFacts",
    "recurrent_facts",
    "kda_state_floats",
    "frontier_per_user_memory",
    "rwkv7_compute_bytes",
    "RECURRENT_ARCHS",
    "HYBRID_ARCHS",
]

#: Every layer recurrent, no attention (llm_arch_is_recurrent).
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
#: Hybrids whose recurrent layers are those with no KV heads (the per-layer head_count_kv array).
_BY_ZERO_KV_HEADS = frozenset({"jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next"})
#: Hybrids with an explicit recurrent-layer array, else every layer but each ``interval``-th.
_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})
#: Nemotron-H: recurrent = no KV heads and no feed-forward (its MLP-only layers keep nothing).
_NEMOTRON = frozenset({"nemotron_h", "nemotron_h_moe"})
#: Falcon-H1: every layer runs attention and a Mamba-2 mixer side by side, and keeps both.
_EVERY_LAYER_BOTH = frozenset({"falcon-h1"})
#: The hybrids modelled here.
HYBRID_ARCHS = _BY_ZERO_KV_HEADS | _BY_INTERVAL | _NEMOTRON | _EVERY_LAYER_BOTH
_DEFAULT_FULL_ATTENTION_INTERVAL = 4
_DEFAULT_TOKEN_SHIFT_COUNT = 2


@dataclass(frozen=True)
class RecurrentFacts:
    """Which layers keep a state, its sizes (float32 values per sequence per layer), whether
    those layers keep attention KV too, and the family the rules came from ("" for none)."""

    is_recurrent: tuple[bool, ...]
    n_embd_r: int
    n_embd_s: int
    attention_too: bool = False
    family: str = ""
    #: A Mamba mixer's (d_inner, d_state, groups, heads), for its compute buffer; zeros otherwise.
    mamba: tuple[int, int, int, int] = (0, 0, 0, 0)


def _int(metadata: Mapping[str, object], key: str, default: int = 0) -> int:
    value = metadata.get(key, default)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _recurrent_layers(metadata: Mapping[str, object], arch: str, n_layer: int, n_head_kv: Sequence[int], n_ff: Sequence[int]) -> tuple[bool, ...]:
    if arch in RECURRENT_ARCHS or arch in _EVERY_LAYER_BOTH:
        return (True,) * n_layer
    if arch in _BY_INTERVAL:
        explicit = metadata.get(f"{arch}.attention.recurrent_layers")
        if isinstance(explicit, list) and len(explicit) >= n_layer:
            return tuple(bool(value) for value in explicit[:n_layer])
        interval = _int(metadata, f"{arch}.full_attention_interval", _DEFAULT_FULL_ATTENTION_INTERVAL) or _DEFAULT_FULL_ATTENTION_INTERVAL
        return tuple((il + 1) % interval != 0 for il in range(n_layer))
    if arch in _NEMOTRON:
        return tuple(n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layer))
    return tuple(heads == 0 for heads in n_head_kv)


def kda_state_floats(heads: int, head_dim: int, d_conv: int) -> tuple[int, int]:
    """A Kimi Delta Attention layer's (n_embd_r, n_embd_s) per sequence, float32 values: the
    Q, K and V convolutions' last ``d_conv − 1`` columns (3 when the header gives no kernel),
    and one head_dim × head_dim state per head."""
    return 3 * (d_conv - 1 if d_conv > 0 else 3) * heads * head_dim, head_dim * head_dim * heads


def _state_sizes(metadata: Mapping[str, object], arch: str, n_embd: int, n_head: Sequence[int]) -> tuple[int, int, str]:
    """(n_embd_r, n_embd_s, family) in llama_hparams' order of precedence."""
    wkv = _int(metadata, f"{arch}.wkv.head_size")
    if wkv:
        shifts = _int(metadata, f"{arch}.token_shift_count", _DEFAULT_TOKEN_SHIFT_COUNT)
        return shifts * n_embd, n_embd * wkv, "rwkv"
    l_cache = _int(metadata, f"{arch}.shortconv.l_cache")
    if l_cache:
        return n_embd * max(l_cache - 1, 0), 0, "short convolution"
    d_conv = _int(metadata, f"{arch}.ssm.conv_kernel")
    kda = _int(metadata, f"{arch}.kda.head_dim")
    if kda:
        return *kda_state_floats(n_head[0] if n_head else 0, kda, d_conv), "kimi delta attention"
    d_inner, d_state, groups = (
        _int(metadata, f"{arch}.ssm.inner_size"),
        _int(metadata, f"{arch}.ssm.state_size"),
        _int(metadata, f"{arch}.ssm.group_count"),
    )
    n_conv = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * groups * d_state)
    family = "gated delta net" if arch in _BY_INTERVAL else ("mamba-2" if groups else "mamba")
    return n_conv, d_state * d_inner, family


def recurrent_facts(
    metadata: Mapping[str, object], arch: str, n_layer: int, n_embd: int, n_head: Sequence[int], n_head_kv: Sequence[int], n_ff: Sequence[int]
) -> RecurrentFacts:
    """The recurrent layers of ``arch`` and their state, or none for an attention-only model."""
    if arch not in RECURRENT_ARCHS and arch not in HYBRID_ARCHS:
        return RecurrentFacts((False,) * n_layer, 0, 0)
    n_embd_r, n_embd_s, family = _state_sizes(metadata, arch, n_embd, n_head)
    layers = _recurrent_layers(metadata, arch, n_layer, n_head_kv, n_ff)
    mamba = (0, 0, 0, 0)
    if family.startswith("mamba"):
        mamba = tuple(_int(metadata, f"{arch}.ssm.{key}") for key in ("inner_size", "state_size", "group_count", "time_step_rank"))  # type: ignore[assignment]
    return RecurrentFacts(layers, n_embd_r, n_embd_s, attention_too=arch in _EVERY_LAYER_BOTH, family=family, mamba=mamba)


def rwkv7_compute_bytes(n_embd: int, n_ff: int, head_size: int, n_tokens: int, n_seq_max: int) -> int:
    """RWKV-7's compute buffer (bytes): the larger of the time-mix step (its projections and
    LoRAs, 18 rows of n_embd per token) and the channel-mix step, plus two copies of every
    sequence's WKV state. Fitted on RWKV7-Goose-Pile-168M at three widths (head size 64, CPU
    build): +0.2…+1.1% of what llama.cpp allocates (the feed-forward formula was 5–7% low)."""
    time_mix = 4 * n_tokens * (18 * n_embd + 96)
    channel_mix = 4 * n_tokens * (2 * n_ff + 5 * n_embd + 64)
    return max(time_mix, channel_mix) + 8 * n_seq_max * n_embd * head_size


def frontier_per_user_memory(dims: Mapping[str, int], layers: Mapping[str, int]) -> tuple[float | None, int]:
    """A frontier model's KV bytes per token and fixed state bytes per user from its published
    dimensions, by llama.cpp's rules (f16 latent cache; float32 recurrent state): MLA layers
    cache ``kv_lora_rank + qk_rope_head_dim`` values per token; Kimi Delta Attention layers
    keep convolution rows and a head_dim² state per head. (None, 0) without the dimensions.
    ``dims`` as recipes/frontier.toml names them (``mla_kv_lora_rank``, ``kda_heads`` …),
    ``layers`` the counts by kind (``mla_layers``, ``linear_attention_layers``)."""
    if not {"mla_kv_lora_rank", "mla_qk_rope_head_dim"} <= dims.keys():
        return None, 0
    kv_per_token = layers.get("mla_layers", 0) * (dims["mla_kv_lora_rank"] + dims["mla_qk_rope_head_dim"]) * 2.0
    state = 0
    if {"kda_heads", "kda_head_dim", "kda_conv_kernel"} <= dims.keys():
        rows, square = kda_state_floats(dims["kda_heads"], dims["kda_head_dim"], dims["kda_conv_kernel"])
        state = layers.get("linear_attention_layers", 0) * (rows + square) * 4
    return kv_per_token, state

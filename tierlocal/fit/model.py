"""ModelSpec: the architecture facts the memory estimate needs, derived from a GGUF header. Pure.

Rules follow llama.cpp (the version vendored in llama-cpp-python 0.3.36): per-layer head
counts may be arrays; head sizes default to embedding ÷ heads; which layers use a sliding
window comes from ``{arch}.attention.sliding_window_pattern`` (an array, or a period), else
from the architecture's own default period.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import HeaderError
from ..gguf.parse import GGUFHeader
from ..gguf.summary import merge_split
from .recurrent import HYBRID_ARCHS, RECURRENT_ARCHS, recurrent_facts
from .sliding_window import sliding_window, swa_layers

__all__ = ["ModelSpec", "PlacedTensor", "model_spec", "VERIFIED_ARCHS"]

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")
#: Tensors outside the blocks that llama.cpp loads as input (LLM_TENSOR_LAYER_INPUT: kept in
#: RAM) or as block 0's (repeating tensors created with index 0: Gemma 4's per-layer input
#: projection); any other goes with the output layer.
_INPUT_LAYER = ("token_embd.", "per_layer_token_embd.")
_FIRST_BLOCK = ("per_layer_model_proj.", "per_layer_proj_norm.", "rope_factors_")
#: Architectures whose estimate was checked against the buffers the real llama.cpp allocates
#: (tests/ and bench/estimate_accuracy.py); any other gets the generic rules, labelled.
_VERIFIED_DENSE = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "deepseek2",
    "gemma3",
    "gemma4",
    "gpt-oss",
    "phi3",
    "olmo2",
    "smollm3",
    "seed_oss",
    "exaone4",
)
_VERIFIED_RECURRENT = (
    "lfm2",
    "granitehybrid",
    "qwen3next",
    "qwen35",
    "qwen35moe",
    "nemotron_h",
    "mamba",
    "falcon-h1",
    "kimi-linear",
    "kimi-k3",
    "rwkv6",
    "rwkv7",
    "jamba",
)
VERIFIED_ARCHS = frozenset(_VERIFIED_DENSE + _VERIFIED_RECURRENT)
#: Metadata that marks caches the estimator does not model yet: latent (MLA) KV, recurrent
#: or linear-attention state, and hybrids of them.
_UNMODELLED_CACHE_KEYS = ("ssm.", "wkv.", "shortconv.", "full_attention_interval", "linear_attention", "kda.")


@dataclass(frozen=True)
class PlacedTensor:
    """One tensor as placement sees it: its layer (-1 the input embedding, 0..n_layer-1 a
    block, n_layer the output layer), its shard, offset in that shard's data and size (bytes)."""

    name: str
    layer: int
    shard: int
    offset: int
    n_bytes: int
    #: The quantisation type's name (``Q4_K``), and the tensor's dimensions in ggml order
    #: (``ne[0]`` first: the row length, then the rows).
    ggml_type: str = ""
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts per layer. Sizes in bytes; head sizes in elements.

    ``tensors`` places every tensor: ``blk.N.*`` in block N, ``token_embd`` in the input layer
    (always on the CPU), everything else (output projection, output norm …) in the output
    layer. A tied output (no ``output.weight``) reuses the token embedding.
    """

    architecture: str
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_swa: int
    is_swa: tuple[bool, ...]
    n_ctx_train: int
    n_vocab: int
    tied_output: bool
    tensors: tuple[PlacedTensor, ...]
    n_ff: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    #: MLA (DeepSeek-V2 style): the cache holds one compressed latent per token as K, no V.
    mla: bool = False
    kv_lora_rank: int = 0
    head_k_mla: int = 0
    #: Recurrent blocks (fixed-size state instead of KV) and their state sizes in float32 values;
    #: whether those blocks keep attention KV as well (Falcon-H1), and the state's family.
    is_recurrent: tuple[bool, ...] = ()
    n_embd_r: int = 0
    n_embd_s: int = 0
    attention_in_recurrent: bool = False
    recurrent_family: str = ""
    #: Whether this architecture's rules were checked against llama.cpp's own buffers here
    #: (VERIFIED_ARCHS); the header keys of a state no modelled family explains.
    verified: bool = True
    unknown_state: tuple[str, ...] = ()
    #: Mamba mixers' (d_inner, d_state, groups, heads); zeros for other models.
    mamba: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: Attention output elements per token: heads × value head size (the MLA value size for MLA).
    attn_out_dim: int = 0
    #: Head sizes of the sliding-window layers when they differ ({arch}.attention.key_length_swa:
    #: Gemma 4's local layers use 256 beside 512 in its global ones); 0: head_k / head_v.
    head_k_swa: int = 0
    head_v_swa: int = 0
    #: Per-layer input embeddings (Gemma 3n, Gemma 4 E2B/E4B): their width per block (floats).
    n_embd_per_layer: int = 0

    @cached_property
    def plan_cache(self) -> dict[str, Any]:
        """Work the planners repeat for this model (per-tensor facts, weight splits by ``-ngl``),
        kept with it: the same answers, computed once. Not part of the model's identity."""
        return {}

    @property
    def q_dim(self) -> int:
        """Query elements per token (largest layer): heads × key head size (MLA's own for MLA)."""
        return max(self.n_head) * (self.head_k_mla or self.head_k)

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        """Bytes of each block's tensors."""
        sizes = [0] * self.n_layer
        for tensor in self.tensors:
            if 0 <= tensor.layer < self.n_layer:
                sizes[tensor.layer] += tensor.n_bytes
        return tuple(sizes)

    @property
    def embedding(self) -> PlacedTensor | None:
        """The token embedding matrix (the tied output's weights), if the header has one."""
        return next((t for t in self.tensors if t.name.startswith("token_embd.") and len(t.shape) >= 2), None)

    @property
    def token_embd_bytes(self) -> int:
        """The token embedding's bytes (not the per-layer embeddings beside it in RAM; computed once)."""
        found = self.plan_cache.get("token_embd_bytes")
        if found is None:
            found = self.plan_cache["token_embd_bytes"] = sum(t.n_bytes for t in self.tensors if t.layer == -1 and t.name.startswith("token_embd."))
        return found

    @property
    def output_layer_bytes(self) -> int:
        """The output layer's own tensors (output projection when untied, output norm …)."""
        return sum(t.n_bytes for t in self.tensors if t.layer == self.n_layer)

    def head_k_at(self, il: int) -> int:
        """K head size of layer ``il`` (elements): the sliding-window one where it differs."""
        return self.head_k_swa if self.head_k_swa and self.is_swa[il] else self.head_k

    def head_v_at(self, il: int) -> int:
        """V head size of layer ``il`` (elements): the sliding-window one where it differs."""
        return self.head_v_swa if self.head_v_swa and self.is_swa[il] else self.head_v

    def n_embd_k_gqa(self, il: int) -> int:
        """K elements per token in layer ``il`` (head size × KV heads)."""
        return self.head_k_at(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        """V elements per token in layer ``il`` (none for MLA: V is read from the latent)."""
        return 0 if self.mla else self.head_v_at(il) * self.n_head_kv[il]


def _per_layer(value: object, n_layer: int, key: str, source: str) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) < n_layer or not all(isinstance(v, int) for v in value):
            raise HeaderError(source, 0, f"{key} has {len(value)} entries for {n_layer} layers")
        return tuple(int(v) for v in value[:n_layer])
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n_layer
    raise HeaderError(source, 0, f"{key} is missing or not an integer")


def _place(headers: Sequence[GGUFHeader], n_layer: int, n_trunk: int) -> tuple[PlacedTensor, ...]:
    """Every tensor the engine loads, in its layer. Blocks from ``n_trunk`` on are
    multi-token-prediction blocks, whose tensors llama.cpp skips (TENSOR_SKIP) unless asked to
    draft with them: not in any buffer, so not placed."""
    placed = []
    for shard, header in enumerate(headers):
        for tensor in header.tensors:
            match = _BLOCK_RE.match(tensor.name)
            if match and n_trunk <= int(match.group(1)) < n_layer:
                continue
            if match and int(match.group(1)) < n_layer:
                layer = int(match.group(1))
            elif tensor.name.startswith(_INPUT_LAYER):
                layer = -1
            elif tensor.name.startswith(_FIRST_BLOCK):
                layer = 0
            else:
                layer = n_layer
            placed.append(PlacedTensor(tensor.name, layer, shard, tensor.offset, tensor.n_bytes, tensor.ggml_type, tensor.shape))
    return tuple(placed)


def _int(metadata: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = metadata.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise KeyError(key)
    return value


def _unmodelled_state(metadata: Mapping[str, object], arch: str) -> tuple[str, ...]:
    """The header's recurrent or linear-attention keys that no modelled family explains (an
    architecture outside :mod:`tierlocal.fit.recurrent`): the state the estimate cannot size."""
    if arch in RECURRENT_ARCHS | HYBRID_ARCHS:
        return ()
    return tuple(sorted({key.split(".", 1)[1] for key in metadata if key.startswith(f"{arch}.") and any(m in key for m in _UNMODELLED_CACHE_KEYS)}))


def _check_consistent(n_head: Sequence[int], n_head_kv: Sequence[int], source: str) -> None:
    """Refuse a header that contradicts itself (more KV heads than heads, heads that do not
    group): a generic estimate from it would be wrong in ways no label covers.

    Raises:
        HeaderError: it does.
    """
    for il, (heads, kv_heads) in enumerate(zip(n_head, n_head_kv, strict=False)):
        if kv_heads > heads or (kv_heads and heads % kv_heads):
            raise HeaderError(
                source,
                0,
                f"layer {il} has {kv_heads} KV heads for {heads} attention heads",
                hint="the header contradicts itself; re-convert the model",
            )


def _sizes(metadata: Mapping[str, object], arch: str, source: str) -> tuple[int, int, int]:
    """Blocks, embedding width and training context (tokens) the estimate cannot do without.

    Raises:
        HeaderError: one is missing.
    """
    try:
        return (
            _int(metadata, f"{arch}.block_count"),
            _int(metadata, f"{arch}.embedding_length"),
            _int(metadata, f"{arch}.context_length"),
        )
    except KeyError as exc:
        raise HeaderError(source, 0, f"{exc.args[0]} is missing", hint="the estimate needs it; is this a language model?") from None


def _heads(metadata: Mapping[str, object], arch: str, n_layer: int, n_trunk: int, source: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Attention heads and KV heads per layer. The multi-token-prediction blocks (from
    ``n_trunk`` on) keep no KV in the serving context: llama.cpp's create_memory filters its
    caches to il < n_layer().

    Raises:
        HeaderError: the header contradicts itself.
    """
    n_head = _per_layer(metadata.get(f"{arch}.attention.head_count"), n_layer, "head_count", source)
    n_head_kv = _per_layer(metadata.get(f"{arch}.attention.head_count_kv", list(n_head)), n_layer, "head_count_kv", source)
    _check_consistent(n_head, n_head_kv, source)
    with_kv = min(n_trunk, _layers_with_own_kv(metadata, arch, n_layer, source))
    return n_head, n_head_kv[:with_kv] + (0,) * (n_layer - with_kv)


def _layers_with_own_kv(metadata: Mapping[str, object], arch: str, n_layer: int, source: str) -> int:
    """Blocks from the first that keep a KV cache of their own: the later ones of Gemma 3n (from
    block 20) and Gemma 4 ({arch}.attention.shared_kv_layers of them) read an earlier block's
    cache instead (llama_hparams::n_layer_kv_from_start; llama.cpp's create_memory reuse).

    Raises:
        HeaderError: more shared blocks than blocks.
    """
    if arch == "gemma3n":
        return min(20, n_layer)
    if arch not in ("gemma4", "gemma4-assistant"):
        return n_layer
    shared = _number(metadata, f"{arch}.attention.shared_kv_layers")
    if not 0 <= shared < n_layer:
        raise HeaderError(
            source, 0, f"{arch}.attention.shared_kv_layers is {shared} of {n_layer} blocks", hint="the file is corrupt or not a Gemma 4 model"
        )
    return n_layer - shared


def _trunk_layers(metadata: Mapping[str, object], arch: str, n_layer: int, source: str) -> int:
    """Blocks before the multi-token-prediction ones (``{arch}.nextn_predict_layers``, which
    llama.cpp counts in block_count and in -ngl's layers but does not run when serving). A
    file of nothing but MTP blocks (a draft head) is all trunk, as llama.cpp treats it.

    Raises:
        HeaderError: more MTP blocks than blocks.
    """
    value = metadata.get(f"{arch}.nextn_predict_layers", 0)
    n_nextn = value if isinstance(value, int) and not isinstance(value, bool) else 0
    if n_nextn < 0 or n_nextn > n_layer:
        raise HeaderError(
            source, 0, f"{n_nextn} multi-token-prediction blocks in {n_layer} blocks", hint="the header contradicts itself; re-convert the model"
        )
    return n_layer if n_nextn in (0, n_layer) else n_layer - n_nextn


def _number(metadata: Mapping[str, object], key: str, default: object = 0) -> int:
    """``int()`` of a metadata value (``default`` when absent; 0 when empty)."""
    return int(metadata.get(key, default) or 0)  # type: ignore[call-overload]


def model_spec(headers: Sequence[GGUFHeader]) -> ModelSpec:
    """Derive the ModelSpec of one model from its header(s).

    Raises:
        HeaderError: a fact the estimate needs is missing or inconsistent.
    """
    metadata, tensors = merge_split(headers)
    source = headers[0].source
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise HeaderError(source, 0, "general.architecture is missing")
    unknown_state = _unmodelled_state(metadata, arch)
    n_layer, n_embd, n_ctx_train = _sizes(metadata, arch, source)
    n_trunk = _trunk_layers(metadata, arch, n_layer, source)
    n_head, n_head_kv = _heads(metadata, arch, n_layer, n_trunk, source)
    max_heads = max(n_head) or 1
    head_k = metadata.get(f"{arch}.attention.key_length", n_embd // max_heads)
    head_v = metadata.get(f"{arch}.attention.value_length", head_k)
    n_swa = sliding_window(metadata, arch, n_layer)
    n_ff_layers = _per_layer(metadata.get(f"{arch}.feed_forward_length", 0), n_layer, "feed_forward_length", source)
    recurrent = recurrent_facts(metadata, arch, n_layer, n_embd, n_head, n_head_kv, n_ff_layers)
    # ... nor a recurrent state: only trunk layers are recurrent (qwen35.cpp: i < n_layer()).
    is_recurrent = tuple(flag and il < n_trunk for il, flag in enumerate(recurrent.is_recurrent))
    tokens = metadata.get("tokenizer.ggml.tokens")
    n_vocab = getattr(tokens, "length", None) or (len(tokens) if isinstance(tokens, list) else 0)
    return ModelSpec(
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_k=int(head_k),  # type: ignore[call-overload]
        head_v=int(head_v),  # type: ignore[call-overload]
        n_swa=n_swa,
        is_swa=swa_layers(metadata, arch, n_layer, n_swa),
        n_ctx_train=n_ctx_train,
        n_vocab=int(n_vocab),
        tied_output=not any(tensor.name == "output.weight" for tensor in tensors),
        tensors=_place(headers, n_layer, n_trunk),
        n_ff=max(n_ff_layers, default=0),
        n_expert=_number(metadata, f"{arch}.expert_count"),
        n_expert_used=_number(metadata, f"{arch}.expert_used_count"),
        n_ff_exp=_number(metadata, f"{arch}.expert_feed_forward_length"),
        mla=f"{arch}.attention.kv_lora_rank" in metadata and f"{arch}.attention.key_length_mla" in metadata,
        kv_lora_rank=_number(metadata, f"{arch}.attention.kv_lora_rank"),
        head_k_mla=_number(metadata, f"{arch}.attention.key_length_mla"),
        is_recurrent=is_recurrent,
        n_embd_r=recurrent.n_embd_r,
        n_embd_s=recurrent.n_embd_s,
        attention_in_recurrent=recurrent.attention_too,
        recurrent_family=recurrent.family,
        verified=arch in VERIFIED_ARCHS,
        unknown_state=unknown_state,
        mamba=recurrent.mamba,
        attn_out_dim=max(n_head) * _number(metadata, f"{arch}.attention.value_length_mla", head_v),
        head_k_swa=_number(metadata, f"{arch}.attention.key_length_swa"),
        head_v_swa=_number(metadata, f"{arch}.attention.value_length_swa"),
        n_embd_per_layer=_number(metadata, f"{arch}.embedding_length_per_layer_input"),
    )

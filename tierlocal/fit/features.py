"""What a planned run asks of each device: the features :mod:`tierlocal.fit.speed` prices —
per generated token, the weight bytes and rows each device's matrices read (by type), the KV
cache read at the depth, per-layer and per-token costs; per prompt token, the FLOPs. Pure.

The matrices are grouped once per spec by (layer, expert or not, bound by the device or not),
the sets llama.cpp always places together, so a run sums groups, not tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from .. import constants
from .memory import cache_type_bytes
from .model import ModelSpec, PlacedTensor
from .placement import EXPERT_TENSOR, device_binds, expert_flags, gpu_layers, tensor_binds
from .routing import distinct_expert_share

__all__ = [
    "Features",
    "MatrixGroup",
    "RunFeatures",
    "matrix_groups",
    "run_features",
    "expert_decode_features",
    "add_feature",
    "DEFAULT_DEPTH",
    "PREFILL_PROMPT",
]

#: The prompt length a prefill rate is quoted at (llama-bench's pp512).
PREFILL_PROMPT = 512
#: Tokens already in the context when a decode speed is quoted (a short chat turn).
DEFAULT_DEPTH = 512
Features = dict[str, float]


@dataclass(frozen=True)
class RunFeatures:
    """What one run asks of each device (``host``, ``gpu``): decode features per generated
    token at ``depth`` tokens of context, and prefill features per prompt token for a prompt
    of ``prompt`` tokens (``once`` holds the output layer's, paid once per prompt)."""

    depth: int
    prompt: int
    decode: dict[str, Features]
    prefill: dict[str, Features]
    once: dict[str, Features]


def _is_matrix(tensor: PlacedTensor) -> bool:
    return len(tensor.shape) >= 2 and min(tensor.shape[:2]) > 1


def _elements(tensor: PlacedTensor) -> int:
    return math.prod(tensor.shape) if tensor.shape else 0


def add_feature(features: Features, name: str, amount: float) -> None:
    if amount:
        features[name] = features.get(name, 0.0) + amount


class MatrixGroup(NamedTuple):
    """The weight matrices of one layer that always share a device (expert or not, bound by
    the device or not), their decode and prefill features summed once per spec."""

    layer: int
    expert: bool
    binds: bool
    output_layer: bool
    decode: Features
    flops: Features


def matrix_groups(spec: ModelSpec, max_tensor_bytes: int | None) -> tuple[tuple[MatrixGroup, ...], tuple[float, ...]]:
    """Every matrix grouped by (layer, expert, bound), and each layer's FFN width: what a run's
    features add up, whatever its placement (computed once per spec and device limit)."""
    table = spec.plan_cache.setdefault("speed_groups", {})
    if max_tensor_bytes in table:
        return table[max_tensor_bytes]
    share = spec.n_expert_used / spec.n_expert if spec.n_expert and spec.n_expert_used else 1.0
    expert_of, binds_of = expert_flags(spec), tensor_binds(spec, max_tensor_bytes)
    groups: dict[tuple[int, bool, bool], MatrixGroup] = {}
    ffn_width = [0.0] * (spec.n_layer + 1)

    def account(tensor: PlacedTensor, expert: bool, binds: bool) -> None:
        key = (tensor.layer, expert, binds)
        group = groups.get(key) or groups.setdefault(key, MatrixGroup(tensor.layer, expert, binds, tensor.layer == spec.n_layer, {}, {}))
        used = share if expert else 1.0
        prefix = "x" if expert else ""  # experts' mat-mul runs through mul_mat_id: a rate of its own
        ggml_type = "F16" if tensor.ggml_type == "F32" else tensor.ggml_type  # small F32 matrices (routers): F16's rates
        add_feature(group.decode, f"bytes:{ggml_type}", tensor.n_bytes * used)
        add_feature(group.decode, f"rows:{ggml_type}", _elements(tensor) / tensor.shape[0] * used)
        add_feature(group.flops, f"{prefix}flops:{ggml_type}", 2.0 * _elements(tensor) * used)
        if ".ffn_up" in tensor.name and len(tensor.shape) >= 2:
            ffn_width[tensor.layer] += tensor.shape[1] * (spec.n_expert_used if expert else 1)

    for index, tensor in enumerate(spec.tensors):
        if tensor.layer >= 0 and _is_matrix(tensor):  # the embedding is a row lookup; norms and biases are in the per-layer cost
            account(tensor, expert_of[index], binds_of[index])
    embedding = spec.embedding
    if spec.tied_output and embedding is not None:  # the output projection multiplies by the embedding matrix
        output = replace(embedding, layer=spec.n_layer)
        account(output, EXPERT_TENSOR.search(embedding.name) is not None, device_binds(embedding, max_tensor_bytes))
    found = table[max_tensor_bytes] = (tuple(groups.values()), tuple(ffn_width))
    return found


def _layer_attention(spec: ModelSpec, depth: int, prompt: int, cache_type_k: str, cache_type_v: str) -> tuple[tuple[float, float], ...]:
    """:func:`_attention` for every layer (computed once per spec and setting)."""
    table = spec.plan_cache.setdefault("attention", {})
    key = (depth, prompt, cache_type_k, cache_type_v)
    if key not in table:
        table[key] = tuple(_attention(spec, il, depth, prompt, cache_type_k, cache_type_v) for il in range(spec.n_layer))
    return table[key]


def run_features(
    spec: ModelSpec,
    *,
    ngl: int = 0,
    n_cpu_moe: int = 0,
    max_tensor_bytes: int | None = None,
    depth: int = DEFAULT_DEPTH,
    prompt: int = PREFILL_PROMPT,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    ubatch: int = constants.DEFAULT_UBATCH,
) -> RunFeatures:
    """The features of decoding at ``depth`` and prefilling ``prompt`` tokens (in batches of
    ``ubatch``: an MoE's prompt token also pays its share of reading the experts its batch
    touches, ``xread:TYPE`` bytes) with
    ``-ngl ngl --n-cpu-moe n_cpu_moe``, per device. A matrix runs where
    :func:`~tierlocal.fit.memory.weights_split` puts it: on the GPU when its layer is offloaded,
    it is not an expert kept in RAM by ``--n-cpu-moe`` and the device can bind it."""
    layer_on_gpu = gpu_layers(spec, ngl)
    decode: dict[str, Features] = {"host": {}, "gpu": {}}
    prefill: dict[str, Features] = {"host": {}, "gpu": {}}
    once: dict[str, Features] = {"host": {}, "gpu": {}}
    _, ffn_width = matrix_groups(spec, max_tensor_bytes)
    batch_touched = _batch_touched(spec, min(prompt, ubatch))
    for group, device in _placed_groups(spec, ngl, n_cpu_moe, max_tensor_bytes):
        for name, amount in group.decode.items():
            add_feature(decode[device], name, amount)
        for name, amount in group.flops.items():
            add_feature(once[device] if group.output_layer else prefill[device], name, amount)
        if group.expert and batch_touched > 0:
            for name, amount in group.decode.items():
                if name.startswith("bytes:"):
                    add_feature(prefill[device], "xread:" + name[6:], amount * batch_touched)
    for il, (kv_bytes, attn_flops) in enumerate(_layer_attention(spec, depth, prompt, cache_type_k, cache_type_v)):
        device = "gpu" if layer_on_gpu[il] else "host"
        add_feature(decode[device], "layer", 1)
        add_feature(prefill[device], "layer", 1)
        # element-wise work (norms, activations, residuals) per token grows with the widths
        add_feature(prefill[device], "elems", spec.n_embd + ffn_width[il])
        add_feature(decode[device], "kv_bytes", kv_bytes)
        add_feature(prefill[device], "attn_flops", attn_flops)
    decode["host"]["token"] = 1
    if any(layer_on_gpu):  # the GPU's own per-token cost: kernel launches, the round trip
        decode["gpu"]["token"] = 1
    decode["host"]["vocab"] = spec.n_vocab
    prefill["host"]["token"] = 1
    return RunFeatures(depth, prompt, decode, prefill, once)


def _batch_touched(spec: ModelSpec, tokens: int) -> float:
    """Per prompt token, how many times one token's expert bytes a batch of ``tokens`` reads: the
    experts its tokens route to (:func:`~.routing.distinct_expert_share`) over the batch's tokens,
    in units of the k/E share a token uses (0: not an MoE)."""
    if not spec.n_expert or not spec.n_expert_used or tokens <= 0:
        return 0.0
    used = spec.n_expert_used / spec.n_expert
    return distinct_expert_share(used, tokens) / used / tokens


def _placed_groups(spec: ModelSpec, ngl: int, n_cpu_moe: int, max_tensor_bytes: int | None) -> list[tuple[MatrixGroup, str]]:
    """Each matrix group and the device (``host``, ``gpu``) it runs on with ``-ngl ngl
    --n-cpu-moe n_cpu_moe``."""
    layer_on_gpu = gpu_layers(spec, ngl)
    groups, _ = matrix_groups(spec, max_tensor_bytes)
    placed = []
    for group in groups:
        on_gpu = layer_on_gpu[group.layer] and group.binds and not (group.expert and group.layer < n_cpu_moe)
        placed.append((group, "gpu" if on_gpu else "host"))
    return placed


def expert_decode_features(spec: ModelSpec, *, ngl: int = 0, n_cpu_moe: int = 0, max_tensor_bytes: int | None = None) -> dict[str, Features]:
    """The part of :func:`run_features`' decode features that expert matrices make (bytes and
    rows, the used share), per device: what more sequences in one step read more of."""
    experts: dict[str, Features] = {"host": {}, "gpu": {}}
    for group, device in _placed_groups(spec, ngl, n_cpu_moe, max_tensor_bytes):
        if group.expert:
            for name, amount in group.decode.items():
                add_feature(experts[device], name, amount)
    return experts


def _attention(spec: ModelSpec, il: int, depth: int, prompt: int, cache_type_k: str, cache_type_v: str) -> tuple[float, float]:
    """Layer ``il``'s KV bytes read per decoded token at ``depth``, and its attention FLOPs per
    prompt token over a ``prompt``-token prompt (none for a recurrent layer)."""
    if (spec.is_recurrent and spec.is_recurrent[il] and not spec.attention_in_recurrent) or spec.n_head_kv[il] == 0:
        return 0.0, 0.0
    window = spec.n_swa if spec.is_swa[il] and spec.n_swa else None
    keys_decode = min(depth, window) if window else depth
    cell = cache_type_bytes(cache_type_k, spec.n_embd_k_gqa(il)) + (
        cache_type_bytes(cache_type_v, spec.n_embd_v_gqa(il)) if spec.n_embd_v_gqa(il) else 0
    )
    # mean keys attended over the prompt's positions 1..prompt (capped by the window)
    # (Σ_{p=1..P} min(p, w) = w(w+1)/2 + (P − w)·w for w < P, an exact integer)
    keys = (window * (window + 1) // 2 + (prompt - window) * window) / prompt if window and window < prompt else (prompt + 1) / 2
    return float(cell * keys_decode), 2.0 * spec.n_head[il] * (spec.head_k_at(il) + spec.head_v_at(il)) * keys

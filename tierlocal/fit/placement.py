"""Where the weights of a llama.cpp load go: which layers ``-ngl`` offloads, which tensors
``--n-cpu-moe`` keeps in RAM, which a device cannot bind, and the bytes on each side. Pure.

Rules from llama.cpp (vendored in llama-cpp-python 0.3.36), src/llama-model.cpp and
src/llama-model-loader.cpp; the tensors are grouped once per spec (by layer, expert or not,
bound or not: the sets that always land together), so a split sums groups, not tensors.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from .model import ModelSpec, PlacedTensor

__all__ = [
    "EXPERT_TENSOR",
    "SUPPORT_TEST_TOKENS",
    "PlacementGroup",
    "RepackClass",
    "WeightsSplit",
    "device_binds",
    "expert_flags",
    "gpu_layers",
    "embedding_binds",
    "placement_groups",
    "tensor_binds",
    "weights_split",
]


def gpu_layers(spec: ModelSpec, ngl: int) -> tuple[bool, ...]:
    """Which of the n_layer + 1 layers (the last is the output layer) ``-ngl ngl`` puts on the GPU."""
    table = spec.plan_cache.setdefault("gpu_layers", {})
    found = table.get(ngl)
    if found is None:
        start = max(spec.n_layer + 1 - max(ngl, 0), 0)
        found = table[ngl] = tuple(il >= start for il in range(spec.n_layer + 1))
    return found


#: llama.cpp's LLM_FFN_EXPS_REGEX: the expert tensors --n-cpu-moe keeps on the CPU.
EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")


@dataclass(frozen=True)
class WeightsSplit:
    """Model weights per side of a partial offload, in bytes.

    ``cpu_bytes`` sums the tensors kept on the CPU; ``cpu_mapped_bytes`` is what llama.cpp
    reports as CPU_Mapped with mmap: the span of each file from its first to its last CPU
    tensor (offloaded tensors inside that span stay mapped, though they are not resident).
    ``gpu_read_bytes`` / ``cpu_read_bytes`` are the bytes each side reads per generated token
    (expert tensors count n_expert_used / n_expert of their size).
    """

    gpu_bytes: int
    cpu_bytes: int
    gpu_read_bytes: int = 0
    cpu_read_bytes: int = 0
    #: The placement groups kept on the CPU.
    cpu_groups: tuple[PlacementGroup, ...] = ()

    @cached_property
    def cpu_mapped_bytes(self) -> int:
        spans: dict[int, tuple[int, int]] = {}
        for group in self.cpu_groups:
            for shard, start, end in group.spans:
                known = spans.get(shard)
                spans[shard] = (min(start, known[0]), max(end, known[1])) if known else (start, end)
        return sum(end - start for start, end in spans.values())

    @property
    def cpu_repack(self) -> Iterator[RepackClass]:
        """The block matrices kept on the CPU by type and row count: what its backend may repack."""
        return (cls for group in self.cpu_groups if group.layer >= 0 for cls in group.repack)


class RepackClass(NamedTuple):
    """Matrices (2 or 3 dimensions) of one type and row count (``ne[1]``) and their bytes: what
    decides whether the CPU backend repacks them (:mod:`tierlocal.fit.host_memory`)."""

    ggml_type: str
    rows: int
    n_bytes: int


def repack_classes(tensors: list[PlacedTensor]) -> tuple[RepackClass, ...]:
    """``tensors``' matrices summed by (type, rows), in order of first appearance."""
    sizes: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if len(tensor.shape) in (2, 3):
            key = (tensor.ggml_type, tensor.shape[1])
            sizes[key] = sizes.get(key, 0) + tensor.n_bytes
    return tuple(RepackClass(ggml_type, rows, n_bytes) for (ggml_type, rows), n_bytes in sizes.items())


#: Tokens of the batch llama.cpp tests a weight's operation with when it picks the weight's
#: device (llama-model-loader.cpp ``weight_buft_supported``).
SUPPORT_TEST_TOKENS = 512


def device_binds(tensor: PlacedTensor, max_tensor_bytes: int | None, n_expert_used: int = 1) -> bool:
    """Whether a device whose buffers hold at most ``max_tensor_bytes`` can take ``tensor``'s
    operation, as llama.cpp tests it: the weight itself, and for a matrix the f32 product of a
    512-token batch (rows × 512 × 4 bytes; × the experts used for an expert tensor) must each
    fit one buffer. On Mesa's llvmpipe (128 MiB) a 65,537-row output matrix therefore stays in
    RAM while a 65,536-row one is offloaded (measured: Falcon-H1, Granite-4.0-H, RWKV-6)."""
    if max_tensor_bytes is None:
        return True
    if tensor.n_bytes > max_tensor_bytes:
        return False
    if len(tensor.shape) < 2 or tensor.name.endswith(".bias") or ".ffn_gate_inp" in tensor.name:
        return True
    per_token = tensor.shape[1] * (n_expert_used if EXPERT_TENSOR.search(tensor.name) else 1)
    return per_token * SUPPORT_TEST_TOKENS * 4 <= max_tensor_bytes


def weights_split(spec: ModelSpec, ngl: int, *, n_cpu_moe: int = 0, max_tensor_bytes: int | None = None) -> WeightsSplit:
    """Where ``-ngl ngl --n-cpu-moe n_cpu_moe`` puts the weights.

    Offloaded blocks, and with the output layer its tensors, go to the GPU; the token
    embedding always stays on the CPU. A tied output is the token embedding duplicated onto
    the output layer's device. ``--n-cpu-moe N`` keeps the expert tensors of blocks 0..N-1 on
    the CPU. A tensor the device cannot bind (:func:`device_binds` with ``max_tensor_bytes``,
    e.g. Vulkan's maxStorageBufferRange: 128 MiB on Mesa's llvmpipe) stays on the CPU, as
    llama.cpp falls back when the device does not support the operation. CPU repack copies are host memory's
    business (:mod:`tierlocal.fit.host_memory`).
    """
    key = (ngl, n_cpu_moe, max_tensor_bytes)
    cache = spec.plan_cache.setdefault("weights_split", {})  # the planners ask for the same -ngl many times
    if key in cache:
        return cache[key]
    on_gpu = gpu_layers(spec, ngl)
    gpu = 0
    gpu_read = 0.0
    cpu_groups = []
    for group in placement_groups(spec, max_tensor_bytes):
        if group.layer >= 0 and on_gpu[group.layer] and group.binds and not (group.expert and group.layer < n_cpu_moe):
            gpu += group.n_bytes
            gpu_read += group.read_bytes
        else:
            cpu_groups.append(group)
    if spec.tied_output and on_gpu[spec.n_layer] and (max_tensor_bytes is None or embedding_binds(spec, max_tensor_bytes)):
        gpu += spec.token_embd_bytes
    # Per token the embedding contributes one row, not the matrix: leave it out of the reads.
    cpu_read = sum(group.read_bytes for group in cpu_groups if group.layer >= 0)
    split = WeightsSplit(gpu, sum(group.n_bytes for group in cpu_groups), round(gpu_read), round(cpu_read), tuple(cpu_groups))
    cache[key] = split
    return split


def embedding_binds(spec: ModelSpec, max_tensor_bytes: int) -> bool:
    """Whether the device can take the tied output (the token embedding again)."""
    embedding = spec.embedding
    return embedding is None or device_binds(embedding, max_tensor_bytes, spec.n_expert_used or 1)


class PlacementGroup(NamedTuple):
    """The tensors of one layer that always land on the same device (expert or not, bound by the
    device or not): their bytes, the bytes a token reads of them, their span in each shard
    (shard, start, end), and their matrices by type and row count (:class:`RepackClass`)."""

    layer: int
    expert: bool
    binds: bool
    n_bytes: int
    read_bytes: float
    spans: tuple[tuple[int, int, int], ...]
    repack: tuple[RepackClass, ...]


def placement_groups(spec: ModelSpec, max_tensor_bytes: int | None) -> tuple[PlacementGroup, ...]:
    """The spec's tensors grouped for :func:`weights_split` (computed once per spec and limit),
    so a split sums a few groups per layer instead of every tensor."""
    table = spec.plan_cache.setdefault("placement_groups", {})
    if max_tensor_bytes in table:
        return table[max_tensor_bytes]
    expert, binds = expert_flags(spec), tensor_binds(spec, max_tensor_bytes)
    share = spec.n_expert_used / spec.n_expert if spec.n_expert and spec.n_expert_used else 1.0
    members: dict[tuple[int, bool, bool], list[PlacedTensor]] = {}
    for index, tensor in enumerate(spec.tensors):
        members.setdefault((tensor.layer, expert[index], binds[index]), []).append(tensor)
    groups = []
    for (layer, is_expert, bound), tensors in members.items():
        spans: dict[int, tuple[int, int]] = {}
        for tensor in tensors:
            start, end = spans.get(tensor.shard, (tensor.offset, tensor.offset + tensor.n_bytes))
            spans[tensor.shard] = (min(start, tensor.offset), max(end, tensor.offset + tensor.n_bytes))
        n_bytes = sum(tensor.n_bytes for tensor in tensors)
        read = sum(tensor.n_bytes * (share if is_expert else 1.0) for tensor in tensors)
        shard_spans = tuple((shard, start, end) for shard, (start, end) in spans.items())
        groups.append(PlacementGroup(layer, is_expert, bound, n_bytes, read, shard_spans, repack_classes(tensors)))
    found = table[max_tensor_bytes] = tuple(groups)
    return found


def expert_flags(spec: ModelSpec) -> tuple[bool, ...]:
    """Whether each of the spec's tensors is an expert tensor (computed once per spec)."""
    flags = spec.plan_cache.get("expert_flags")
    if flags is None:
        flags = spec.plan_cache["expert_flags"] = tuple(EXPERT_TENSOR.search(t.name) is not None for t in spec.tensors)
    return flags


def tensor_binds(spec: ModelSpec, max_tensor_bytes: int | None) -> tuple[bool, ...]:
    """:func:`device_binds` for each of the spec's tensors (computed once per spec and limit)."""
    table = spec.plan_cache.setdefault("binds", {})
    if max_tensor_bytes not in table:
        table[max_tensor_bytes] = tuple(device_binds(t, max_tensor_bytes, spec.n_expert_used or 1) for t in spec.tensors)
    return table[max_tensor_bytes]

"""Probe models for timing the engine: a Llama-architecture GGUF of a chosen width, depth,
vocabulary and weight type whose tensor data is a sparse hole (zeros). llama.cpp loads and runs
it at the speed of a real model of that shape — its kernels do not look at the values — while
nothing is downloaded and almost nothing is stored. Written with the gguf package's writer
(:class:`SparseWriter`: its long arrays packed in one pass); I/O: the one file it writes."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFValueType, GGUFWriter

__all__ = ["ProbeShape", "SparseWriter", "write_probe_gguf", "add_placeholder_vocab", "finish_sparse", "finish_with_tensors"]

_ALIGN = 32
#: Arrays at least this long take :class:`SparseWriter`'s one-pass packing.
_LONG_ARRAY = 1024
#: numpy's little-endian layout of each one-pass element type.
_NUMPY_TYPES = {GGUFValueType.FLOAT32: "<f4", GGUFValueType.INT32: "<i4"}


class SparseWriter(GGUFWriter):
    """The gguf package's writer, but a long array whose items are all ``str``, all ``float``
    or all ``int`` is packed in one pass, byte for byte what the base class writes
    (tests/test_synthetic.py compares them). The base packs every item through its generic
    path: a 262,144-token placeholder vocabulary (tokens, scores, types) cost ~3.5 s of CPU a
    file, most of what writing a sparse model of a real shape took. Write it ourselves because
    gguf-py has no bulk path for metadata arrays."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if vtype == GGUFValueType.ARRAY and self.endianess == GGUFEndian.LITTLE and isinstance(val, list) and len(val) >= _LONG_ARRAY:
            packed = _pack_uniform_array(val, sub_type)
            if packed is not None:
                return (struct.pack("<I", vtype) if add_vtype else b"") + packed
        return bytes(super()._pack_val(val, vtype, add_vtype, sub_type))


def _pack_uniform_array(values: list[Any], sub_type: GGUFValueType | None) -> bytes | None:
    """An array's type, count and items, little-endian, or None when its items are not all of
    one of the types packed here (``type(x) is …``: a bool is not an int)."""
    kind = type(values[0])
    element = {str: GGUFValueType.STRING, float: GGUFValueType.FLOAT32, int: GGUFValueType.INT32}.get(kind)
    if element is None or (sub_type is not None and sub_type != element) or any(type(value) is not kind for value in values):
        return None
    head = struct.pack("<IQ", element, len(values))
    if element == GGUFValueType.STRING:
        encoded = [value.encode("utf-8") for value in values]
        return head + b"".join(struct.pack("<Q", len(item)) + item for item in encoded)
    return head + np.asarray(values, dtype=_NUMPY_TYPES[element]).tobytes()


@dataclass(frozen=True)
class ProbeShape:
    """A dense Llama-style transformer. Sizes in elements; ``weight_type`` for every matrix
    (the norms stay F32)."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    weight_type: str
    n_ctx_train: int = 4096
    #: Mixtral-style experts in place of the dense FFN (``n_ff`` is then each expert's width).
    n_expert: int = 0
    n_expert_used: int = 0


def _matrices(shape: ProbeShape) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and ggml dimensions (row length first)."""
    q_dim, kv_dim = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (shape.n_embd, shape.n_vocab))]
    for il in range(shape.n_layer):
        tensors += [
            (f"blk.{il}.attn_norm.weight", (shape.n_embd,)),
            (f"blk.{il}.attn_q.weight", (shape.n_embd, q_dim)),
            (f"blk.{il}.attn_k.weight", (shape.n_embd, kv_dim)),
            (f"blk.{il}.attn_v.weight", (shape.n_embd, kv_dim)),
            (f"blk.{il}.attn_output.weight", (q_dim, shape.n_embd)),
            (f"blk.{il}.ffn_norm.weight", (shape.n_embd,)),
        ]
        if shape.n_expert:
            tensors += [
                (f"blk.{il}.ffn_gate_inp.weight", (shape.n_embd, shape.n_expert)),
                (f"blk.{il}.ffn_gate_exps.weight", (shape.n_embd, shape.n_ff, shape.n_expert)),
                (f"blk.{il}.ffn_up_exps.weight", (shape.n_embd, shape.n_ff, shape.n_expert)),
                (f"blk.{il}.ffn_down_exps.weight", (shape.n_ff, shape.n_embd, shape.n_expert)),
            ]
        else:
            tensors += [
                (f"blk.{il}.ffn_gate.weight", (shape.n_embd, shape.n_ff)),
                (f"blk.{il}.ffn_up.weight", (shape.n_embd, shape.n_ff)),
                (f"blk.{il}.ffn_down.weight", (shape.n_ff, shape.n_embd)),
            ]
    tensors += [("output_norm.weight", (shape.n_embd,)), ("output.weight", (shape.n_embd, shape.n_vocab))]
    return tensors


def write_probe_gguf(path: Path, shape: ProbeShape) -> Path:
    """Write ``shape`` to ``path`` (its data a hole); returns ``path``.

    Raises:
        ValueError: the width is not whole blocks of the weight type.
    """
    qtype = GGMLQuantizationType[shape.weight_type]
    block = GGML_QUANT_SIZES[qtype][0]
    if shape.n_embd % block or shape.n_ff % block or (shape.n_head * shape.head_dim) % block:
        raise ValueError(f"{shape.name}: rows must be whole {shape.weight_type} blocks of {block}")
    arch = "llama"
    writer = SparseWriter(path, arch)
    writer.add_string("general.name", shape.name)
    for key, value in {
        "block_count": shape.n_layer,
        "context_length": shape.n_ctx_train,
        "embedding_length": shape.n_embd,
        "feed_forward_length": shape.n_ff,
        "attention.head_count": shape.n_head,
        "attention.head_count_kv": shape.n_head_kv,
        "attention.key_length": shape.head_dim,
        "attention.value_length": shape.head_dim,
        "rope.dimension_count": shape.head_dim,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    if shape.n_expert:
        writer.add_uint32(f"{arch}.expert_count", shape.n_expert)
        writer.add_uint32(f"{arch}.expert_used_count", shape.n_expert_used)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    add_placeholder_vocab(writer, shape.n_vocab)
    tensors = [
        (name, dims, qtype if len(dims) >= 2 and ".ffn_gate_inp." not in name else GGMLQuantizationType.F32) for name, dims in _matrices(shape)
    ]
    return finish_with_tensors(writer, path, tensors)


def finish_with_tensors(writer: GGUFWriter, path: Path, tensors: Iterable[tuple[str, tuple[int, ...], GGMLQuantizationType]]) -> Path:
    """Add every (name, ggml shape ne0-first, type) to the header, then write it with the
    tensor data as a hole (:func:`finish_sparse`); returns ``path``."""
    data_bytes = 0
    for name, dims, tensor_type in tensors:
        t_block, t_bytes = GGML_QUANT_SIZES[tensor_type]
        n_bytes = math.prod(dims) // t_block * t_bytes
        writer.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), n_bytes, raw_dtype=tensor_type)
        data_bytes += -(-n_bytes // _ALIGN) * _ALIGN
    return finish_sparse(writer, path, data_bytes)


#: SentencePiece's token type of a byte token (``<0x0A>``): the fallback for any text.
_BYTE_TOKEN_TYPE = 6


def add_placeholder_vocab(writer: GGUFWriter, n_vocab: int, *, text: bool = False) -> None:
    """A SentencePiece-style vocabulary of ``n_vocab`` placeholder tokens (ids 1 and 2 BOS and
    EOS): what llama.cpp needs to load a model that is only ever fed token ids. With ``text``,
    ids 3 to 258 are the 256 byte tokens, so any text (a chat request) tokenizes byte by byte."""
    writer.add_string("tokenizer.ggml.model", "llama")
    tokens, types = [f"<p{i}>" for i in range(n_vocab)], [1] * n_vocab
    if text and n_vocab > 259:
        tokens[3:259] = [f"<0x{byte:02X}>" for byte in range(256)]
        types[3:259] = [_BYTE_TOKEN_TYPE] * 256
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)


def finish_sparse(writer: GGUFWriter, path: Path, data_bytes: int) -> Path:
    """Write the header the writer holds, then extend the file by ``data_bytes`` of tensor data
    (aligned) as a hole: no data is written. Returns ``path``."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    data_start = -(-path.stat().st_size // _ALIGN) * _ALIGN
    with path.open("r+b") as handle:
        handle.truncate(data_start + data_bytes)
    return path

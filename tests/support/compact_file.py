"""A sparse GGUF written back from a compact header (tierlocal/gguf/compact.py): the same
metadata (a vocabulary-sized array summarised in the compact form becomes an array of that many
placeholder values), the same tensor names, shapes and types in the same order, the tensor data
a hole. `tierlocal check FILE` then parses real GGUF bytes, so comparing its plan with the plan
of the catalog entry checks the catalog path against the file path, not against itself."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from tierlocal.gguf.synthetic import SparseWriter, finish_with_tensors

__all__ = ["write_compact_as_gguf", "write_compact_as_split"]

_ALIGN = 32

_ARRAY = "__array__"


def _scalar_type(value: object) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.INT32 if value < 0 else GGUFValueType.UINT32 if value < 2**32 else GGUFValueType.UINT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return GGUFValueType.STRING


def _placeholder(element_type: str, length: int) -> list[object]:
    kind = GGUFValueType[element_type]
    if kind == GGUFValueType.STRING:
        return [f"<p{i}>" for i in range(length)]
    if kind in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return [0.0] * length
    return [1] * length


def write_compact_as_gguf(compact: Mapping[str, object], path: Path) -> Path:
    """Write the first (only) file a compact header describes as a sparse GGUF at ``path``."""
    writer, tensors = _writer(compact, path)
    return finish_with_tensors(writer, path, tensors)


def write_compact_as_split(compact: Mapping[str, object], path: Path, shards: int) -> list[Path]:
    """Write the model as ``shards`` sparse files the way llama.cpp's gguf-split lays them out
    (the gguf package's writer in split mode: every key in the first shard, ``split.no``,
    ``split.count`` and ``split.tensors.count`` in each, the tensors shared out in order), named
    ``STEM-0000i-of-0000n.gguf`` beside ``path``; returns the shards' paths."""
    _, tensors = _writer(compact, path)
    writer, _ = _writer(compact, path, split_max_tensors=math.ceil(len(tensors) / shards))
    for name, dims, tensor_type in tensors:
        t_block, t_bytes = GGML_QUANT_SIZES[tensor_type]
        writer.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), math.prod(dims) // t_block * t_bytes, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    names = writer.format_shard_names(path)
    data = [sum(-(-info.nbytes // _ALIGN) * _ALIGN for info in shard.values()) for shard in writer.tensors]
    writer.close()
    for shard_path, data_bytes in zip(names, data, strict=True):
        start = -(-shard_path.stat().st_size // _ALIGN) * _ALIGN
        with shard_path.open("r+b") as handle:
            handle.truncate(start + data_bytes)
    return names


def _writer(
    compact: Mapping[str, object], path: Path, split_max_tensors: int = 0
) -> tuple[SparseWriter, list[tuple[str, tuple[int, ...], GGMLQuantizationType]]]:
    """A writer holding the compact header's metadata, and its tensors (name, ggml shape, type)."""
    files = compact["files"]
    assert isinstance(files, list) and len(files) == 1, "one-file models only"
    entry = files[0]
    metadata = dict(entry["metadata"])
    writer = SparseWriter(path, str(metadata.pop("general.architecture")), split_max_tensors=split_max_tensors)
    metadata.pop("general.alignment", None)
    for key, value in metadata.items():
        if isinstance(value, Mapping) and _ARRAY in value:
            values = _placeholder(str(value[_ARRAY]), int(value["length"]))
            writer.add_array(key, values)
        elif isinstance(value, list):
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=_scalar_type(value[0]) if value else GGUFValueType.UINT32)
        else:
            writer.add_key_value(key, value, _scalar_type(value))
    tensors = [(name, tuple(shape), GGMLQuantizationType[qtype]) for name, shape, qtype, _ in entry["tensors"]]
    return writer, tensors


def first_blocks(compact: Mapping[str, object], n_blocks: int) -> dict[str, object]:
    """The compact header of the model's first ``n_blocks`` blocks: ``block_count`` and every
    per-block list cut to them, the later blocks' tensors dropped (their bytes stay a hole in the
    file). The same layer pattern at a fraction of the size, for loads that only need a boundary."""
    copy = json.loads(json.dumps(compact))
    for file in copy["files"]:
        metadata = file["metadata"]
        arch = metadata["general.architecture"]
        old = metadata.get(f"{arch}.block_count")
        if old is None:
            continue
        metadata[f"{arch}.block_count"] = n_blocks
        for key, value in metadata.items():
            if isinstance(value, list) and len(value) == old and key.startswith(f"{arch}."):
                metadata[key] = value[:n_blocks]
        file["tensors"] = [t for t in file["tensors"] if not (t[0].startswith("blk.") and int(t[0].split(".")[1]) >= n_blocks)]
    return copy

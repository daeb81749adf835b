"""A GGUF header in a compact, checked-in form: what the estimator reads from a model file
without the file — metadata (vocabulary-sized arrays kept as their type and length), and every
tensor's name, shape, type and offset. Pure.

A catalog entry stores this for a published file (``tierlocal catalog capture SOURCE`` writes it
from the header alone), and :func:`from_compact` gives back the headers the estimator runs on:
the same :class:`~tierlocal.gguf.parse.GGUFHeader` values the parser makes, so the plan from a
catalog entry is the plan from the file. The form is JSON (a few KB to a few hundred KB).

Every count, length and size in a compact form is checked against :class:`HeaderLimits` before
anything is built from it: it may come from a file someone else wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .parse import ArraySummary, GGUFHeader, HeaderLimits, TensorInfo
from .tables import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["COMPACT_FORMAT", "COMPACT_VERSION", "CompactError", "to_compact", "from_compact"]

COMPACT_FORMAT = "tierlocal-gguf-compact"
COMPACT_VERSION = 1
_ARRAY = "__array__"


class CompactError(ValueError):
    """A compact header that is not one, or claims more than a header may."""


def to_compact(headers: Sequence[GGUFHeader], *, array_bytes: bool = False) -> dict[str, object]:
    """The compact form of a model's headers (one per shard), JSON-ready; ``array_bytes``: with
    each long array's byte length (what a later read of another quantisation may pass over)."""
    return {
        "format": COMPACT_FORMAT,
        "version": COMPACT_VERSION,
        "files": [
            {
                "name": header.source.rsplit("/", 1)[-1],
                "gguf_version": header.version,
                "metadata": {key: _value_out(value, array_bytes) for key, value in header.metadata.items()},
                "tensors": [[t.name, list(t.shape), t.ggml_type, t.offset] for t in header.tensors],
                "header_bytes": header.header_bytes,
                "data_offset": header.data_offset,
                "file_bytes": header.file_bytes,
                "alignment": header.alignment,
            }
            for header in headers
        ],
    }


def _value_out(value: object, array_bytes: bool) -> object:
    if isinstance(value, ArraySummary):
        return {_ARRAY: value.element_type, "length": value.length, **({"bytes": value.byte_length} if array_bytes and value.byte_length else {})}
    return value


def from_compact(data: Mapping[str, object], source: str, limits: HeaderLimits | None = None) -> list[GGUFHeader]:
    """The headers a compact form describes, named ``source`` (shards as ``source#N``).

    Raises:
        CompactError: not a compact header of this version, or over ``limits``.
    """
    limits = limits or HeaderLimits()
    if data.get("format") != COMPACT_FORMAT or data.get("version") != COMPACT_VERSION:
        raise CompactError(f"{source}: not a {COMPACT_FORMAT} version {COMPACT_VERSION} document")
    files = data.get("files")
    if not isinstance(files, list) or not 1 <= len(files) <= 1024:
        raise CompactError(f"{source}: 'files' must list 1 to 1024 headers")
    return [_header(entry, source if len(files) == 1 else f"{source}#{index + 1}", limits) for index, entry in enumerate(files)]


def _header(entry: object, source: str, limits: HeaderLimits) -> GGUFHeader:
    if not isinstance(entry, Mapping):
        raise CompactError(f"{source}: a header must be an object")
    metadata = entry.get("metadata")
    tensors = entry.get("tensors")
    if not isinstance(metadata, Mapping) or len(metadata) > limits.max_kv_pairs:
        raise CompactError(f"{source}: metadata must be an object of at most {limits.max_kv_pairs} keys")
    if not isinstance(tensors, list) or len(tensors) > limits.max_tensors:
        raise CompactError(f"{source}: tensors must be a list of at most {limits.max_tensors}")
    sizes = {
        name: _count(entry.get(name), f"{source}: {name}") for name in ("gguf_version", "header_bytes", "data_offset", "file_bytes", "alignment")
    }
    return GGUFHeader(
        source=source,
        version=sizes["gguf_version"],
        metadata={str(key): _value_in(value, f"{source}: {key}", limits) for key, value in metadata.items()},
        tensors=tuple(_tensor(item, source, limits) for item in tensors),
        header_bytes=sizes["header_bytes"],
        data_offset=sizes["data_offset"],
        file_bytes=sizes["file_bytes"],
        alignment=sizes["alignment"],
    )


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise CompactError(f"{what} must be a count, not {value!r}")
    return value


def _value_in(value: object, what: str, limits: HeaderLimits) -> object:
    if isinstance(value, Mapping):
        if set(value) - {"bytes"} != {_ARRAY, "length"} or not isinstance(value[_ARRAY], str):
            raise CompactError(f"{what}: an object value must be an array summary")
        byte_length = _count(value.get("bytes", 0), what)
        return ArraySummary(value[_ARRAY], min(_count(value["length"], what), limits.max_array_elements), min(byte_length, limits.max_header_bytes))
    if isinstance(value, list) and len(value) > limits.max_kept_array_elements:
        raise CompactError(f"{what}: a kept array holds at most {limits.max_kept_array_elements} values")
    if isinstance(value, str) and len(value) > limits.max_string_bytes:
        raise CompactError(f"{what}: a string holds at most {limits.max_string_bytes} characters")
    return value


#: Each ggml type's (block elements, block bytes) by name, looked up once.
_TYPE_SIZES = {qtype.name: GGML_QUANT_SIZES[qtype] for qtype in GGMLQuantizationType if qtype in GGML_QUANT_SIZES}


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def _tensor(item: object, source: str, limits: HeaderLimits) -> TensorInfo:
    """One ``[name, shape, type, offset]`` entry, checked (the messages are built only on a
    failure: a catalog header holds thousands of tensors)."""
    if not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str) or not isinstance(item[1], list) or not isinstance(item[2], str):
        raise CompactError(f"{source}: a tensor must be [name, shape, type, offset]")
    name, dims, type_name, offset = item
    if not 1 <= len(dims) <= limits.max_dims:
        raise CompactError(f"{source}: tensor {name!r} has {len(dims)} dimensions")
    for dim in dims:
        if not _is_count(dim):
            _count(dim, f"{source}: a dimension of {name!r}")  # raises, with the message
    sizes = _TYPE_SIZES.get(type_name)
    if sizes is None:
        raise CompactError(f"{source}: tensor {name!r} has unknown type {type_name!r}")
    block, size = sizes
    shape = tuple(dims)
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if n_elements >= 1 << 62 or shape[0] % block:
        raise CompactError(f"{source}: tensor {name!r} of shape {shape} is not whole {type_name} blocks")
    if not _is_count(offset):
        _count(offset, f"{source}: offset of {name!r}")
    return TensorInfo(name, shape, type_name, offset, n_elements, n_elements // block * size)

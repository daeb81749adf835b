"""A bounded, streaming parser of GGUF headers.

The parser reads through a :class:`RangeReader` (a local file, an HTTP Range
reader, a bytes buffer in tests) and asks it only for the bytes the header needs:
it never touches the tensor data. The header is untrusted input, so every count and
length is checked against what is left of the file and against fixed limits before
anything is allocated, and every failure is a :class:`~tierlocal.errors.HeaderError`
naming the source, the byte offset and what was wrong.

Value types, quantisation block sizes and key names come from the ``gguf`` package.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .. import constants
from ..errors import HeaderError
from .cursor import SCALAR_FORMATS, SCALAR_SIZES, Cursor
from .tables import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

__all__ = [
    "RangeReader",
    "BytesReader",
    "ArraySummary",
    "TensorInfo",
    "GGUFHeader",
    "HeaderLimits",
    "parse_header",
    "KnownBytes",
    "ends_at_its_data",
]


class RangeReader(Protocol):
    """Random access to one file's bytes.

    ``read(offset, length)`` returns up to ``length`` bytes starting at ``offset``;
    fewer only at the end of the file. ``size`` is the file's length in bytes.
    """

    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


class BytesReader:
    """A :class:`RangeReader` over bytes already in memory."""

    def __init__(self, data: bytes, name: str = "<bytes>") -> None:
        self._data = data
        self.name = name
        self.size = len(data)

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]


@dataclass(frozen=True)
class HeaderLimits:
    """Upper bounds on what a header may claim. Real headers stay far below them."""

    max_header_bytes: int = 256 * 1024 * 1024
    max_tensors: int = 1 << 20
    max_kv_pairs: int = 1 << 16
    max_string_bytes: int = 16 * 1024 * 1024
    max_array_elements: int = 1 << 24
    max_dims: int = 4
    #: Arrays longer than this are kept as an :class:`ArraySummary` (type and length).
    max_kept_array_elements: int = 4096
    #: First read size in bytes; later reads grow with what has been read so far.
    first_read_bytes: int = constants.REMOTE_FIRST_READ_BYTES
    #: Largest single read in bytes.
    max_read_bytes: int = constants.REMOTE_MAX_READ_BYTES


@dataclass(frozen=True)
class ArraySummary:
    """A metadata array too long to keep (a vocabulary): its element type and length, and the
    bytes its elements take in the file (0: not known; not part of its identity)."""

    element_type: str
    length: int
    byte_length: int = field(default=0, compare=False)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it.

    ``offset`` is relative to the start of the data section; ``n_bytes`` follows from the
    shape and the quantisation type's block size.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """One GGUF file's header: metadata, tensor infos and where the data starts (bytes)."""

    source: str
    version: int
    metadata: Mapping[str, object]
    tensors: tuple[TensorInfo, ...]
    header_bytes: int
    data_offset: int
    file_bytes: int
    alignment: int


_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_MIN_KV_BYTES = 8 + 4  # key length, value type


def _value_type(cursor: Cursor, what: str) -> GGUFValueType:
    start = cursor.pos
    raw = cursor.u32(f"value type of {what}")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cursor.fail(f"{what} has unknown value type {raw}", start) from None


def _read_array(cursor: Cursor, key: str) -> object:
    start = cursor.pos
    element_type = _value_type(cursor, f"elements of {key}")
    if element_type == GGUFValueType.ARRAY:
        raise cursor.fail(f"{key} is an array of arrays, which GGUF does not allow", start)
    length = cursor.u64(f"length of {key}")
    limits = cursor.limits
    min_element = 8 if element_type == GGUFValueType.STRING else SCALAR_SIZES[element_type]
    if length > limits.max_array_elements or length * min_element > cursor.remaining():
        raise cursor.fail(
            f"{key} claims {length} elements, more than the file can hold (limit {limits.max_array_elements})",
            start,
        )
    keep = length <= limits.max_kept_array_elements
    if element_type == GGUFValueType.STRING:
        if keep:
            return [cursor.string(f"{key}[{index}]") for index in range(length)]
        elements = cursor.pos
        known = cursor.known_bytes(key, element_type.name, length) if cursor.known_bytes is not None else None
        if known:
            cursor.jump(known, key)  # another file's bytes: the caller checks what follows (:func:`ends_at_its_data`)
        else:
            cursor.skip_strings(length, key)
        return ArraySummary(element_type.name, length, cursor.pos - elements)
    size = SCALAR_SIZES[element_type]
    if not keep:
        cursor.jump(length * size, key)  # fixed-size elements: nothing in them is needed
        return ArraySummary(element_type.name, length, length * size)
    fmt = "<" + SCALAR_FORMATS[element_type][1] * length
    return list(struct.unpack(fmt, cursor.take(length * size, key)))


def _read_value(cursor: Cursor, key: str) -> object:
    vtype = _value_type(cursor, key)
    if vtype == GGUFValueType.STRING:
        return cursor.string(key)
    if vtype == GGUFValueType.ARRAY:
        return _read_array(cursor, key)
    return cursor.scalar(vtype, key)


def _tensor_bytes(cursor: Cursor, name: str, shape: tuple[int, ...], type_id: int, start: int) -> tuple[str, int, int]:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise HeaderError(
            cursor.reader.name,
            start,
            f"tensor {name!r} has unknown quantisation type {type_id}",
            hint="the file may be newer than this tierlocal; upgrade tierlocal and the gguf package",
        ) from None
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    if n_elements >= 1 << 62:
        raise cursor.fail(f"tensor {name!r} claims {n_elements} elements", start)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[0] % block_size:
        raise cursor.fail(f"tensor {name!r} row of {shape[0]} is not a multiple of {qtype.name}'s block of {block_size}", start)
    return qtype.name, n_elements, n_elements // block_size * type_size


def _read_tensor_info(cursor: Cursor, index: int) -> TensorInfo:
    start = cursor.pos
    name = cursor.string(f"name of tensor {index}")
    n_dims = cursor.u32(f"dimension count of tensor {name!r}")
    if n_dims > cursor.limits.max_dims:
        raise cursor.fail(f"tensor {name!r} claims {n_dims} dimensions (at most {cursor.limits.max_dims})", start)
    shape = tuple(cursor.u64(f"dimension {axis} of tensor {name!r}") for axis in range(n_dims))
    type_id = cursor.u32(f"type of tensor {name!r}")
    offset = cursor.u64(f"offset of tensor {name!r}")
    ggml_type, n_elements, n_bytes = _tensor_bytes(cursor, name, shape, type_id, start)
    return TensorInfo(name, shape, ggml_type, offset, n_elements, n_bytes)


def _check_counts(cursor: Cursor, n_tensors: int, n_kv: int) -> None:
    limits = cursor.limits
    if n_tensors > limits.max_tensors or n_tensors * _MIN_TENSOR_INFO_BYTES > cursor.remaining():
        raise cursor.fail(f"header claims {n_tensors} tensors, more than the file can hold", 8)
    if n_kv > limits.max_kv_pairs or n_kv * _MIN_KV_BYTES > cursor.remaining():
        raise cursor.fail(f"header claims {n_kv} metadata entries, more than the file can hold", 16)


def _check_tensor_extents(cursor: Cursor, tensors: list[TensorInfo], data_offset: int, alignment: int) -> None:
    data_bytes = cursor.reader.size - data_offset
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise cursor.fail(f"tensor {tensor.name!r} appears twice", data_offset)
        seen.add(tensor.name)
        if tensor.offset % alignment:
            raise cursor.fail(f"tensor {tensor.name!r} offset {tensor.offset} is not aligned to {alignment}", data_offset)
        if tensor.offset + tensor.n_bytes > data_bytes:
            raise HeaderError(
                cursor.reader.name,
                data_offset + tensor.offset,
                f"tensor {tensor.name!r} ({tensor.n_bytes} bytes) runs past the end of the file",
                hint="the file is truncated; download it again (tierlocal pull resumes)",
            )


#: The bytes another file's array of this key, element type and length took (None: not known).
KnownBytes = Callable[[str, str, int], int | None]


def ends_at_its_data(header: GGUFHeader) -> bool:
    """Whether the file ends where its last tensor's data does (to the alignment): true of every
    GGUF writer's output, and false when the header's end was misplaced — the check on a parse
    that passed over arrays by another file's byte lengths (``known_bytes``)."""
    if not header.tensors:
        return False
    end = header.data_offset + max(t.offset + t.n_bytes for t in header.tensors)
    return 0 <= header.file_bytes - end < header.alignment


def parse_header(reader: RangeReader, limits: HeaderLimits | None = None, known_bytes: KnownBytes | None = None) -> GGUFHeader:
    """Parse the header of one GGUF file without reading its tensor data.

    Args:
        reader: the file's bytes (local, HTTP Range, hub, memory).
        limits: bounds on counts and lengths; the defaults suit every real model.
        known_bytes: the byte length another file gave a long string array of the same key,
            element type and length (a vocabulary the quantisations of one model share): such an
            array is passed over by it, unread. Nothing checks those bytes; the caller checks the
            result (:func:`ends_at_its_data`) and parses again without it when it fails.

    Returns:
        The header: metadata (long arrays summarised), tensor infos with their byte sizes,
        and the header's size in bytes (the offset at which tensor data starts).

    Raises:
        HeaderError: the bytes are not a valid GGUF header, or claim more than the file holds.
    """
    cursor = Cursor(reader, limits or HeaderLimits(), known_bytes)
    magic = cursor.u32("magic")
    if magic != GGUF_MAGIC:
        raise cursor.fail("not a GGUF file (wrong magic bytes)", 0)
    version = cursor.u32("version")
    if version not in (2, 3):
        if version and version & 0xFFFF == 0:
            raise cursor.fail("big-endian GGUF files are not supported", 4)
        raise cursor.fail(f"unsupported GGUF version {version} (tierlocal reads versions 2 and 3)", 4)
    n_tensors = cursor.u64("tensor count")
    n_kv = cursor.u64("metadata count")
    _check_counts(cursor, n_tensors, n_kv)

    metadata: dict[str, object] = {}
    for index in range(n_kv):
        start = cursor.pos
        key = cursor.string(f"key of metadata entry {index}")
        if key in metadata:
            raise cursor.fail(f"metadata key {key!r} appears twice", start)
        metadata[key] = _read_value(cursor, key)

    tensors = [_read_tensor_info(cursor, index) for index in range(n_tensors)]

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise cursor.fail(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cursor.pos // alignment) * alignment
    if data_offset > reader.size:
        raise cursor.fail("the file ends before its tensor data starts")
    _check_tensor_extents(cursor, tensors, data_offset, alignment)
    return GGUFHeader(
        source=reader.name,
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        header_bytes=cursor.pos,
        data_offset=data_offset,
        file_bytes=reader.size,
        alignment=alignment,
    )

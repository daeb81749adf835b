"""The header parser against the real Gemma file (checked with the gguf package's own reader),
files written by the gguf package's writer, and hostile headers crafted byte by byte."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from tests.support.small_gguf import write_small_gguf
from tierlocal.errors import HeaderError
from tierlocal.fetch.sources import read_headers
from tierlocal.gguf import ArraySummary, HeaderLimits, parse_header, summarize
from tierlocal.gguf.parse import BytesReader


class CountingReader:
    """A local file as a RangeReader that records what was asked of it."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.size = path.stat().st_size
        self._path = path
        self.requested = 0

    def read(self, offset: int, length: int) -> bytes:
        self.requested += length
        with self._path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)


@pytest.mark.long
def test_gemma_header_matches_the_gguf_package_reader(gemma: Path) -> None:
    header = parse_header(CountingReader(gemma))
    reference = GGUFReader(gemma)
    assert header.data_offset == reference.data_offset
    assert len(header.tensors) == len(reference.tensors) == 236
    for ours, theirs in zip(header.tensors, reference.tensors, strict=False):
        assert ours.name == theirs.name
        assert ours.ggml_type == GGMLQuantizationType(theirs.tensor_type).name
        assert ours.n_elements == theirs.n_elements
        assert ours.n_bytes == theirs.n_bytes
        assert header.data_offset + ours.offset == theirs.data_offset
        assert list(ours.shape) == [int(d) for d in theirs.shape]
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        value = header.metadata[key]
        if isinstance(value, ArraySummary):
            assert value.length == len(field.contents())
        elif isinstance(value, float):
            assert value == pytest.approx(field.contents())
        else:
            assert value == field.contents(), key


def test_gemma_header_reads_only_header_bytes(gemma: Path) -> None:
    reader = CountingReader(gemma)
    header = parse_header(reader)
    # The 262k-token vocabulary makes the header ~6.5 MB of the 253 MB file.
    assert header.header_bytes == 6_525_112
    assert header.file_bytes == 253_113_024
    assert reader.requested <= 2 * header.header_bytes
    # Tensor data exactly fills the rest of the file: header + data == file.
    assert header.data_offset + sum(t.n_bytes for t in header.tensors) == header.file_bytes


def test_gemma_summary_states_the_published_facts(gemma: Path) -> None:
    summary = summarize(read_headers(str(gemma)))
    assert summary.architecture == "gemma3"
    assert (summary.layers, summary.head_count, summary.head_count_kv) == (18, 4, 1)
    assert summary.context_length == 32768
    assert summary.vocab_size == 262144
    assert summary.file_type == "Q4_K_M"
    assert summary.params == 268_098_176  # Gemma 3 "270M"
    assert {share.ggml_type for share in summary.quant_mix} == {"Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"}
    assert sum(share.n_bytes for share in summary.quant_mix) == summary.tensor_bytes


def test_writer_made_model_round_trips(tmp_path: Path) -> None:
    metadata = {
        "{arch}.block_count": 2,
        "{arch}.context_length": 4096,
        "{arch}.embedding_length": 64,
        "{arch}.attention.head_count": 8,
        "{arch}.attention.head_count_kv": [0, 2],
        "general.name": "test model ✓",
    }
    tensors = {f"blk.{index}.attn_q.weight": np.ones((64, 32), dtype=np.float32) for index in range(3)}
    tensors["token_embd.weight"] = np.zeros((10, 64), dtype=np.float16)
    path = write_small_gguf(tmp_path / "m.gguf", "llama", metadata, tensors, tokens=5000)
    header = parse_header(CountingReader(path))
    summary = summarize([header])
    assert summary.head_count_kv == [0, 2]  # per-layer arrays are kept (LFM2-style zeros included)
    assert summary.vocab_size == 5000
    assert summary.name == "test model ✓"
    assert summary.params == 3 * 64 * 32 + 10 * 64
    assert summary.tensor_bytes == 3 * 64 * 32 * 4 + 10 * 64 * 2
    assert header.metadata["tokenizer.ggml.tokens"] == ArraySummary("STRING", 5000)


# --- hostile headers ------------------------------------------------------------------------


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv_u32(key: bytes, value: int) -> bytes:
    return _string(key) + struct.pack("<II", GGUFValueType.UINT32, value)


def _tensor(name: bytes, dims: list[int], type_id: int = 0, offset: int = 0) -> bytes:
    return _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, offset)


def _gguf(
    kvs: list[bytes], tensors: list[bytes], *, n_kv: int | None = None, n_tensors: int | None = None, version: int = 3, pad_to: int = 4096
) -> bytes:
    arch = _string(b"general.architecture") + struct.pack("<I", GGUFValueType.STRING) + _string(b"llama")
    body = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors, (len(kvs) + 1) if n_kv is None else n_kv)
    body += arch + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * max(pad_to - len(body), 0)


def _error(data: bytes, limits: HeaderLimits | None = None) -> HeaderError:
    started = time.monotonic()
    with pytest.raises(HeaderError) as caught:
        parse_header(BytesReader(data, "hostile.gguf"), limits)
    assert time.monotonic() - started < 2, "a hostile header must be rejected quickly"
    assert str(caught.value).startswith("hostile.gguf: at byte ")
    return caught.value


def test_valid_crafted_header_parses() -> None:
    header = parse_header(BytesReader(_gguf([_kv_u32(b"llama.block_count", 2)], [_tensor(b"t", [32])]), "ok.gguf"))
    assert header.metadata["llama.block_count"] == 2
    assert header.tensors[0].n_bytes == 128


@pytest.mark.parametrize(
    ("data", "offset", "words"),
    [
        (b"GGML" + b"\0" * 100, 0, "wrong magic"),
        (_gguf([], [], version=1), 4, "unsupported GGUF version 1"),
        (b"GGUF" + struct.pack(">I", 3) + b"\0" * 100, 4, "big-endian"),
        (_gguf([], [], n_tensors=1 << 40), 8, "tensors, more than the file can hold"),
        (_gguf([], [], n_kv=1 << 40), 16, "metadata entries, more than the file can hold"),
        (_gguf([_string(b"k") + struct.pack("<I", 99)], []), 78, "unknown value type 99"),
        (
            _gguf([_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT8, 1 << 60)], []),
            82,
            "claims 1152921504606846976 elements",
        ),
        (_gguf([_string(b"k") + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.ARRAY, 1)], []), 82, "array of arrays"),
        (_gguf([struct.pack("<Q", 1 << 62)], []), 69, "claims 4611686018427387904 bytes"),
        (_gguf([_kv_u32(b"a", 1), _kv_u32(b"a", 2)], []), 86, "metadata key 'a' appears twice"),
        (_gguf([_string(b"k") + struct.pack("<I", GGUFValueType.STRING) + _string(b"\xff\xfe")], []), 82, "not valid UTF-8"),
        (_gguf([], [_tensor(b"t", [1] * 9)]), 69, "claims 9 dimensions"),
        (_gguf([], [_tensor(b"t", [32], type_id=250)]), 69, "unknown quantisation type 250"),
        (_gguf([], [_tensor(b"t", [1 << 40, 1 << 40])]), 69, "claims 1208925819614629174706176 elements"),
        (_gguf([], [_tensor(b"t", [33], type_id=GGMLQuantizationType.Q4_0)]), 69, "not a multiple of Q4_0's block of 32"),
        (_gguf([], [_tensor(b"t", [32]), _tensor(b"t", [32], offset=128)]), 160, "tensor 't' appears twice"),
        (_gguf([], [_tensor(b"t", [32], offset=3)]), 128, "not aligned to 32"),
        (_gguf([], [_tensor(b"t", [1 << 20])]), 128, "runs past the end of the file"),
        (_gguf([_kv_u32(b"general.alignment", 3)], []), 102, "general.alignment 3 is not a power of two"),
    ],
)
def test_hostile_header_is_one_precise_error(data: bytes, offset: int, words: str) -> None:
    error = _error(data)
    assert error.offset == offset, str(error)
    assert words in str(error)


def test_truncated_header_names_where_it_ends(gemma: Path) -> None:
    head = gemma.read_bytes()[:1_000_000]
    error = _error(head)
    # Either a read runs off the end, or a count is refused up front against what is left.
    assert "the file ends after" in str(error) or "more than the file can hold" in str(error)
    assert 0 < error.offset < 1_000_000


def test_limits_bound_what_is_read() -> None:
    big_string = _gguf([_string(b"k") + struct.pack("<I", GGUFValueType.STRING) + _string(b"x" * 5000)], [], pad_to=10_000)
    error = _error(big_string, HeaderLimits(max_string_bytes=4096))
    assert "limit 4096" in str(error)
    error = _error(big_string, HeaderLimits(max_header_bytes=1000))
    assert "past 1000 bytes" in str(error)


def _string_array(key: bytes, strings: list[bytes]) -> bytes:
    return _string(key) + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, len(strings)) + b"".join(map(_string, strings))


@pytest.mark.parametrize("read_bytes", [100, 1 << 20], ids=["in-100-byte-reads", "in-one-read"])
def test_a_vocabulary_too_long_to_keep_is_walked_with_every_bound(read_bytes: int) -> None:
    """Arrays past max_kept_array_elements are skipped string by string (a tight loop over the
    bytes read so far, the checked read at the edge of them): read in small chunks or at once,
    the walk lands where the header continues, and a string over the limit, or past the end of
    the file, is the one precise error."""
    limits = HeaderLimits(max_kept_array_elements=4, max_string_bytes=64, first_read_bytes=read_bytes, max_read_bytes=read_bytes)
    vocabulary = [b"tok%d" % i * (i % 7) for i in range(3000)]  # 0 to 42 bytes each
    after = _kv_u32(b"llama.block_count", 7)
    data = _gguf([_string_array(b"tokenizer.ggml.tokens", vocabulary), after], [], pad_to=200_000)
    header = parse_header(BytesReader(data, "vocab.gguf"), limits)
    assert header.metadata["tokenizer.ggml.tokens"] == ArraySummary("STRING", 3000)
    assert header.metadata["llama.block_count"] == 7  # the walk ended exactly where the next entry starts

    array_start = len(b"GGUF") + 4 + 8 + 8 + len(_string(b"general.architecture")) + 4 + len(_string(b"llama"))
    first_string = array_start + len(_string(b"tokenizer.ggml.tokens")) + 4 + 4 + 8
    too_long = [b"a", b"bb", b"x" * 65, b"c", b"d"]
    error = _error(_gguf([_string_array(b"tokenizer.ggml.tokens", too_long)], []), limits)
    assert error.offset == first_string + len(_string(b"a")) + len(_string(b"bb")), str(error)
    assert "tokenizer.ggml.tokens[2] claims 65 bytes (limit 64)" in str(error)

    cut = _gguf([_string_array(b"tokenizer.ggml.tokens", [b"ab"] * 40)], [], pad_to=0)[:-1]  # the last string is a byte short
    error = _error(cut, limits)
    assert "tokenizer.ggml.tokens[39]" in str(error) and "the file ends after" in str(error)

"""Fuzzing the header parser with mutated real headers: whatever the bytes, the parser returns a
header or raises HeaderError, quickly, without a traceback of any other kind or a huge allocation."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.small_gguf import write_small_gguf
from tierlocal.errors import HeaderError
from tierlocal.gguf import parse_header

_FUZZ_SETTINGS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: Peak resident memory of the whole test process; a header that made the parser allocate
#: what it claims (gigabytes) would blow through it.
_MAX_RSS_BYTES = 2 * 1024**3


class _Reader:
    """The mutated header bytes, then zeros up to the original file size (no tensor data needed)."""

    def __init__(self, header: bytes, size: int) -> None:
        self.name = "fuzzed.gguf"
        self.size = size
        self._header = header
        self.requested = 0

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.size - offset))
        self.requested += length
        chunk = self._header[offset : offset + length]
        return chunk + b"\0" * (length - len(chunk))


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    buffer = bytearray(data)
    for position, value in edits:
        buffer[position % len(buffer)] = value
    return bytes(buffer[:cut] if cut else buffer)


def _check(header: bytes, size: int) -> None:
    """Parse: a header or a HeaderError, reading no more than the real header plus its
    read-ahead (a mutated count can't make it wander through the file), within bounded memory."""
    reader = _Reader(header, size)
    try:
        parse_header(reader)
    except HeaderError as error:
        assert str(error).startswith("fuzzed.gguf: at byte ")
    assert reader.requested <= 2 * max(len(header), 256 * 1024)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < _MAX_RSS_BYTES


class _Sample:
    """Header bytes with a short repr (hypothesis prints its arguments when reporting)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data = data
        self.size = size

    def __repr__(self) -> str:
        return f"<{len(self.data)} header bytes of a {self.size}-byte file>"


@pytest.fixture(scope="module")
def gemma_header(gemma: Path) -> _Sample:
    header_bytes = 6_525_120
    with gemma.open("rb") as handle:
        return _Sample(handle.read(header_bytes), gemma.stat().st_size)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> _Sample:
    metadata = {"{arch}.block_count": 2, "{arch}.context_length": 40960, "{arch}.attention.head_count_kv": [8, 0]}
    tensors = {"blk.0.attn_q.weight": np.ones((4, 32), dtype=np.float16), "blk.1.ffn_up.weight": np.ones((2, 32), dtype=np.float32)}
    data = write_small_gguf(tmp_path_factory.mktemp("fuzz") / "small.gguf", "qwen3", metadata, tensors, tokens=64).read_bytes()
    return _Sample(data, len(data))


# Mutations land where the structure is: the key/value prologue and the tensor infos at the
# end of the header (the middle is the vocabulary's strings).
_GEMMA_HOT_SPOTS = st.one_of(st.integers(0, 4096), st.integers(6_490_000, 6_525_119), st.integers(0, 6_525_119))


@_FUZZ_SETTINGS
@given(
    edits=st.lists(st.tuples(_GEMMA_HOT_SPOTS, st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(1, 6_525_120)),
)
def test_mutated_gemma_header(gemma_header: _Sample, edits: list[tuple[int, int]], cut: int | None) -> None:
    size = gemma_header.size
    _check(_mutate(gemma_header.data, edits, cut), size if cut is None else min(size, cut))


@_FUZZ_SETTINGS
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(1, 2000)),
)
def test_mutated_small_header(small_model: _Sample, edits: list[tuple[int, int]], cut: int | None) -> None:
    mutated = _mutate(small_model.data, edits, cut)
    _check(mutated, len(mutated))

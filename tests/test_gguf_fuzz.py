"""Fuzzing the header parser with mutated real headers: whatever the bytes, the parser returns a
header or raises HeaderError, quickly, without a traceback of any other kind or a huge allocation."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierlocal.errors import HeaderError
from tierlocal.gguf import parse_header

_FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_MAX_SECONDS = 3.0
_MAX_TRACED_BYTES = 256 * 1024 * 1024


class _Reader:
    """The mutated header bytes, then zeros up to the original file size (no tensor data needed)."""

    def __init__(self, header: bytes, size: int) -> None:
        self.name = "fuzzed.gguf"
        self.size = size
        self._header = header

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.size - offset))
        chunk = self._header[offset : offset + length]
        return chunk + b"\0" * (length - len(chunk))


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    buffer = bytearray(data)
    for position, value in edits:
        buffer[position % len(buffer)] = value
    return bytes(buffer[:cut] if cut else buffer)


def _check(header: bytes, size: int) -> None:
    started = time.monotonic()
    tracemalloc.start()
    try:
        parse_header(_Reader(header, size))
    except HeaderError as error:
        assert str(error).startswith("fuzzed.gguf: at byte ")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.monotonic() - started < _MAX_SECONDS
    assert peak < _MAX_TRACED_BYTES


@pytest.fixture(scope="module")
def gemma_header(gemma: Path) -> tuple[bytes, int]:
    header_bytes = 6_525_120
    with gemma.open("rb") as handle:
        return handle.read(header_bytes), gemma.stat().st_size


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "small.gguf"
    writer = GGUFWriter(path, "qwen3")
    writer.add_block_count(2)
    writer.add_context_length(40960)
    writer.add_array("qwen3.attention.head_count_kv", [8, 0])
    writer.add_token_list([f"t{i}" for i in range(64)])
    writer.add_tensor("blk.0.attn_q.weight", np.ones((4, 32), dtype=np.float16))
    writer.add_tensor("blk.1.ffn_up.weight", np.ones((2, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


# Mutations land where the structure is: the key/value prologue and the tensor infos at the
# end of the header (the middle is the vocabulary's strings).
_GEMMA_HOT_SPOTS = st.one_of(st.integers(0, 4096), st.integers(6_490_000, 6_525_119), st.integers(0, 6_525_119))


@_FUZZ_SETTINGS
@given(
    edits=st.lists(st.tuples(_GEMMA_HOT_SPOTS, st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(1, 6_525_120)),
)
def test_mutated_gemma_header(gemma_header: tuple[bytes, int], edits: list[tuple[int, int]], cut: int | None) -> None:
    header, size = gemma_header
    _check(_mutate(header, edits, cut), size if cut is None else min(size, cut))


@_FUZZ_SETTINGS
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(1, 2000)),
)
def test_mutated_small_header(small_model: bytes, edits: list[tuple[int, int]], cut: int | None) -> None:
    mutated = _mutate(small_model, edits, cut)
    _check(mutated, len(mutated))

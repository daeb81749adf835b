"""The sparse real-architecture GGUFs used to measure the estimator: their headers describe the
published models exactly, and their data costs no disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.sparse_models import DEEPSEEK_V2_LITE, LLAMA3_8B, QWEN3_8B, QWEN3_30B_A3B, SparseArch, write_sparse_gguf
from tierlocal.fetch.sources import read_headers
from tierlocal.gguf import summarize


@pytest.mark.parametrize(
    ("arch", "published_params"),
    [
        # Parameter counts published for Llama-3.1-8B, Qwen3-8B and Qwen3-30B-A3B.
        (LLAMA3_8B, 8_030_261_248),
        (QWEN3_8B, 8_190_735_360),
        (QWEN3_30B_A3B, 30_532_122_624),
        # DeepSeek-V2-Lite is published as "15.7B"; llama.cpp's loader checks every shape.
        (DEEPSEEK_V2_LITE, 15_706_484_224),
    ],
)
def test_sparse_header_is_the_published_architecture(tmp_path: Path, arch: SparseArch, published_params: int) -> None:
    path = write_sparse_gguf(tmp_path / f"{arch.name}.gguf", arch)
    summary = summarize(read_headers(str(path)))
    assert summary.params == published_params
    assert summary.architecture == arch.arch
    assert summary.file_bytes == path.stat().st_size > 4 * 10**9
    assert path.stat().st_blocks * 512 < 16 * 1024 * 1024  # the data region is a hole
    assert summary.header_bytes + summary.tensor_bytes <= summary.file_bytes
    if arch.experts:
        assert (summary.expert_count, summary.expert_used_count) == arch.experts[:2]
    assert os.path.getsize(path) == summary.file_bytes

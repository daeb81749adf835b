"""The families the catalog added in 2026-12 (Qwen2.5 and the R1 distills, Phi-4, OLMo 2,
SmolLM3, Seed-OSS, EXAONE 4; Falcon-H1-34B below), each a sparse GGUF of its published shape loaded by the real CPU
llama-server at 4,096 tokens × 2 slots: the KV cache and the mapped weights must be llama.cpp's to
the hundredth of a MiB, and the compute buffer never below it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import sparse_models
from tests.support.assets import Assets
from tests.support.engines import free_port, llama_server_argv, running
from tests.test_memory import _COMPUTE_LINE, _KV_LINE, _MIB, _MODEL_LINE, _RS_LINE, _buffers
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.memory import compute_buffer_bytes, kv_cache, server_context, weights_split
from tierlocal.fit.model import model_spec

# (shape, its blocks with a sliding window, how far the compute formula may err high). The
# formula errs high on Phi-3's fused projections (74.0 planned vs 68.0 MiB) and EXAONE-1.2B's
# 64-wide heads (42.0 vs 34.0): the safe side; the others are within 0.1%.
CASES = [
    ("QWEN25_7B", 0, 1.001),
    ("PHI4_MINI", 0, 1.10),
    ("OLMO2_7B_8L", 0, 1.001),
    ("SMOLLM3_3B", 0, 1.001),
    ("SEED_OSS_36B_4L", 0, 1.001),
    ("EXAONE4_1_2B", 0, 1.25),
    pytest.param("EXAONE4_32B", 48, 1.001, marks=pytest.mark.long),  # 64 blocks, 32 GiB mapped
]


@pytest.mark.parametrize(("shape", "swa_blocks", "compute_over"), CASES)
def test_a_new_family_is_planned_as_the_real_engine_allocates(
    assets: Assets, tmp_path: Path, shape: str, swa_blocks: int, compute_over: float
) -> None:
    arch = getattr(sparse_models, shape)
    path = sparse_models.write_sparse_gguf(tmp_path / f"{arch.name}.gguf", arch)
    spec = model_spec(read_headers(str(path)))
    assert spec.verified and sum(spec.is_swa) == swa_blocks  # Phi-4-mini's window is in its header, and off
    params = server_context(spec, ctx=4096, parallel=2)
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, path, port, "--no-warmup", "--no-repack", ctx=4096, parallel=2)
    with running(argv, tmp_path / "server.log", f"http://127.0.0.1:{port}/health") as log_path:
        log = log_path.read_text()
    assert _buffers(_KV_LINE, log)["CPU"] == pytest.approx(kv_cache(spec, params).total_bytes / _MIB, abs=0.006)
    assert _buffers(_MODEL_LINE, log)["CPU_Mapped"] == pytest.approx(weights_split(spec, 0).cpu_mapped_bytes / _MIB, abs=0.006)
    actual_compute = _buffers(_COMPUTE_LINE, log)["CPU"]
    assert actual_compute * 0.999 <= compute_buffer_bytes(spec, params) / _MIB <= actual_compute * compute_over


def test_falcon_h1_34b_with_two_ssm_groups_is_planned_as_the_real_engine_allocates(assets: Assets, tmp_path: Path) -> None:
    """Falcon-H1-34B's first 4 blocks: its Mamba-2 mixers have 2 groups (the 1.5B in
    test_memory.py has one), which widens the convolution state; KV cache plus recurrent state
    must be llama.cpp's two buffers together (64.47 MiB), the compute buffer within 5% (163.0
    planned, 165.2 allocated)."""
    arch = sparse_models.FALCON_H1_34B_4L
    path = sparse_models.write_sparse_gguf(tmp_path / f"{arch.name}.gguf", arch)
    spec = model_spec(read_headers(str(path)))
    assert spec.verified and all(spec.is_recurrent) and spec.attention_in_recurrent
    params = server_context(spec, ctx=4096, parallel=2)
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, path, port, "--no-warmup", "--no-repack", ctx=4096, parallel=2)
    with running(argv, tmp_path / "server.log", f"http://127.0.0.1:{port}/health") as log_path:
        log = log_path.read_text()
    allocated = _buffers(_KV_LINE, log)["CPU"] + _buffers(_RS_LINE, log)["CPU"]
    assert allocated == pytest.approx(kv_cache(spec, params).total_bytes / _MIB, abs=0.01)
    assert _buffers(_MODEL_LINE, log)["CPU_Mapped"] == pytest.approx(weights_split(spec, 0).cpu_mapped_bytes / _MIB, abs=0.006)
    assert compute_buffer_bytes(spec, params) / _MIB == pytest.approx(_buffers(_COMPUTE_LINE, log)["CPU"], rel=0.05)

"""System RAM as the kernel counts it. Without an engine: which weights the CPU backend repacks,
against the CPU_REPACK buffer a real load reported (a captured log), the build's own CPU
features, and the unit's memory lines. With the engine: the prediction against /proc for loads
the constants were not fitted to (bench/host_memory.py runs the whole matrix)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.kernel_memory import measure_load
from tests.support.sparse_models import LFM2_1_2B, write_sparse_gguf
from tierlocal.engines.llama_server import parse_system_info
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.estimate import Machine, RunRequest
from tierlocal.fit.host_memory import ENGINE_FILE_BYTES, host_memory, repack_rules
from tierlocal.fit.model import model_spec
from tierlocal.fit.search import plan_run
from tierlocal.hardware.detect import cpu_features
from tierlocal.serve.systemd import memory_limits

LOGS = Path(__file__).parent / "fixtures" / "loadlogs"
MIB = 2**20


def _machine(features: tuple[str, ...] = ("avx2",)) -> Machine:
    return Machine(None, None, 0, 0, None, 24 << 30, 20 << 30, 40_000_000_000, 0, 1 << 30, cpu_arch="x86_64", cpu_features=features)


def _reported(log: str, name: str) -> float:
    return float(re.search(rf"{name} model buffer size =\s+([\d.]+) MiB", log).group(1))  # type: ignore[union-attr]


def test_repacked_weights_match_the_cpu_repack_buffer_of_a_real_load(tmp_path: Path) -> None:
    """LFM2-1.2B, all Q4_K, tied output: every multiplied matrix, and the embedding a second
    time as the output projection (tests/fixtures/loadlogs/cpu-lfm2-recurrent.log: 627.75 MiB)."""
    log = (LOGS / "cpu-lfm2-recurrent.log").read_text()
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B))))
    features = parse_system_info(log)
    assert features == ("avx2",)  # the build the log came from
    estimate = plan_run(spec, RunRequest(ctx=8192, parallel=2), _machine(features))
    memory = host_memory(spec, estimate, _machine(features))
    assert memory.repack_bytes / MIB == pytest.approx(_reported(log, "CPU_REPACK"), abs=0.01)
    assert memory.mapped_bytes / MIB == pytest.approx(_reported(log, "CPU_Mapped"), abs=0.01)
    # A CPU without AVX2 (or a build without REPACK) repacks nothing; the file is mapped all the same.
    assert host_memory(spec, estimate, _machine(())).repack_bytes == 0


def test_without_mmap_the_weights_are_anonymous_and_mlock_pins_them(tmp_path: Path) -> None:
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B))))
    estimate = plan_run(spec, RunRequest(ctx=4096, parallel=1), _machine())
    mapped, anonymous, pinned = (host_memory(spec, estimate, _machine(), mode) for mode in ("mmap", "none", "mlock"))
    assert (anonymous.mapped_bytes, pinned.mapped_bytes) == (0, 0)
    # The weights move from the page cache into the process; the repacked copies stay where they were.
    assert anonymous.anonymous_bytes - mapped.anonymous_bytes == estimate.devices[-1].weights_bytes - (mapped.repack_bytes - spec.token_embd_bytes)
    assert (
        pinned.locked_bytes
        == anonymous.anonymous_bytes
        - anonymous.repack_bytes
        - anonymous.engine_bytes
        - estimate.devices[-1].kv_bytes
        - estimate.devices[-1].output_bytes
    )
    assert mapped.in_use_bytes == mapped.peak_bytes + estimate.devices[-1].compute_bytes


def test_rules_follow_the_cpu() -> None:
    assert set(repack_rules("x86_64", ("avx2",))) == {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
    assert "Q2_K" in repack_rules("x86_64", ("avx2", "avx512f"))
    assert "Q6_K" in repack_rules("aarch64", ("asimddp",)) and repack_rules("riscv64", ("avx2",)) == {}
    assert parse_system_info("system_info: n_threads = 2 | CPU : AVX2 = 1 | LLAMAFILE = 1 |") == ()  # no REPACK, no copies
    assert parse_system_info("no such line") is None


def test_cpuinfo_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma avx512f avx512bw\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_features(info) == ("avx2", "avx512f")
    info.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\n")
    assert cpu_features(info) == ("asimddp", "i8mm")
    assert cpu_features(tmp_path / "missing") == ()


def test_unit_memory_lines() -> None:
    """MemoryHigh covers what the plan lets the cgroup hold — the engine in use, its saved prompts
    and tierlocal itself (96 MiB) — plus 10%; MemoryMax 25% above it. Issue 47: MemoryHigh was the
    engine in use + 10% (498M), and the unit's own command reached 642 MiB after 16 requests."""
    lines = memory_limits(1000 * MIB, 8192 * MIB, 24 << 30)
    assert "MemoryHigh=10217M" in lines and "MemoryMax=11610M" in lines  # (1000 + 96 + 8192) × 1.1 and × 1.25, rounded up
    tight = memory_limits(1000 * MIB, 8192 * MIB, 11 << 30)
    assert "MemoryHigh=10217M" in tight and "\nMemoryMax=" not in tight and "# No MemoryMax: 11610 MiB" in tight
    small = memory_limits(1000 * MIB, 8192 * MIB, 8 << 30)
    assert "\nMemoryHigh=" not in small and "\nMemoryMax=" not in small and "# No MemoryHigh or MemoryMax" in small


@pytest.mark.parametrize(("model", "ctx", "mode"), [("gemma", 8192, "none"), ("lfm2", 8192, "mmap"), ("gemma", 16384, "mmap")])
def test_the_kernel_agrees_within_five_percent_on_held_out_loads(assets: Assets, tmp_path: Path, model: str, ctx: int, mode: str) -> None:
    path = assets.gemma_gguf if model == "gemma" else write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B)
    actual = measure_load(assets.llama_server_cpu, path, tmp_path, ctx=ctx, load_mode=mode)
    features = parse_system_info(actual.log) or ()
    spec = model_spec(read_headers(str(path)))
    predicted = host_memory(spec, plan_run(spec, RunRequest(ctx=ctx, parallel=1), _machine(features)), _machine(features), mode)
    assert predicted.anonymous_bytes == pytest.approx(actual.anonymous_bytes, rel=0.05)
    assert predicted.peak_bytes == pytest.approx(actual.peak_bytes, rel=0.05)
    assert predicted.mapped_bytes == pytest.approx(max(actual.file_bytes - ENGINE_FILE_BYTES, 0), abs=2 * MIB)

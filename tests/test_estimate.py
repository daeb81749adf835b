"""The planner over real architecture headers (sparse files), on machines described by
numbers: the largest -ngl that fits is the largest, and MoE expert offload is chosen when it
reads fewer bytes from RAM per token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.sparse_models import LLAMA3_8B, QWEN3_30B_A3B, write_sparse_gguf
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.estimate import Machine, RunRequest, estimate_run
from tierlocal.fit.model import ModelSpec, model_spec
from tierlocal.fit.search import plan_run

_GIB = 1024**3
_MIB = 1024**2


def _machine(gpu_gib: float | None, gpu_bandwidth: int | None = 1_000 * 10**9) -> Machine:
    return Machine(
        gpu_name=None if gpu_gib is None else "GPU",
        gpu_backend="cuda",
        gpu_total_bytes=int((gpu_gib or 0) * _GIB),
        gpu_free_bytes=int((gpu_gib or 0) * _GIB),
        gpu_bandwidth=gpu_bandwidth,
        host_total_bytes=64 * _GIB,
        host_free_bytes=60 * _GIB,
        host_bandwidth=40 * 10**9,
        gpu_overhead_bytes=512 * _MIB,
        margin_bytes=1024 * _MIB,
    )


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return model_spec(read_headers(str(write_sparse_gguf(tmp_path_factory.mktemp("m") / "l.gguf", LLAMA3_8B))))


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return model_spec(read_headers(str(write_sparse_gguf(tmp_path_factory.mktemp("m") / "q.gguf", QWEN3_30B_A3B))))


@pytest.mark.parametrize("gpu_gib", [2, 4, 6, 24])
def test_largest_ngl_is_the_boundary(llama3: ModelSpec, gpu_gib: float) -> None:
    machine = _machine(gpu_gib)
    plan = plan_run(llama3, RunRequest(ctx=8192), machine)
    gpu = plan.devices[0]
    assert gpu.total_needed_bytes + machine.margin_bytes <= gpu.free_bytes
    if plan.layers_offloaded < plan.layers_total:
        more = estimate_run(llama3, replace(plan.request, ngl=plan.layers_offloaded + 1), machine)
        assert more.devices[0].total_needed_bytes + machine.margin_bytes > more.devices[0].free_bytes
    assert (plan.layers_offloaded == plan.layers_total) is (gpu_gib == 24)


def test_cpu_only_speed_is_ram_bandwidth_over_bytes_read(llama3: ModelSpec) -> None:
    plan = plan_run(llama3, RunRequest(ctx=4096), _machine(None))
    (host,) = plan.devices
    assert plan.layers_offloaded == 0 and host.name.startswith("host")
    blocks_and_output = sum(t.n_bytes for t in llama3.tensors if t.layer >= 0)  # the embedding is read a row at a time
    assert plan.est_decode_tokens_per_s == pytest.approx(40e9 / blocks_and_output)


def test_moe_keeps_attention_on_the_gpu_and_experts_on_the_cpu(qwen3_moe: ModelSpec) -> None:
    machine = _machine(8)
    plan = plan_run(qwen3_moe, RunRequest(ctx=8192), machine)
    by_layers = plan_run(qwen3_moe, RunRequest(ctx=8192, n_cpu_moe=0), machine)
    assert plan.layers_offloaded == plan.layers_total
    n_cpu_moe = plan.request.n_cpu_moe
    assert n_cpu_moe is not None and 0 < n_cpu_moe < qwen3_moe.n_layer
    assert plan.est_decode_tokens_per_s > by_layers.est_decode_tokens_per_s  # type: ignore[operator]
    # the smallest N that fits: one block fewer on the CPU would not
    fewer = estimate_run(qwen3_moe, replace(plan.request, n_cpu_moe=n_cpu_moe - 1), machine)
    assert fewer.devices[0].total_needed_bytes + machine.margin_bytes > fewer.devices[0].free_bytes
    # without the GPU's bandwidth the choice falls back to reading less from RAM
    unknown = plan_run(qwen3_moe, RunRequest(ctx=8192), _machine(8, gpu_bandwidth=None))
    assert unknown.request.n_cpu_moe == n_cpu_moe


def test_user_given_n_cpu_moe_is_kept(qwen3_moe: ModelSpec) -> None:
    plan = plan_run(qwen3_moe, RunRequest(ctx=4096, ngl=99, n_cpu_moe=46), _machine(8))
    # -ngl 99 on 48 blocks is every layer, as llama-server reads it: the plan says 49.
    assert (plan.request.ngl, plan.request.n_cpu_moe) == (49, 46)

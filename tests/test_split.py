"""Several GPUs: the layer split `check --gpu N×…` plans, against llama.cpp's own split across
two RPC devices (ggml-rpc-server from the CPU build, on loopback) — a multi-device load
measured without GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.catalog_headers import header_path
from tests.support.cli import run_cli
from tests.support.compact_file import first_blocks, write_compact_as_gguf
from tests.support.rpc_split import load_split, rpc_servers
from tierlocal.fit.model import model_spec
from tierlocal.fit.split import layer_devices, split_ratio
from tierlocal.gguf.compact import from_compact

_MIB = 2**20


def _plan(model: str | Path, *args: str) -> dict[str, object]:
    result = run_cli("check", str(model), *args, "--ram", "16GiB", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _spec(name: str):  # type: ignore[no-untyped-def]
    return model_spec(from_compact(json.loads(header_path(name, "Q4_K_M").read_text()), name))


def test_layers_go_to_devices_by_cumulative_share() -> None:
    """llama.cpp's rule, worked by hand for Llama-3.2-1B (16 blocks + the output layer = 17):
    with -ts 1,1 layer il goes to device 1 once il/17 ≥ 0.5, i.e. from il = 9; with -ts 2,1
    once il/17 ≥ 2/3, from il = 12; with -ngl 10 only layers 7..16 are offloaded."""
    spec = _spec("llama-3.2-1b")
    assert layer_devices(spec, 99, (1, 1)) == (0,) * 9 + (1,) * 8
    assert layer_devices(spec, 99, (2, 1)) == (0,) * 12 + (1,) * 5
    assert layer_devices(spec, 10, (1, 1)) == (-1,) * 7 + (0,) * 5 + (1,) * 5
    assert split_ratio([24 * 1024 * _MIB, 12 * 1024 * _MIB]) == (2, 1)


def test_two_rtx_3090s_are_both_planned() -> None:
    payload = _plan("llama-3.3-70b:q4_k_m", "--gpu", "2xRTX 3090")["plan"]
    devices = payload["devices"]  # type: ignore[index]
    assert [d["name"] for d in devices] == ["RTX 3090 #0", "RTX 3090 #1", "host (CPU, RAM)"]
    assert payload["layers_offloaded"] == payload["layers_total"] == 81  # type: ignore[index]
    command = payload["command"]  # type: ignore[index]
    assert command[command.index("-ts") + 1] == "1,1"
    # 42.5 GB of weights do not fit one 24 GB card: two hold them with 8k of context.
    one = _plan("llama-3.3-70b:q4_k_m", "--gpu", "RTX 3090")["plan"]
    assert one["layers_offloaded"] < one["layers_total"]  # type: ignore[index, operator]
    human = " ".join(run_cli("check", "--gpu", "2xRTX 3090", "--ram", "32GiB").stdout.split())
    assert "RTX 3090 #0" in human and "RTX 3090 #1" in human and "does not split" not in human


@pytest.mark.parametrize(
    ("name", "gpus", "extra"),
    [
        ("llama-3.2-1b", ("24GiB", "24GiB"), ("--ctx", "4096")),
        ("gemma-3-1b", ("24GiB", "12GiB"), ("--ctx", "8192")),  # sliding-window layers, an uneven split
        ("lfm2-1.2b", ("24GiB", "24GiB"), ("--ctx", "4096", "--parallel", "2")),  # a hybrid: convolution state and KV
    ],
)
def test_a_two_device_load_matches_the_planned_split(
    assets: Assets, tmp_path: Path, name: str, gpus: tuple[str, str], extra: tuple[str, ...]
) -> None:
    model = write_compact_as_gguf(json.loads(header_path(name, "Q4_K_M").read_text()), tmp_path / f"{name}.gguf")
    plan = _plan(model, *(f"--gpu={gpu}" for gpu in gpus), *extra)
    args = [arg for arg in plan["command"][3:] if arg != "--no-jinja"]  # type: ignore[index]
    if "--chat-template" in args:
        del args[args.index("--chat-template") : args.index("--chat-template") + 2]
    with rpc_servers(assets.rpc_server, 2) as endpoints:
        load = load_split(assets.llama_server_cpu, model, endpoints, args, tmp_path / "load.log")
    assert load.report.layers_offloaded == plan["layers_offloaded"] == plan["layers_total"]
    for planned, actual in zip(plan["devices"][:2], load.devices, strict=True):  # type: ignore[index]
        # Layers per device exact: their weights and KV to the byte (MiB as logged, 2 decimals).
        assert abs(planned["weights_bytes"] - actual["weights"]) < 0.01 * _MIB
        assert abs(planned["kv_bytes"] - actual["kv"]) < 0.01 * _MIB
        planned_total = planned["weights_bytes"] + planned["kv_bytes"] + planned["compute_bytes"]
        assert abs(planned_total / sum(actual.values()) - 1) < 0.05, (planned, actual)
    host = plan["devices"][-1]  # type: ignore[index]
    assert abs(host["weights_bytes"] - load.host["weights"]) < 0.01 * _MIB
    assert abs(host["compute_bytes"] / load.host["compute"] - 1) < 0.05


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("nemotron-nano-9b-v2", ("24GiB", "24GiB")),  # Mamba-2 blocks on both sides of the boundary
        ("nemotron-nano-9b-v2", ("24GiB", "48GiB")),
        ("granite-4.0-h-350m", ("48GiB", "24GiB")),  # a Mamba-2 block before the boundary, another after
        ("granite-4.0-h-350m", ("24GiB", "24GiB")),  # attention first on the second device: nothing moves
        ("rwkv7", ("24GiB", "24GiB")),  # every boundary: the channel mix's token shift moves
        ("falcon-h1-1.5b", ("24GiB", "24GiB")),  # attention and Mamba-2 in every block
    ],
)
def test_a_recurrent_split_plans_no_device_under_what_llama_cpp_allocates(assets: Assets, tmp_path: Path, name: str, gpus: tuple[str, str]) -> None:
    """Hybrid and recurrent graphs on a split: the scheduler moves a recurrent block's weight-free
    tail across the boundary and keeps four copies of its inputs (tierlocal.fit.split
    boundary_copies_bytes). Planned 24–45% under before (device totals −1.6…−8.4%): an OOM at
    load on real cards. Every device's total now at or above the engine's, within 8%."""
    from tests.support.sparse_models import RWKV7_168M, write_sparse_gguf

    if name == "rwkv7":
        model = write_sparse_gguf(tmp_path / "rwkv7.gguf", RWKV7_168M)
    else:
        compact = json.loads(header_path(name, "Q4_K_M").read_text())
        if name.startswith("nemotron"):  # its first 16 blocks: Mamba-2, MLP and one attention block, a fifth of the weights to ship
            compact = first_blocks(compact, 16)
        model = write_compact_as_gguf(compact, tmp_path / f"{name}.gguf")
    plan = _plan(model, *(f"--gpu={gpu}" for gpu in gpus), "--ctx", "4096", "--parallel", "2")
    args = [arg for arg in plan["command"][3:] if arg != "--no-jinja"]  # type: ignore[index]
    if "--chat-template" in args:
        del args[args.index("--chat-template") : args.index("--chat-template") + 2]
    with rpc_servers(assets.rpc_server, 2) as endpoints:
        load = load_split(assets.llama_server_cpu, model, endpoints, args, tmp_path / "load.log")
    assert load.report.layers_offloaded == plan["layers_total"]
    for planned, actual in zip(plan["devices"][:2], load.devices, strict=True):  # type: ignore[index]
        planned_total = planned["weights_bytes"] + planned["kv_bytes"] + planned["compute_bytes"]
        assert 1.0 <= planned_total / sum(actual.values()) < 1.08, (planned, actual)
    host = plan["devices"][-1]  # type: ignore[index]
    assert abs(host["compute_bytes"] / load.host["compute"] - 1) < 0.01, (host["compute_bytes"], load.host)  # 10–50 KiB apart


def test_serve_verification_holds_for_a_split(assets: Assets, tmp_path: Path) -> None:
    """What serve checks after a load: the plan for two devices against llama.cpp's real split
    log holds (every GPU's buffers together against every planned GPU's)."""
    from dataclasses import replace as with_

    from tierlocal.catalog import load_host_defaults
    from tierlocal.fetch.sources import read_headers
    from tierlocal.fit.estimate import RunRequest
    from tierlocal.hardware.detect import detect
    from tierlocal.hardware.override import with_gpu_override
    from tierlocal.plan.inputs import PlanAsk, PlanInputs
    from tierlocal.plan.machine import machine_for
    from tierlocal.plan.source import check_source
    from tierlocal.plan.verify import verify_load

    model = write_compact_as_gguf(json.loads(header_path("qwen3-0.6b", "Q4_K_M").read_text()), tmp_path / "q.gguf")
    machine = machine_for(with_gpu_override(detect(), ["24GiB", "24GiB"]), load_host_defaults())
    check = check_source(str(model), read_headers(str(model)), PlanInputs(machine), PlanAsk(4096, 2, RunRequest()))
    assert check.estimate is not None and check.estimate.tensor_split == (1, 1)
    args = [arg for arg in check.command[3:] if arg not in ("--no-jinja",)]
    if "--chat-template" in args:
        del args[args.index("--chat-template") : args.index("--chat-template") + 2]
    with rpc_servers(assets.rpc_server, 2) as endpoints:
        load = load_split(assets.llama_server_cpu, model, endpoints, args, tmp_path / "load.log")
    verification = verify_load(check.estimate, load.report)
    assert verification.ok, verification.problems
    gpus = verification.devices[0]
    assert gpus.name.count("RPC0[") == 2 and abs(gpus.error or 0) < 0.05  # type: ignore[union-attr]
    # The check would fail if it compared one planned device with both devices' buffers.
    one = with_(check.estimate, devices=check.estimate.devices[:1] + check.estimate.devices[2:])
    assert not verify_load(one, load.report).ok


def test_a_partial_split_places_the_planned_layers(assets: Assets, tmp_path: Path) -> None:
    """-ngl 10 of 17 across two devices: the same layers on each as planned (weights and KV
    exact). (RPC devices do not take the CPU layers' operations, as CUDA and Vulkan do: their
    compute buffers, and the host's, are not compared here.)"""
    model = write_compact_as_gguf(json.loads(header_path("llama-3.2-1b", "Q4_K_M").read_text()), tmp_path / "l1b.gguf")
    plan = _plan(model, "--gpu=24GiB", "--gpu=12GiB", "--ctx", "4096", "--ngl", "10")
    assert plan["command"][plan["command"].index("-ts") + 1] == "2,1"  # type: ignore[index, union-attr]
    with rpc_servers(assets.rpc_server, 2) as endpoints:
        load = load_split(assets.llama_server_cpu, model, endpoints, plan["command"][3:], tmp_path / "load.log")  # type: ignore[index]
    assert load.report.layers_offloaded == 10
    for planned, actual in zip(plan["devices"][:2], load.devices, strict=True):  # type: ignore[index]
        assert abs(planned["weights_bytes"] - actual["weights"]) < 0.01 * _MIB
        assert abs(planned["kv_bytes"] - actual["kv"]) < 0.01 * _MIB

"""``tierlocal check SOURCE``: the plan for one model, and the command it prints is the one
that loads — run with the real Vulkan build on Mesa's software device."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.engines import ENGINE_THREADS, free_port, running

_MIB = 1024 * 1024
_KV_LINE = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")


def _vulkan_env(assets: Assets) -> dict[str, str]:
    return {"TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_vulkan), "GGML_VK_VISIBLE_DEVICES": "0"}


def _check(assets: Assets, *args: str) -> dict:  # type: ignore[type-arg]
    result = run_cli("check", str(assets.gemma_gguf), *args, "--json", env=_vulkan_env(assets))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _load_log(assets: Assets, command: list[str], tmp_path: Path) -> str:
    """The load log of the Vulkan llama-server started with the arguments of ``command`` (a
    plan's printed ``llama-server …``) on loopback, with trace-level logs."""
    port = free_port()
    argv = [str(assets.llama_server_vulkan), *command[1:], "--host", "127.0.0.1", "--port", str(port), "-lv", "4", "-t", ENGINE_THREADS]
    with running(
        [*argv, "--no-warmup"], tmp_path / "server.log", f"http://127.0.0.1:{port}/health", env={"GGML_VK_VISIBLE_DEVICES": "0"}
    ) as log_path:
        return log_path.read_text()


@pytest.mark.parametrize("args", [("--ctx", "max"), ("--ctx", "8192", "--parallel", "max"), ("--ctx", "4096", "--ngl", "7")])
def test_the_printed_command_loads_as_planned(assets: Assets, tmp_path: Path, args: tuple[str, ...]) -> None:
    plan = _check(assets, *args)
    assert plan["fits"] is True
    command = plan["command"]
    assert command[:3] == ["llama-server", "-m", str(assets.gemma_gguf)]
    log = _load_log(assets, command, tmp_path)
    assert "failed to allocate" not in log
    assert f"offloaded {plan['layers_offloaded']}/{plan['layers_total']} layers to GPU" in log
    assert re.search(rf"n_ctx\s+= {plan['request']['ctx']}\b", log)
    devices = {device["backend"]: device for device in plan["devices"]}
    kv_by_device: dict[str, float] = {}
    for name, mib in _KV_LINE.findall(log):
        kv_by_device[name] = kv_by_device.get(name, 0.0) + float(mib)
    assert kv_by_device
    assert kv_by_device.get("Vulkan0", 0.0) == pytest.approx(devices["vulkan"]["kv_bytes"] / _MIB, abs=0.02)
    assert kv_by_device.get("CPU", 0.0) == pytest.approx(devices["cpu"]["kv_bytes"] / _MIB, abs=0.02)


def test_user_settings_are_honoured_not_replanned(assets: Assets) -> None:
    plan = _check(assets, "--ctx", "2048", "--ngl", "7", "--parallel", "2", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    assert plan["request"]["ngl"] == 7 and plan["layers_offloaded"] == 7
    assert plan["request"]["parallel"] == 2 and plan["request"]["ctx_per_slot"] == 2048
    assert plan["command"][plan["command"].index("-ctk") + 1] == "q8_0"
    assert plan["ollama"] == {
        "num_gpu": 7,
        "num_ctx": 2048,
        "env": {
            "OLLAMA_NUM_PARALLEL": "2",
            "OLLAMA_CONTEXT_LENGTH": "2048",
            "OLLAMA_MAX_QUEUE": "8",
            "OLLAMA_FLASH_ATTENTION": "1",
            "OLLAMA_KV_CACHE_TYPE": "q8_0",
        },
    }


def test_cpu_only_machine_plans_everything_on_the_host(assets: Assets) -> None:
    result = run_cli("check", str(assets.gemma_gguf), "--ctx", "4096", "--json", env={"PATH": "/usr/bin:/bin"})
    plan = json.loads(result.stdout)
    assert plan["layers_offloaded"] == 0
    (host,) = plan["devices"]
    # weights 235.16 MiB + KV (3 global layers × 4096 + 15 SWA layers × 1024 cells) + compute + logits
    assert host["weights_bytes"] == 246_587_904
    assert host["kv_bytes"] == (3 * 4096 + 15 * 1024) * 512 * 2
    assert host["output_bytes"] == 262_144 * 4
    assert host["total_needed_bytes"] == host["weights_bytes"] + host["kv_bytes"] + host["compute_bytes"] + host["output_bytes"]


def test_frontier_and_unknown_sources() -> None:
    k3 = json.loads(run_cli("check", "kimi-k3", "--json").stdout)
    assert k3["frontier"][0]["fits"] is False
    result = run_cli("check", "no-such-model")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "error: 'no-such-model' is neither a catalog model nor a GGUF path"
    result = run_cli("check", "kimi-k3", "--ctx", "max")
    assert result.returncode == 2 and "need a GGUF SOURCE" in result.stderr


def test_spill_speed_and_cache_type_suggestion(tmp_path: Path) -> None:
    """A sparse Llama-3-8B header on a 16 GB card: 128k tokens of f16 KV (16 GiB) cannot stay
    on the GPU; the plan says how much slower the spilled layers make it, and that q8_0 K/V
    changes the answer."""
    from tests.support.sparse_models import LLAMA3_8B, write_sparse_gguf

    path = write_sparse_gguf(tmp_path / "llama3.gguf", LLAMA3_8B)
    result = run_cli("check", str(path), "--ctx", "131072", "--gpu", "RTX 4060 Ti", "--json", env={"PATH": "/usr/bin:/bin"})
    plan = json.loads(result.stdout)
    assert 0 < plan["layers_offloaded"] < plan["layers_total"]
    speed = plan["speed"]
    assert speed["gpu_bandwidth_bytes_per_s"] == 288e9
    assert speed["all_on_gpu_tokens_per_s"] == pytest.approx(
        288e9 / (speed["gpu_read_bytes_per_token"] + speed["host_read_bytes_per_token"]), abs=0.1
    )
    expected = 1 / (speed["gpu_read_bytes_per_token"] / 288e9 + speed["host_read_bytes_per_token"] / speed["host_bandwidth_bytes_per_s"])
    assert plan["bound_decode_tokens_per_s"] == pytest.approx(expected, abs=0.1)
    assert plan["bound_decode_tokens_per_s"] < speed["all_on_gpu_tokens_per_s"] / 2
    # The headline prices the GPU's part from the published fit (the 4060 Ti: derived from its
    # generation) and the RAM's from published runs of CPUs like this one (not calibrated), so it
    # sits under the bound; its basis is the device that spends most of a token, RAM here.
    estimate = speed["estimate"]
    assert estimate["decode_s_per_token"]["host"] > estimate["decode_s_per_token"]["gpu"] > 0
    assert plan["speed_basis"] == "derived" and estimate["sources"]["gpu"].startswith("derived: datasheet × the Ada Lovelace cards' median")
    assert estimate["sources"]["host"].startswith("derived: not calibrated: priced from")
    assert plan["est_decode_tokens_per_s"] == estimate["decode_tokens_per_s"] < plan["bound_decode_tokens_per_s"]
    suggestion = plan["suggestion"]
    assert suggestion["cache_type_k"] == "q8_0" and suggestion["layers_offloaded"] > plan["layers_offloaded"]
    human = run_cli("check", str(path), "--ctx", "131072", "--gpu", "RTX 4060 Ti", env={"PATH": "/usr/bin:/bin"}).stdout
    assert "layers run from system RAM" in human and "Suggestion: -ctk q8_0 -ctv q8_0 -fa on" in human
    assert "hw --calibrate" in " ".join(human.split())  # the RAM's part is this CPU's: timing it helps
    elsewhere = run_cli("check", str(path), "--ctx", "131072", "--gpu", "RTX 4060 Ti", "--ram", "64GiB", env={"PATH": "/usr/bin:/bin"}).stdout
    assert "layers run from system RAM" in elsewhere and "hw --calibrate" not in " ".join(elsewhere.split())  # another machine's CPU: it cannot


def test_an_unmodelled_state_is_named_and_the_architecture_labelled_unverified(tmp_path: Path) -> None:
    """MiniMax-01's lightning attention keeps a state outside the modelled families: the
    generic estimate, with that state named, in the table and the JSON (not a refusal)."""
    import numpy as np

    from tests.support.small_gguf import write_small_gguf

    metadata = {
        "{arch}.block_count": 2,
        "{arch}.context_length": 4096,
        "{arch}.embedding_length": 64,
        "{arch}.attention.head_count": 4,
        "{arch}.linear_attention.head_dim": 16,
    }
    path = write_small_gguf(tmp_path / "hybrid.gguf", "minimax-01", metadata, {"blk.0.attn_q.weight": np.ones((64, 64), dtype=np.float16)})
    result = run_cli("check", str(path), "--ctx", "4096", "--json")
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)["model"]
    assert model["verified"] is False and model["unknown_state"] == ["linear_attention.head_dim"]
    assert "unverified architecture (minimax-01)" in model["unverified_note"] and "is not counted" in model["unverified_note"]
    human = " ".join(run_cli("check", str(path), "--ctx", "4096").stdout.split())
    assert "Unverified: unverified architecture (minimax-01)" in human and "linear_attention.head_dim" in human


def test_a_context_past_the_trained_one_is_planned_at_it_as_llama_server_caps_each_slot(tmp_path: Path) -> None:
    """--ctx 40000 on a model trained for 4,096 once said "fits" and nothing else; then it planned
    the whole cache, of which llama-server uses the trained context per slot unless RoPE is
    stretched (issue 47: a 1,000,192-token cache of which 32,768 per slot were used)."""
    import numpy as np

    from tests.support.small_gguf import write_small_gguf

    metadata = {"{arch}.block_count": 2, "{arch}.context_length": 4096, "{arch}.embedding_length": 64, "{arch}.attention.head_count": 4}
    path = write_small_gguf(tmp_path / "short.gguf", "llama", metadata, {"blk.0.attn_q.weight": np.ones((64, 64), dtype=np.float16)})
    within = json.loads(run_cli("check", str(path), "--ctx", "4096", "--json").stdout)
    assert within["model"]["n_ctx_train"] == 4096 and within["context_note"] is None
    beyond = json.loads(run_cli("check", str(path), "--ctx", "8192", "--parallel", "2", "--json").stdout)
    assert beyond["fits"] is True and beyond["request"]["ctx_per_slot"] == 4096 and beyond["request"]["ctx"] == 8192
    assert beyond["context_note"] == (
        "8,192 tokens per slot asked; the model was trained for 4,096 and llama-server caps each slot there, so the cache is planned for 4,096 "
        "per slot (for 8,192, stretch RoPE: -- --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 4096; answers may degrade past 4,096)"
    )
    assert beyond["command"][beyond["command"].index("-c") + 1] == "8192"  # 2 slots × 4,096
    assert sum(device["kv_bytes"] for device in beyond["devices"]) == 2 * sum(device["kv_bytes"] for device in within["devices"])
    human = " ".join(run_cli("check", str(path), "--ctx", "8192").stdout.split())
    assert "Beyond training: 8,192 tokens per slot asked; the model was trained for 4,096" in human


def test_the_prompt_cache_is_capped_at_what_the_plan_leaves(tmp_path: Path) -> None:
    """llama-server keeps saved prompts up to 8 GiB (--cache-ram) after the plan is loaded: on a
    machine with less left than that, the command caps it there, so the plan holds under use."""
    import numpy as np

    from tests.support.small_gguf import write_small_gguf

    metadata = {"{arch}.block_count": 2, "{arch}.context_length": 4096, "{arch}.embedding_length": 64, "{arch}.attention.head_count": 4}
    path = write_small_gguf(tmp_path / "small.gguf", "llama", metadata, {"blk.0.attn_q.weight": np.ones((64, 64), dtype=np.float16)})
    roomy = json.loads(run_cli("check", str(path), "--ctx", "4096", "--ram", "64GiB", "--json").stdout)
    assert "--cache-ram" not in roomy["command"] and roomy["host_memory"]["modes"][0]["grows_by_bytes"] == 8 * 2**30
    tight = json.loads(run_cli("check", str(path), "--ctx", "4096", "--ram", "3GiB", "--json").stdout)
    in_use = tight["host_memory"]["modes"][0]["in_use_bytes"]
    left_mib = (3 * 2**30 - in_use - 1024 * 2**20) // 2**20  # recipes/gpus.toml: fit_margin_mib = 1024 kept free
    command = tight["command"]
    assert command[command.index("--cache-ram") + 1] == str(left_mib) and 1900 < left_mib < 2048
    assert all(mode["grows_by_bytes"] == left_mib * 2**20 for mode in tight["host_memory"]["modes"])
    human = " ".join(run_cli("check", str(path), "--ctx", "4096", "--ram", "3GiB").stdout.split())
    assert "(--cache-ram: the RAM the plan leaves, below the 8 GiB default)" in human


def test_a_modelled_hybrid_is_planned_with_its_state(tmp_path: Path) -> None:
    """Nemotron-H's Mamba-2 blocks: planned, the state in the KV column (no refusal)."""
    import numpy as np

    from tests.support.small_gguf import write_small_gguf

    metadata = {
        "{arch}.block_count": 2,
        "{arch}.context_length": 4096,
        "{arch}.embedding_length": 64,
        "{arch}.attention.head_count": 4,
        "{arch}.attention.head_count_kv": [0, 4],
        "{arch}.feed_forward_length": [0, 0],
        "{arch}.ssm.conv_kernel": 4,
        "{arch}.ssm.state_size": 16,
        "{arch}.ssm.group_count": 1,
        "{arch}.ssm.inner_size": 128,
    }
    path = write_small_gguf(tmp_path / "hybrid.gguf", "nemotron_h", metadata, {"blk.0.attn_q.weight": np.ones((64, 64), dtype=np.float16)})
    result = run_cli("check", str(path), "--ctx", "4096", "--json")
    assert result.returncode == 0, result.stderr
    host = json.loads(result.stdout)["devices"][-1]
    state = (3 * (128 + 2 * 16) + 16 * 128) * 4  # one sequence
    kv = 4 * 16 * 2 * 2 * 4096  # 4 KV heads of 64 / 4 = 16, K and V, f16, 4096 cells
    assert host["kv_bytes"] == state + kv


def test_a_gpu_too_small_for_anything_plans_the_cpu_alone(assets: Assets, tmp_path: Path) -> None:
    """100 MiB cannot hold even the runtime allowance: the plan runs on the CPU with -dev none,
    and llama.cpp then allocates nothing on the device."""
    plan = _check(assets, "--gpu", "100MiB", "--ctx", "2048")
    assert plan["fits"] is True
    command = plan["command"]
    assert command[command.index("-dev") + 1] == "none" and plan["layers_offloaded"] == 0
    assert [device["backend"] for device in plan["devices"]] == ["cpu"]
    log = _load_log(assets, plan["command"], tmp_path)
    assert "Vulkan0 model buffer" not in log and "Vulkan0 compute buffer" not in log and "Vulkan0 KV buffer" not in log
    assert re.search(r"n_ctx\s+= 2048\b", log)


def test_ngl_takes_what_llama_server_takes_and_prints_the_resolved_number(tmp_path: Path) -> None:
    """`--ngl all` is every layer (Llama-3-8B: 32 blocks + the output layer = 33), printed as
    the number; a count above the layers means the same; `auto` is the planner's choice, as with
    no --ngl; anything else is one clear error."""
    from tests.support.sparse_models import LLAMA3_8B, write_sparse_gguf

    path = str(write_sparse_gguf(tmp_path / "llama3.gguf", LLAMA3_8B))

    def plan(*args: str) -> dict:  # type: ignore[type-arg]
        result = run_cli("check", path, "--gpu", "24GiB", "--ctx", "4096", "--json", *args, env={"PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    for every in (plan("--ngl", "all"), plan("--ngl", "ALL"), plan("--ngl", "999")):
        assert every["request"]["ngl"] == every["layers_offloaded"] == every["layers_total"] == 33
        assert every["command"][every["command"].index("-ngl") + 1] == "33"
        assert every["ollama"]["num_gpu"] == 33
    auto, default = plan("--ngl", "auto"), plan()  # (host RAM free moves between runs: compare the plan)
    assert (auto["request"], auto["layers_offloaded"], auto["command"]) == (default["request"], default["layers_offloaded"], default["command"])
    assert plan("--ngl", "12")["layers_offloaded"] == 12
    human = run_cli("check", path, "--gpu", "24GiB", "--ngl", "all", env={"PATH": "/usr/bin:/bin"}).stdout
    flat = " ".join(human.split())  # rich wraps at 120 columns, and the temporary path's length varies
    assert "33/33 layers on the GPU" in flat and "-ngl 33" in flat
    bad = run_cli("check", path, "--ngl", "most")
    assert bad.returncode == 2 and "'most' is not a layer count: give 0 to 10000, 'all' or 'auto'" in bad.stderr

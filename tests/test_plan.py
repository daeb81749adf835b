"""``tierlocal plan``: every figure checked against arithmetic done here by hand from the
published facts (recipes/, each with its source and date), for the defaults, other GPUs, other prices and other
token mixes; GGUF and hub sources; errors."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import run_cli
from tests.support.servers import HubRepo, fake_hub
from tests.support.small_gguf import write_small_gguf

_GIB = 1024**3
K3_PARAMS = 2_779_900_000_000
K3_WEIGHTS_MXFP4 = K3_PARAMS // 2  # 0.5 byte per weight, as the published tables count it
K3_SERVING_FLOOR = 1_680_000_000_000
# Moonshot prices, USD per million tokens: cache hit 0.30, cache miss 3.00, output 15.00.
HIT, MISS, OUT = 0.30, 3.00, 15.00


def _plan(*args: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    result = run_cli("plan", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _count(payload: dict, gpu: str) -> int:  # type: ignore[type-arg]
    return next(row["count"] for row in payload["gpus_for_weights"] if row["gpu"] == gpu)


def test_kimi_k3_defaults() -> None:
    payload = _plan("kimi-k3")
    model = payload["model"]
    assert (model["params"], model["active_params"], model["precision"]) == (K3_PARAMS, 104_000_000_000, "mxfp4")
    assert model["weights_bytes"] == K3_WEIGHTS_MXFP4
    assert model["weights_with_block_scales_bytes"] == round(K3_PARAMS * (0.5 + 1 / 32))
    by_precision = {row["precision"]: row["weights_bytes"] for row in payload["weights_by_precision"]}
    assert by_precision == {"bf16": 2 * K3_PARAMS, "fp8": K3_PARAMS, "mxfp4": K3_PARAMS // 2, "int4": K3_PARAMS // 2, "2bit": K3_PARAMS // 4}
    # GPUs to hold the weights: ceil(1.39 TB / marketed memory, decimal); H200 141 GB, H100 80 GB, B300 288 GB.
    assert _count(payload, "H200") == math.ceil(K3_WEIGHTS_MXFP4 / 141e9) == 10
    assert _count(payload, "H100") == math.ceil(K3_WEIGHTS_MXFP4 / 80e9) == 18
    assert _count(payload, "B300") == math.ceil(K3_WEIGHTS_MXFP4 / 288e9) == 5
    # ... and to hold the 1.56 TB of files as shipped (block scales, unquantised layers, the
    # vision encoder): 6 B300, 20 H100. Both are shown, labelled.
    b300 = next(row for row in payload["gpus_for_weights"] if row["gpu"] == "B300")
    assert b300["shipped_count"] == math.ceil(1.56e12 / 288e9) == 6
    assert next(row for row in payload["gpus_for_weights"] if row["gpu"] == "H100")["shipped_count"] == math.ceil(1.56e12 / 80e9) == 20
    assert "≥ 5 × B300" in payload["headline"] and "(6 × B300 for the 1.56 TB of files as shipped)" in payload["headline"]
    # ... and where the driver's usable memory is on record, the count it gives: H100 81559 MiB.
    h100 = next(row for row in payload["gpus_for_weights"] if row["gpu"] == "H100")
    assert (h100["usable_bytes"], h100["usable_count"]) == (81559 * 2**20, math.ceil(K3_WEIGHTS_MXFP4 / (81559 * 2**20)))
    assert payload["serving_floor_bytes"] == K3_SERVING_FLOOR and payload["serving_floor_published"] is True
    # The cheapest cluster that clears the 1.68 TB floor: 8 × B300 (6 needed, a node of 8 built).
    first = payload["serving_configs"][0]
    assert (first["gpu"], first["count"]) == ("B300", 8)
    assert {c["label"] for c in payload["published_configs"]} == {"8×B300", "8×MI355X", "16×H200", "16×B200", "32×H100"}
    # Per user, from config.json's dimensions, worked by hand: 24 MLA layers cache a 512 + 64
    # latent per token in f16; 69 Kimi Delta Attention layers keep, in f32, the Q/K/V
    # convolutions' last 3 columns for 96 heads × 128 and a 128 × 128 state per head.
    per_token = 24 * (512 + 64) * 2
    state = 69 * (3 * 3 * 96 * 128 + 96 * 128 * 128) * 4
    assert (payload["kv_bytes_per_token"], payload["fixed_state_bytes_per_user"]) == (per_token, state) == (27_648, 464_633_856)
    assert payload["kv_per_user"][0] == {"ctx": 8192, "bytes": per_token * 8192 + state}
    assert payload["kv_per_user"][-1] == {"ctx": 1_048_576, "bytes": per_token * 1_048_576 + state}
    assert "kv_unknown_reason" not in payload and "kv_classic_example" not in payload
    assert any("config.json text_config" in source for source in payload["sources"])
    # Rental at $2.50/GPU-h (the guides' rate, in the dated $2–5 range), 720 h a month.
    rental = {row["label"]: row["usd_per_month"] for row in payload["rental"]}
    assert rental == {
        "1 GPU always on": 1 * 720 * 2.5,
        "8 GPUs 4 h/day": 8 * 120 * 2.5,
        "8 GPUs always on": 8 * 720 * 2.5,
        "32 GPUs always on": 32 * 720 * 2.5,
    }
    even = payload["break_even"]
    assert even["monthly_cost_usd"] == 8 * 720 * 2.5
    assert even["output_tokens_per_month"] == pytest.approx(14_400 / OUT * 1e6)
    blended = 0.75 * (0.5 * HIT + 0.5 * MISS) + 0.25 * OUT
    assert even["blended_usd_per_million"] == pytest.approx(blended)
    assert even["blended_tokens_per_month"] == pytest.approx(14_400 / blended * 1e6)
    # Download of the 1.56 TB repo: 1 GB/s ≈ 26 minutes.
    assert {row["bandwidth_bytes_per_s"]: row["seconds"] for row in payload["download"]}[1e9] == pytest.approx(1560)
    assert payload["disk_bytes"] == 4_000_000_000_000
    vllm, sglang = payload["launch"]["vllm"], payload["launch"]["sglang"]
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "8" and "--enable-prefix-caching" in vllm
    # One node: the cookbook's B300 1×8 cell, one tensor group of the 8 GPUs (no --ep-size).
    assert sglang[sglang.index("--tp-size") + 1] == "8" and "--ep-size" not in sglang and "--nnodes" not in sglang
    assert payload["headline"].startswith("Kimi K3 needs ≥ 1.39 TB for weights alone: tier 1 (a cluster), ≥ 5 × B300")


def test_other_gpu_price_and_volume() -> None:
    payload = _plan("kimi-k3", "--gpu", "H200", "--rate", "3.5", "--tokens-per-month", "2B")
    assert [row["gpu"] for row in payload["gpus_for_weights"]] == ["H200"]
    # Floor 1.68 TB / 141 GB = 11.9 → 12 → two nodes of 8.
    assert payload["serving_configs"] == [{"gpu": "H200", "count": 16, "memory_bytes": 16 * 141 * 10**9}]
    monthly = 16 * 720 * 3.5
    blended = 0.75 * (0.5 * HIT + 0.5 * MISS) + 0.25 * OUT
    assert payload["break_even"]["monthly_cost_usd"] == monthly
    assert payload["volume"] == {
        "tokens_per_month": 2e9,
        "api_usd_per_month": pytest.approx(2e9 * blended / 1e6),
        "rent_usd_per_month": monthly,
        "cheaper": "api",
    }
    # Two nodes: the cookbook's H200 2×8 cell, --tp-size 16 --ep-size 16 (the tensor group spans both nodes).
    sglang = payload["launch"]["sglang"]
    assert sglang[sglang.index("--tp-size") + 1 : sglang.index("--tp-size") + 4] == ["16", "--ep-size", "16"]
    assert sglang[sglang.index("--nnodes") + 1] == "2"
    assert "At 2.0B tokens/month the API is cheaper" in payload["headline"]


def test_a_gpu_size_not_in_the_tables_and_a_custom_mix() -> None:
    payload = _plan("kimi-k3", "--gpu", "96GB", "--rate", "2.5", "--input-share", "0.5", "--cache-hit", "0")
    assert _count(payload, "96GB GPU") == math.ceil(K3_WEIGHTS_MXFP4 / 96e9) == 15
    assert payload["serving_configs"][0]["count"] == 24  # ceil(1.68e12 / 96e9) = 18 → three nodes of 8
    even = payload["break_even"]
    assert even["monthly_cost_usd"] == 24 * 720 * 2.5
    assert even["blended_usd_per_million"] == pytest.approx(0.5 * MISS + 0.5 * OUT)
    assert even["blended_tokens_per_month"] == pytest.approx(43_200 / 9.0 * 1e6)


def test_monthly_cost_hours_and_precision_overrides() -> None:
    quoted = _plan("kimi-k3", "--monthly-cost", "50000")
    assert quoted["break_even"]["output_tokens_per_month"] == pytest.approx(50_000 / OUT * 1e6)
    part_time = _plan("kimi-k3", "--hours-per-day", "4")
    yours = part_time["rental"][-1]
    assert (yours["gpus"], yours["hours_per_month"], yours["usd_per_month"]) == (8, 120, 8 * 120 * 2.5)
    assert part_time["break_even"]["monthly_cost_usd"] == 2400
    fp8 = _plan("kimi-k3", "--precision", "fp8", "--params", "3T", "--active", "50B")
    assert fp8["model"]["weights_bytes"] == 3 * 10**12
    assert fp8["model"]["active_params"] == 50 * 10**9
    assert _count(fp8, "B300") == math.ceil(3e12 / 288e9)


# The deployment guides' own tables, as published: a month is 720 hours at $2.50 per
# GPU-hour, and ~1.4 TB of weights ÷ the card's marketed size in decimal GB, rounded up.
GUIDES_RENTAL_USD = {"1 GPU always on": 1_800, "8 GPUs 4 h/day": 2_400, "8 GPUs always on": 14_400, "32 GPUs always on": 57_600}
GUIDES_GPUS_FOR_WEIGHTS = {"H100": 18, "H200": 10, "B200": 8, "GB300": 5}
GUIDES_CONFIGS_GB = {"8×B300": 2_304, "8×MI355X": 2_304, "16×H200": 2_256, "16×B200": 2_880, "32×H100": 2_560}


def test_the_guides_tables_come_out_by_default() -> None:
    payload = _plan("kimi-k3")
    assert {row["label"]: row["usd_per_month"] for row in payload["rental"]} == GUIDES_RENTAL_USD
    assert {gpu: _count(payload, gpu) for gpu in GUIDES_GPUS_FOR_WEIGHTS} == GUIDES_GPUS_FOR_WEIGHTS
    assert {c["label"]: c["memory_bytes"] / 1e9 for c in payload["published_configs"]} == GUIDES_CONFIGS_GB
    assert (payload["rate_usd_per_gpu_hour"], payload["rate_range_usd_per_gpu_hour"]) == (2.5, [2.0, 5.0])
    # An 8-GPU node always on ($14,400) ≈ 960 M output tokens a month at $15.00/M.
    even = payload["break_even"]
    assert even["monthly_cost_usd"] == 14_400 and round(even["output_tokens_per_month"] / 1e6) == 960
    rack = payload["racks"][0]
    assert (rack["name"], rack["count"], rack["memory_bytes"], rack["clears_floor"]) == ("GB300 NVL72", 72, 72 * 288 * 10**9, True)
    human = run_cli("plan", "kimi-k3").stdout
    assert "4. Rental at $2.50 per GPU-hour (on demand $2–5 in 2026" in human
    assert (
        "Counted as the guides count: bytes ÷ the card's marketed memory (decimal GB), rounded up, for the weights alone and for the files as shipped"
        in human.replace("\n", "")
    )


def test_a_quoted_monthly_cost_with_a_mix_gives_the_blended_break_even() -> None:
    even = _plan("kimi-k3", "--monthly-cost", "43000", "--input-share", "0.8", "--cache-hit", "0.9")["break_even"]
    blended = 0.8 * (0.9 * HIT + 0.1 * MISS) + 0.2 * OUT  # $3.456 per million
    assert even["blended_usd_per_million"] == pytest.approx(blended)
    assert even["blended_tokens_per_month"] == pytest.approx(43_000 / blended * 1e6)  # ≈ 12.4 B


def test_catalog_model_with_published_attention() -> None:
    payload = _plan("llama-3.3-70b")
    assert payload["model"]["precision"] == "bf16"
    assert payload["model"]["weights_bytes"] == 70_553_706_496 * 2
    # 80 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes per token.
    assert payload["kv_per_user"][1] == {"ctx": 32768, "bytes": 80 * 8 * 128 * 2 * 2 * 32768}
    assert payload["serving_floor_published"] is False
    assert payload["serving_floor_bytes"] == 70_553_706_496 * 2 + 80 * 8 * 128 * 2 * 2 * 32768 + 2 * _GIB
    assert payload["break_even"] is None  # no hosted price for it in recipes


def test_plan_a_gguf_header(tmp_path: Path, gemma: Path) -> None:
    metadata = {
        "{arch}.block_count": 2,
        "{arch}.embedding_length": 64,
        "{arch}.attention.head_count": 8,
        "{arch}.attention.head_count_kv": 4,
        "{arch}.context_length": 4096,
    }
    path = write_small_gguf(tmp_path / "gqa.gguf", "llama", metadata, {"blk.0.attn_q.weight": np.ones((64, 64), dtype=np.float16)})
    payload = _plan(str(path))
    assert payload["model"]["params"] == 64 * 64
    assert payload["model"]["precision"] == "bf16"  # an F16 file
    # 2 layers × 4 KV heads × (8 + 8) head dims × 2 bytes per token.
    assert payload["kv_per_user"][0] == {"ctx": 8192, "bytes": 2 * 4 * 16 * 2 * 8192}
    gemma_plan = _plan(str(gemma))
    assert gemma_plan["model"]["params"] == 268_098_176
    assert "sliding_window" in gemma_plan["kv_unknown_reason"]


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    sizes = {"BF16": 2, "F32": 4}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n_bytes = int(np.prod(shape)) * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_plan_a_safetensors_repo_on_the_hub(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _safetensors(repo / "model.safetensors", {"embed.weight": ("BF16", [1000, 64]), "layers.0.q.weight": ("BF16", [64, 64]), "norm": ("F32", [64])})
    config = {"num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_size": 2048, "max_position_embeddings": 32768}
    (repo / "config.json").write_text(json.dumps(config))
    with fake_hub([HubRepo("acme/dense-1b", repo)]) as (endpoint, _):
        payload = _plan("hf://acme/dense-1b", env={"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home")})
    assert payload["model"]["params"] == 1000 * 64 + 64 * 64 + 64
    assert payload["model"]["precision"] == "bf16"
    # head_dim = 2048 / 16 = 128: 2 × 24 × 4 × 128 × 2 bytes per token.
    assert payload["kv_per_user"][0] == {"ctx": 8192, "bytes": 2 * 24 * 4 * 128 * 2 * 8192}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-model"], "error: no-such-model: not a model in the catalog, nor a GGUF path"),
        (["kimi-k3", "--input-share", "0.6", "--output-share", "0.6"], "error: --input-share and --output-share must add up to 1"),
        (["kimi-k3", "--params", "lots"], "error: cannot read 'lots' as a count"),
        (["kimi-k3", "--active", "3T"], "error: active parameters (3,000,000,000,000) exceed total (2,779,900,000,000)"),
        (["kimi-k3", "--bandwidth", "fast"], "error: cannot read 'fast' as a bandwidth"),
        (["kimi-k3", "--gpu", "Voodoo 5"], "error: --gpu 'Voodoo 5' is neither a size nor a GPU we know"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = run_cli("plan", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == message
    assert result.stderr.splitlines()[1].startswith("hint: ")


def test_human_report_answers_first_and_shows_sources() -> None:
    result = run_cli("plan", "kimi-k3", "--sources")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Kimi K3 needs ≥ 1.39 TB for weights alone")
    text = result.stdout
    for section in (
        "1. Weights by precision",
        "2. GPUs just to hold",
        "3. KV cache per concurrent user",
        "4. Rental",
        "5. Break-even",
        "6. Download",
        "7. Tier-1 launch",
    ):
        assert section in text
    assert "Kimi K3 facts: Moonshot AI model card" in text and "(2026-08)" in text
    assert "API prices: Moonshot AI pricing page, platform.kimi.ai/docs/pricing/chat-k3" in text and "(2026-08)" in text


def test_pulling_a_model_that_never_fits_points_at_plan() -> None:
    result = run_cli("pull", "kimi-k3")
    assert (result.returncode, result.stderr.splitlines()) == (
        2,
        [
            "error: 'kimi-k3' never fits one machine: the catalog has no GGUF of it to pull",
            "hint: see `tierlocal plan kimi-k3` for the cluster that serves it (tier 1) and the hosted API (tier 3)",
        ],
    )


def test_a_gpus_marketed_memory_reads_in_decimal_gb_in_the_sources_too() -> None:
    """B300 read "288.0 GiB" in check, "288.00 GB" in plan and "288 GiB" in --sources: one unit,
    decimal as marketed, in the table and in the sources list alike."""
    said = run_cli("plan", "kimi-k3", "--sources").stdout
    table, _, sources = said.partition("Sources:")
    assert "│ B300           │ 288 GB │" in table
    assert "B300: 288 GB (marketed)" in sources and "H100: 80 GB (marketed)" in sources
    assert "288 GiB" not in said and "288.0 GiB" not in said and "288.00 GB" not in said


def test_kimi_k3s_cluster_is_priced_for_its_users_at_once() -> None:
    """Issue 48 item 6: 8 × B300 (the cheapest cluster over the serving floor) with K3's 896
    experts, 16 per token. One user is vLLM's published 111 tok/s at TP8; many users read the
    experts their tokens route to, 1 − (1 − 16/896)^B of them, at 8 × 8 TB/s; an output token
    costs the cluster's hour over the tokens that hour gives."""
    throughput = _plan("kimi-k3")["throughput"]
    assert (throughput["gpu"], throughput["gpus"], throughput["anchor"]["tokens_per_s"]) == ("B300", 8, 111.0)
    rows = {row["users"]: row for row in throughput["users"]}
    assert rows[1] == {
        "users": 1,
        "per_user_decode_tokens_per_s": 111.0,
        "aggregate_decode_tokens_per_s": 111.0,
        "usd_per_million_output_tokens": round(8 * 2.50 / (111 * 3600) * 1e6, 4),
        "basis": "published",
    }
    # 128 users: the shared weights (104B active − 16 × 3.04B experts) and the routed share of
    # 896 experts of (2,779.9B − 104B) ÷ 880 each, at 0.5 bytes a weight, plus 128 caches 4k deep.
    per_expert = (K3_PARAMS - 104e9) / 880
    shared = 104e9 - 16 * per_expert
    experts_read = 896 * per_expert * (1 - (1 - 16 / 896) ** 128)
    kv = _plan("kimi-k3")["kv_bytes_per_token"] * 4096 + _plan("kimi-k3")["fixed_state_bytes_per_user"]
    step_s = ((shared + experts_read) * K3_WEIGHTS_MXFP4 / K3_PARAMS + 128 * kv) / (8 * 8000e9)
    assert rows[128]["aggregate_decode_tokens_per_s"] == pytest.approx(128 / step_s, rel=1e-3)
    assert rows[128]["basis"] == "derived" and rows[8]["per_user_decode_tokens_per_s"] == 111.0  # below the floor, the published step holds
    human = " ".join(run_cli("plan", "kimi-k3").stdout.split())
    assert (
        "Users at once on 8 × B300" in human
        and "The output-only break-even is 370 tok/s while the cluster runs: 8 users decoding at once make it." in human
    )

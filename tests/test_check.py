"""``tierlocal check``: the catalog recommendation on this machine (offline) and for other
machines, checked against MISSION.md's arithmetic computed here from the published facts."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.cli import run_cli

_GIB = 1024**3
_OVERHEAD = 2 * _GIB  # MISSION.md: ~2 GB runtime overhead
_MARGIN = 1024 * 1024**2  # llama.cpp's --fit-target default

# Published attention shapes: (layers, kv_heads, head_dim) → classic f16 KV bytes per token.
_KV_SHAPES = {
    "llama-3.1-8b": (32, 8, 128),
    "qwen3-8b": (36, 8, 128),
    "qwen3-14b": (40, 8, 128),
    "qwen3-30b-a3b": (48, 4, 128),
    "qwen3-32b": (64, 8, 128),
    "llama-3.3-70b": (80, 8, 128),
}


def _check(*args: str) -> dict[str, object]:
    result = run_cli("check", *args, "--json", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _assert_arithmetic(fit: dict[str, object], budget_bytes: int) -> None:
    layers, kv_heads, head_dim = _KV_SHAPES[str(fit["model"])]
    kv_per_token = 2 * layers * kv_heads * head_dim * 2
    assert fit["kv_bytes"] == kv_per_token * int(fit["ctx"]) * int(fit["parallel"])  # type: ignore[arg-type]
    expected_weights = round(int(fit["params"]) * float(fit["bits_per_weight"]) / 8)  # type: ignore[arg-type]
    assert abs(int(fit["weights_bytes"]) - expected_weights) <= 1  # type: ignore[arg-type]
    assert fit["total_needed_bytes"] == int(fit["weights_bytes"]) + int(fit["kv_bytes"]) + _OVERHEAD  # type: ignore[arg-type]
    assert fit["fits"] is (int(fit["total_needed_bytes"]) + _MARGIN <= budget_bytes)  # type: ignore[arg-type]


def test_check_on_this_machine_offline() -> None:
    payload = _check()
    budget = payload["budget"]
    assert budget["backend"] == "cpu"  # type: ignore[index]
    assert budget["bandwidth_assumed"] is True  # type: ignore[index]
    assert budget["memory_bytes"] == payload["hardware"]["ram_available_bytes"]  # type: ignore[index]
    best = payload["recommendation"]
    assert best is not None and best["fits"] is True  # type: ignore[index]
    _assert_arithmetic(best, budget["memory_bytes"])  # type: ignore[arg-type, index]
    assert best["est_decode_tokens_per_s"] >= payload["min_tokens_per_s"]  # type: ignore[index, operator]
    roles = [alternative["role"] for alternative in payload["alternatives"]]  # type: ignore[union-attr]
    assert set(roles) <= {"smaller", "larger"}
    for alternative in payload["alternatives"]:  # type: ignore[union-attr]
        if alternative["model"] in _KV_SHAPES:
            _assert_arithmetic(alternative, budget["memory_bytes"])  # type: ignore[index]


def test_kimi_k3_never_fits() -> None:
    payload = _check("--gpu", "8xB300")
    (k3,) = payload["frontier"]  # type: ignore[misc]
    assert k3["model"] == "kimi-k3"
    assert k3["fits"] is False
    assert k3["params"] == 2_779_900_000_000
    # 2.7799T parameters × 0.5 byte (MXFP4, as the published tables count it) against the
    # largest single accelerator we know (B300, 288 GiB): ≥ 5 just to hold the weights.
    assert k3["floor_bytes"] == 2_779_900_000_000 // 2
    assert k3["gpus_for_floor"] == math.ceil(1.38995e12 / (288 * _GIB)) == 5
    human = run_cli("check", "--gpu", "80GiB").stdout
    assert "kimi-k3: not tier 2" in human


@pytest.mark.parametrize(
    ("gpu", "low", "high"),
    [
        # MISSION.md: 16 GB → 7B with room for long context; 24 GB → 14B; 48 GB → 32B; 80 GB → 70B at 4-bit.
        # The arithmetic may show better (a bigger model at 8k context); never worse.
        ("16GiB", 7e9, 15e9),
        ("24GiB", 14e9, 33e9),
        ("48GiB", 32e9, 71e9),
        ("80GiB", 70e9, 71e9),
    ],
)
def test_rule_of_thumb_cards(gpu: str, low: float, high: float) -> None:
    payload = _check("--gpu", gpu)
    best = payload["recommendation"]
    assert best is not None
    assert low <= best["params"] <= high  # type: ignore[index, operator]
    assert best["bits_per_weight"] >= 4.5  # type: ignore[index, operator]
    _assert_arithmetic(best, int(gpu.removesuffix("GiB")) * _GIB)  # type: ignore[arg-type]


def test_long_context_and_slots_cost_kv() -> None:
    short = _check("--gpu", "RTX 4090", "--ctx", "4096")["recommendation"]
    long = _check("--gpu", "RTX 4090", "--ctx", "32768", "--parallel", "4")["recommendation"]
    assert long["kv_bytes"] > short["kv_bytes"]  # type: ignore[index]
    assert long["params"] <= short["params"]  # type: ignore[index]
    _assert_arithmetic(long, 24 * _GIB)  # type: ignore[arg-type]
    assert long["est_decode_tokens_per_s"] > 50  # type: ignore[index, operator]


def test_nothing_fits_says_what_to_do() -> None:
    result = run_cli("check", "--gpu", "512MiB")
    assert result.returncode == 0
    assert "Verdict: no catalog model fits" in result.stdout
    assert "lower --ctx" in result.stdout


def test_bad_options_are_one_line_errors() -> None:
    result = run_cli("check", "--ctx", "12")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: --ctx '12' is not a context size", "hint: give tokens (256 to 16777216) or 'max'"]

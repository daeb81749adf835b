"""`check kimi-k3`'s single-machine option: the published K3 GGUFs with llama.cpp keeping the
routed experts in RAM. Expected values are worked here from the primary figures — the
publisher's file sizes and quality, config.json's expert shapes — not read from tierlocal."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli

#: unsloth/Kimi-K3-GGUF (guide and release notes, 2026-07): file GB, mean KLD, top-1 agreement, publisher's RAM + VRAM GB.
PUBLISHED = {
    "UD-IQ1_S": (594.0, 0.5645, 0.78875, 610),
    "UD-IQ1_M": (648.9, 0.4789, 0.81219, 665),
    "UD-IQ2_XXS": (711.1, 0.3784, 0.84127, 726),
    "UD-Q2_K_XL": (861.3, 0.1779, 0.90390, 880),
    "UD-Q4_K_XL": (1510.0, None, None, None),
    "UD-Q8_K_XL": (1560.0, None, None, 1600),
}
# config.json: 92 MoE blocks × 896 routed experts × (gate, up, down) of 3072 × 3584; 2.7799T in all.
ROUTED_PARAMS = 92 * 896 * 3 * 3072 * 3584
OTHER_BYTES = round((2_779_900_000_000 - ROUTED_PARAMS) * 8.5 / 8)
# 24 MLA layers × (512 + 64) f16 per token; 69 KDA layers' state (test_plan.py works it out).
KV_8K = 8192 * 24 * (512 + 64) * 2 + 464_633_856


def _single_machine(*args: str) -> dict:  # type: ignore[type-arg]
    result = run_cli("check", *args, "--json")
    assert result.returncode == 0, result.stderr
    (k3,) = [entry for entry in json.loads(result.stdout)["frontier"] if entry["model"] == "kimi-k3"]
    return k3["single_machine"]  # type: ignore[no-any-return]


def test_each_published_quant_with_its_split_quality_and_speed_bound() -> None:
    plan = _single_machine("--gpu", "none", "--ram", "1TiB", "--ram-bandwidth", "400GB/s")
    assert [q["quant"] for q in plan["quants"]] == list(PUBLISHED)
    for quant in plan["quants"]:
        file_gb, kld, top1, _memory = PUBLISHED[quant["quant"]]
        assert quant["file_bytes"] == round(file_gb * 1e9)
        assert (quant["mean_kld"], quant["top1_agreement"]) == (kld, top1)
        routed = quant["file_bytes"] - OTHER_BYTES
        assert (quant["ram_bytes"], quant["gpu_bytes"]) == (routed, OTHER_BYTES + KV_8K)
        # Without a GPU every token reads its 16 of 896 experts and all the rest from RAM.
        assert quant["decode_bound_tokens_per_s"] == pytest.approx(400e9 / (routed * 16 / 896 + OTHER_BYTES), abs=0.01)
        assert quant["fits_here"] is (quant["total_bytes"] <= 1024**4)
    assert [q["fits_here"] for q in plan["quants"]] == [True, True, True, True, False, False]
    assert "b10448" in plan["engine"] and "exps=CPU" in plan["placement"]
    assert {row["tokens_per_s"] for row in plan["measured"]} == {3.13, 3.0}


def test_the_estimate_agrees_with_what_the_publisher_says_each_needs() -> None:
    """RAM + GPU from the architecture against the publisher's "RAM + VRAM" per tier: within 5%."""
    for quant in _single_machine()["quants"]:
        memory = PUBLISHED[quant["quant"]][3]
        if memory is not None:
            assert quant["total_bytes"] == pytest.approx(memory * 1e9, rel=0.05), quant["quant"]


def test_a_gpu_holds_the_rest_and_speeds_the_bound() -> None:
    """512 GiB of RAM and an H100 (80 GB holds the ~61 GB outside the experts): the experts'
    share from RAM, the rest at the GPU's bandwidth."""
    plan = _single_machine("--gpu", "H100", "--ram", "512GiB", "--ram-bandwidth", "400GB/s")
    iq1 = plan["quants"][0]
    assert iq1["fits_here"] and iq1["gpu_bytes"] < 80e9
    routed = iq1["file_bytes"] - OTHER_BYTES
    assert iq1["decode_bound_tokens_per_s"] > 400e9 / (routed * 16 / 896 + OTHER_BYTES)  # faster than RAM alone
    assert iq1["ram_bytes"] < 512 * 1024**3 < plan["quants"][1]["ram_bytes"]  # UD-IQ1_M's 588 GB of experts do not fit
    assert [q["fits_here"] for q in plan["quants"]] == [True, False, False, False, False, False]


def test_the_report_says_not_a_gpu_not_fast_and_this_much_worse() -> None:
    result = run_cli("check", "--gpu", "none", "--ram", "1TiB", "--ram-bandwidth", "400GB/s")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "On one machine, not a GPU: llama.cpp b10448 or later" in text
    assert "UD-IQ1_S" in text and "78.9%" in text and "0.565" in text
    assert "measured: 3.13 tok/s — UD-Q2_K_XL, 768 GB RAM" in text and "llama.cpp PR #26185, 2026-07-29" in text
    assert "unsloth/Kimi-K3-GGUF guide" in text

"""A CPU not calibrated yet is priced from published llama-bench runs of CPUs like it
(recipes/cpu_speed.toml), by its vendor, instruction set and core count — not by its memory
bandwidth alone, which put a 26B model's decode at a "≤ 14.7 tok/s" ceiling on a 2-core VPS
that ran it at 5.8 with a 24 s first token (issue 47)."""

from __future__ import annotations

import json
import statistics
import tomllib

import pytest

from tests.support.cli import REPO_ROOT, run_cli
from tierlocal.catalog import load_cpu_rows
from tierlocal.fit.cpu_prior import cpu_isa_class, cpu_prior, cpu_rates

RECIPE = tomllib.loads((REPO_ROOT / "recipes" / "cpu_speed.toml").read_text())


def _per_thread(vendor: str, isa: str) -> tuple[float, float]:
    """Decode bytes/s and prefill FLOP/s per thread, the medians worked out here from the file's
    numbers: decode of runs of ≤ 4 threads under 70% of their bandwidth (bytes: the file for a
    tied embedding, else its non-embedding share), prefill of every run (2 FLOPs per
    non-embedding weight)."""
    shapes = {shape["name"]: shape for shape in RECIPE["shape"]}
    decode, prefill = [], []
    for row in RECIPE["row"]:
        if (row["vendor"], row["isa"], row["use"]) != (vendor, isa, "fit"):
            continue
        shape = shapes[row["shape"]]
        size = row["size_gb"] * 1e9
        read = (
            shape["read_bytes_per_token"] * size / (shape["read_file_gib"] * 2**30)
            if "read_bytes_per_token" in shape
            else size * (1 - shape["embedding_params"] / shape["params"])
        )
        if row["threads"] <= 4 and row["tg128"] * read <= 0.7 * row["bandwidth_gb_s"] * 1e9:
            decode.append(row["tg128"] * read / row["threads"])
        prefill.append(row["pp512"] * 2 * (shape["active_params"] - shape["embedding_params"]) / row["threads"])
    return statistics.median(decode), statistics.median(prefill)


@pytest.mark.parametrize(("vendor", "isa"), [("intel", "avx512"), ("amd", "avx512"), ("amd", "avx2")])
def test_the_rates_are_the_medians_of_the_published_runs(vendor: str, isa: str) -> None:
    rates = cpu_rates(load_cpu_rows(), vendor, isa)
    assert rates is not None and rates.name == f"{vendor}-{isa}"
    decode, prefill = _per_thread(vendor, isa)
    assert rates.decode_bytes_per_s_per_thread == pytest.approx(decode, rel=1e-3)
    assert rates.prefill_flops_per_s_per_thread == pytest.approx(prefill, rel=1e-3)
    assert 0.7 < rates.saturation_share < 1.1


def test_decode_grows_with_threads_until_the_bus_saturates_and_arm_keeps_the_bound() -> None:
    rates = cpu_rates(load_cpu_rows(), "amd", "avx512")
    assert rates is not None
    two, many = cpu_prior(rates, 2, 40e9), cpu_prior(rates, 16, 40e9)
    assert two.decode_bytes_per_s["*"] == pytest.approx(2 * rates.decode_bytes_per_s_per_thread)
    assert many.decode_bytes_per_s["*"] == pytest.approx(rates.saturation_share * 40e9)  # capped by the bandwidth
    assert many.prefill_flops_per_s["*"] == pytest.approx(8 * two.prefill_flops_per_s["*"])  # compute: every thread counts
    assert two.source == "derived" and "not calibrated: priced from 11 published llama-bench runs of amd-avx512 CPUs" in two.note
    assert cpu_isa_class("aarch64", ("asimddp", "i8mm")) is None  # the published Arm runs used a generic build
    assert cpu_rates(load_cpu_rows(), "intel", "avx2") is not None  # an Intel AVX2 CPU borrows the AVX2 rows


def test_check_on_this_cpu_before_calibration_prices_decode_prefill_and_first_token(gemma: object) -> None:
    """On this machine (no calibration in this test's home), check FILE gives an estimate from
    the published runs — decode, prefill, first token — and the bandwidth bound only beside it."""
    done = run_cli("check", str(gemma), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    estimate = result["speed"]["estimate"]
    assert result["speed_basis"] == "derived" and estimate["sources"]["host"].startswith("derived: not calibrated: priced from")
    assert estimate["prefill_tokens_per_s"] > 0 and set(estimate["first_token_s"]) == {"128", "512", "2048"}
    assert result["est_decode_tokens_per_s"] < result["bound_decode_tokens_per_s"]
    described = json.loads(run_cli("check", str(gemma), "--ram", "16GiB", "--json").stdout)  # another machine's CPU: not known
    assert described["speed_basis"] == "bound"

"""The speed model without an engine: what each run asks of each device (checked against the
tensor table the gguf package reads), the calibration fit recovering figures it did not
produce, the damaged-cache guard, and the published GPU rows' arithmetic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFReader

from tests.support.sparse_models import LFM2_1_2B, QWEN3_30B_A3B, write_sparse_gguf
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.calibration import TimedRun, fit_device_speed
from tierlocal.fit.device_speed import DeviceSpeed
from tierlocal.fit.estimate import Machine, RunRequest, estimate_run
from tierlocal.fit.gpu_speed import (
    CardFit,
    CardInfo,
    ModelShape,
    PublishedRow,
    card_device_speed,
    card_fit,
    fit_cards,
    half_prefill_factor,
    overhead_scale,
)
from tierlocal.fit.model import model_spec
from tierlocal.fit.speed import estimate_speed, run_features
from tierlocal.gguf.synthetic import ProbeShape, write_probe_gguf
from tierlocal.gpu_figures import gpu_speed_for
from tierlocal.measure.calibrate import PROBE_TYPES, PROBES

GIB = 2**30


def _machine(gpu: bool = False) -> Machine:
    if gpu:
        return Machine("RTX 4090", "cuda", 24 * GIB, 24 * GIB, 1_008_000_000_000, 64 * GIB, 60 * GIB, 40_000_000_000, 0, GIB)
    return Machine(None, None, 0, 0, None, 64 * GIB, 60 * GIB, 40_000_000_000, 0, 0)


def test_decode_reads_every_multiplied_matrix_once_and_a_tied_output_reads_the_embedding(tmp_path: Path) -> None:
    """LFM2 (tied output, Q4_K): the bytes decode streams per token are the blocks' matrices
    plus the embedding matrix (the output projection), as the file's own tensor table sums them."""
    path = write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B)
    table = GGUFReader(path).tensors
    matrices = sum(int(t.n_bytes) for t in table if t.name.startswith("blk.") and len(t.shape) >= 2 and min(t.shape[:2]) > 1)
    embedding = next(int(t.n_bytes) for t in table if t.name == "token_embd.weight")
    features = run_features(model_spec(read_headers(str(path))))
    streamed = sum(amount for name, amount in features.decode["host"].items() if name.startswith("bytes:"))
    assert streamed == matrices + embedding
    assert features.decode["gpu"] == {}
    assert features.decode["host"]["layer"] == LFM2_1_2B.n_layer
    assert features.decode["host"]["vocab"] == LFM2_1_2B.n_vocab


def test_experts_count_their_used_share_and_the_output_layer_runs_once_per_prompt(tmp_path: Path) -> None:
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "moe.gguf", QWEN3_30B_A3B))))
    _, n_used, n_ff_exp = QWEN3_30B_A3B.experts  # type: ignore[misc]
    features = run_features(spec, prompt=512)
    expert_flops = features.prefill["host"]["xflops:Q4_K"]
    assert expert_flops == pytest.approx(QWEN3_30B_A3B.n_layer * 3 * 2 * QWEN3_30B_A3B.n_embd * n_ff_exp * n_used)
    output = QWEN3_30B_A3B.n_embd * QWEN3_30B_A3B.n_vocab * 2
    assert features.once["host"] == {"flops:Q6_K": pytest.approx(output)}


def test_offloaded_layers_are_priced_on_the_gpu_and_sampling_stays_on_the_host(tmp_path: Path) -> None:
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B))))
    features = run_features(spec, ngl=4)  # the output layer and the last 3 blocks
    assert features.decode["gpu"]["layer"] == 3
    assert features.decode["host"]["layer"] == LFM2_1_2B.n_layer - 3
    assert "vocab" in features.decode["host"] and "vocab" not in features.decode["gpu"]


def _known_speed() -> DeviceSpeed:
    """Figures chosen by hand, as a CPU might have them."""
    types = ("Q2_K", "Q3_K", "Q4_0", "Q4_K", "IQ4_NL", "Q5_0", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16")
    return DeviceSpeed(
        "cpu",
        "measured",
        "by hand",
        decode_bytes_per_s={name: 12e9 + 1.5e9 * i for i, name in enumerate(types)},
        prefill_flops_per_s={**{name: 90e9 + 10e9 * i for i, name in enumerate(types)}, "x:Q4_K": 70e9},
        attention_flops_per_s=40e9,
        token_overhead_s=4e-4,
        layer_overhead_s=3e-5,
        vocab_overhead_s=5e-9,
        decode_row_s={name: 1e-9 + 2e-10 * i for i, name in enumerate(types)},
        prefill_token_overhead_s=2e-5,
        prefill_layer_overhead_s=1e-6,
        prefill_element_s=2e-10,
    )


def test_the_calibration_fit_recovers_the_figures_that_timed_the_probes(tmp_path: Path) -> None:
    """Time every probe of `hw --calibrate` with hand-chosen figures, fit, get them back."""
    truth = _known_speed()
    runs = []
    for probe in PROBES:
        spec = model_spec(read_headers(str(write_probe_gguf(tmp_path / f"{probe.shape.name}.gguf", probe.shape))))
        estimate = estimate_run(spec, RunRequest(ctx=4096, parallel=1), _machine())
        depth = probe.prompt + 16
        predicted = estimate_speed(spec, estimate, truth, depth=depth, prefill_prompt=probe.prompt, prompts=())
        features = run_features(spec, depth=depth, prompt=probe.prompt)
        assert predicted.decode_tokens_per_s and predicted.prefill_tokens_per_s
        runs.append(
            TimedRun(
                probe.shape.name,
                features.decode["host"],
                features.prefill["host"],
                features.once["host"],
                probe.prompt,
                1 / predicted.decode_tokens_per_s,
                1 / predicted.prefill_tokens_per_s,
                decode_fitted=probe.decode_fitted,
            )
        )
    fitted = fit_device_speed(runs)
    # without a probe the decode fit prices, the fit refuses (calibrate_cpu times them again, then says so)
    with pytest.raises(ValueError, match="no probe that the decode fit prices"):
        fit_device_speed([run for run in runs if not run.decode_fitted])
    # a probe left out of the decode fit does not move it, however slow it read
    slowed = [replace(run, decode_s=run.decode_s * 3) if not run.decode_fitted else run for run in runs]
    assert fit_device_speed(slowed).decode_row_s == fitted.decode_row_s and fitted.decode_row_s
    for name, rate in truth.decode_bytes_per_s.items():
        assert fitted.decode_bytes_per_s[name] == pytest.approx(rate, rel=1e-6), name
    for name, cost in truth.decode_row_s.items():
        assert fitted.decode_row_s[name] == pytest.approx(cost, rel=1e-5), name
    for name, rate in truth.prefill_flops_per_s.items():
        assert fitted.prefill_flops_per_s[name] == pytest.approx(rate, rel=1e-6), name
    fields = (
        "attention_flops_per_s",
        "token_overhead_s",
        "layer_overhead_s",
        "vocab_overhead_s",
        "prefill_layer_overhead_s",
        "prefill_element_s",
    )
    for field in fields:
        assert getattr(fitted, field) == pytest.approx(getattr(truth, field), rel=1e-5), field


def test_every_probe_the_decode_fit_prices_streams_its_weights_from_ram(tmp_path: Path) -> None:
    """Weights a cache holds read up to 3x faster per byte (a 2-core VPS's share of a 480 MiB
    L3): a probe the decode fit prices by its matrices holds more than a last-level cache."""
    fitted = [probe for probe in PROBES if probe.decode_fitted]
    assert len(fitted) >= 2 * len(PROBE_TYPES) + 3 and {probe.shape.name for probe in PROBES} - {probe.shape.name for probe in fitted} == {
        "narrow-4",
        "narrow-32-long",
    }
    for probe in PROBES:
        weights = sum(t.n_bytes for t in GGUFReader(write_probe_gguf(tmp_path / "probe.gguf", probe.shape)).tensors if t.name != "token_embd.weight")
        assert (weights >= 160 * 2**20) == probe.decode_fitted, (probe.shape.name, weights)


def test_a_type_without_a_probe_is_priced_at_the_nearest_measured_type_and_named(tmp_path: Path) -> None:
    shape = ProbeShape("q5_1", 2, 256, 768, 2, 2, 128, 4096, "Q5_1")
    spec = model_spec(read_headers(str(write_probe_gguf(tmp_path / "q5_1.gguf", shape))))
    estimate = estimate_run(spec, RunRequest(ctx=4096, parallel=1), _machine())
    speed = estimate_speed(spec, estimate, _known_speed())
    assert speed.uncalibrated_types == ("Q5_1",)
    assert _known_speed().rate(_known_speed().decode_bytes_per_s, "Q5_1") == (_known_speed().decode_bytes_per_s["Q5_0"], False)


def test_a_damaged_calibration_is_refused_not_used() -> None:
    good = _known_speed().to_json()
    assert DeviceSpeed.from_json(good).decode_bytes_per_s["Q4_K"] == pytest.approx(_known_speed().decode_bytes_per_s["Q4_K"], rel=1e-9)
    for damage in (
        {"decode_bytes_per_s": {"Q4_K": -1}},
        {"decode_bytes_per_s": "fast"},
        {"layer_overhead_s": float("nan")},
        {"attention_flops_per_s": 0},
    ):
        with pytest.raises(ValueError):
            DeviceSpeed.from_json({**good, **damage})


def test_the_gpu_fit_recovers_the_figures_that_made_its_rows() -> None:
    """Rows made by hand from a known card (efficiency 0.8, 3 ms a token, 60 TFLOP/s of prefill)
    for two model sizes: the fit gives those figures back, and a card of the same architecture
    without rows gets them as derived figures on its own bandwidth."""
    small = ModelShape("small", 8_000_000_000, 8_000_000_000, 500_000_000)
    large = ModelShape("large", 70_000_000_000, 70_000_000_000, 1_000_000_000)
    cards = {"A": CardInfo("A", 1_000_000_000_000, None, "Gen1", "cuda"), "B": CardInfo("B", 500_000_000_000, None, "Gen1", "cuda")}

    def row(shape: ModelShape, size: int, test: str, use: str = "fit", kind: str = "Q4_K - Medium") -> PublishedRow:
        probe = PublishedRow("A", shape, f"{shape.name} {kind}", size, test, 1.0, use, "by hand", "2026-12-02")
        rate = 0.8e12 * (0.9 if probe.half else 1.0)  # half-precision weights stream 0.9× as fast
        seconds = probe.read_bytes / rate + 0.003 if test.startswith("tg") else probe.flops / 60e12
        return replace(probe, tokens_per_s=1 / seconds)

    rows = [
        row(small, 5_000_000_000, "tg128"),
        row(large, 40_000_000_000, "tg128"),
        row(small, 5_000_000_000, "pp512"),
        row(large, 40_000_000_000, "tg512", "test"),
    ]
    fits, kappa = fit_cards(rows, cards)
    own = fits["A"]
    assert (own.basis, own.efficiency, own.token_overhead_s) == ("published", pytest.approx(0.8), pytest.approx(0.003))
    assert own.prefill_flops_per_s == pytest.approx(60e12) and kappa == 1.0  # no half-precision row: no factor
    _, kappa = fit_cards([*rows, row(small, 16_000_000_000, "tg128", kind="F16")], cards)
    assert kappa == pytest.approx(1 / 0.9, abs=0.01)  # read as 1.11× the bytes
    derived = card_fit("B", fits, cards)
    assert derived is not None and derived.basis == "derived" and derived.efficiency == pytest.approx(0.8)
    assert "Gen1" in derived.note
    speed = card_device_speed(derived, cards["B"], kappa)
    assert speed.decode_bytes_per_s["*"] == pytest.approx(0.8 * 500e9) and speed.token_overhead_s == pytest.approx(0.003)
    assert card_fit("C", fits, cards) is None  # not in recipes/gpus.toml: nothing invented


def test_a_backends_overhead_paid_per_layer_is_fitted_at_32_layers_and_split_by_the_given_share() -> None:
    """Rows made by hand on one card (efficiency 0.8, an overhead of 3 ms at 32 layers, 0.7 of it
    per layer) for a 32-layer and a 64-layer model: fitted with that share, the card's figures come
    back, 0.9 ms a token and 2.1 / 32 ms a layer; fitted as all per token, they do not."""
    shallow = ModelShape("shallow", 8_000_000_000, 8_000_000_000, 500_000_000, n_layer=32)
    deep = ModelShape("deep", 14_000_000_000, 14_000_000_000, 500_000_000, n_layer=64)
    cards = {"A": CardInfo("A", 1_000_000_000_000, None, "Gen1", "cuda")}

    def row(shape: ModelShape, size: int) -> PublishedRow:
        probe = PublishedRow("A", shape, f"{shape.name} Q4_K - Medium", size, "tg128", 1.0, "fit", "by hand", "2026-12-07")
        overhead = 0.003 * (0.3 + 0.7 * shape.n_layer / 32)  # 3 ms at 32 layers, 5.1 ms at 64
        return replace(probe, tokens_per_s=1 / (probe.read_bytes / 0.8e12 + overhead))

    rows = [row(shallow, 5_000_000_000), row(shallow, 9_000_000_000), row(deep, 8_000_000_000), row(deep, 15_000_000_000)]
    assert overhead_scale(deep, 0.7) == pytest.approx(1.7) and overhead_scale(shallow, 0.7) == 1.0
    fit = fit_cards(rows, cards, 0.7)[0]["A"]
    assert (fit.efficiency, fit.token_overhead_s, fit.layer_overhead_s) == (pytest.approx(0.8), pytest.approx(0.0009), pytest.approx(0.0021 / 32))
    speed = card_device_speed(fit, cards["A"], 1.0)
    assert speed.token_overhead_s + 64 * speed.layer_overhead_s == pytest.approx(0.0051)
    per_token = fit_cards(rows, cards, 0.0)[0]["A"]
    assert per_token.layer_overhead_s == 0.0 and per_token.efficiency != pytest.approx(0.8, rel=0.01)


def test_the_product_prices_the_gpu_overhead_with_the_recipes_per_layer_share() -> None:
    from tierlocal.catalog import load_overhead_layer_share

    share = load_overhead_layer_share()
    assert 0.0 < share <= 1.0
    speed = gpu_speed_for("RTX 4090", None)
    assert speed is not None and speed.layer_overhead_s > 0
    # the backend's whole overhead at 32 layers, split: share per layer, the rest per token
    whole = speed.token_overhead_s + 32 * speed.layer_overhead_s
    assert speed.token_overhead_s == pytest.approx(whole * (1 - share)) and 32 * speed.layer_overhead_s == pytest.approx(whole * share)


def test_half_precision_prefill_runs_at_the_ratio_the_fit_rows_pair_show() -> None:
    """λ: each half-precision prefill row against the median of its card's quantised rows of the
    same shape; the median of those ratios; rows without a pair, and held-out rows, count for nothing."""
    small = ModelShape("small", 8_000_000_000, 8_000_000_000, 500_000_000)

    def row(gpu: str, kind: str, tokens_per_s: float, use: str = "fit") -> PublishedRow:
        return PublishedRow(gpu, small, f"small {kind}", 5_000_000_000, "pp512", tokens_per_s, use, "by hand", "2026-12-06")

    assert half_prefill_factor([row("A", "Q4_K - Medium", 1000.0)]) == 1.0
    rows = [
        *(row("A", kind, rate) for kind, rate in (("Q4_K - Medium", 900.0), ("Q8_0", 1100.0), ("F16", 1300.0))),  # 1300 / 1000
        row("B", "Q4_0", 500.0),
        row("B", "F16", 700.0),  # 1.4
        row("C", "F16", 9000.0),  # no quantised row of its own
        row("D", "Q4_0", 100.0, "test"),
        row("D", "F16", 900.0),  # its quantised row is held out
    ]
    assert half_prefill_factor(rows) == pytest.approx(1.35)
    card = CardInfo("A", 1_000_000_000_000, None, "Gen1", "cuda")
    fit = CardFit("A", 0.8, 0.003, 60e12, "published", "by hand", 0.0)
    speed = card_device_speed(fit, card, 1.0, 1.35)
    assert speed.prefill_flops_per_s == {"*": 60e12, "F16": pytest.approx(81e12), "BF16": pytest.approx(81e12)}


def test_every_gpu_of_the_catalog_gets_published_or_derived_figures() -> None:
    for name in ("RTX 4090", "RTX 3060 12GB", "H100", "Apple M3 Max 64GB (unified)", "NVIDIA GeForce RTX 4090", "RTX 3090 #1"):
        speed = gpu_speed_for(name, None)
        assert speed is not None and speed.source in ("published", "derived"), name
        assert speed.decode_bytes_per_s["*"] > 0 and speed.token_overhead_s > 0
    assert gpu_speed_for("RTX 4090", None).source == "published"  # type: ignore[union-attr]
    assert gpu_speed_for("RTX 3060 12GB", None).source == "derived"  # type: ignore[union-attr]
    assert gpu_speed_for("24GiB GPU", None) is None  # a size with no bandwidth: no figure
    assert gpu_speed_for("24GiB GPU", 900_000_000_000) is not None  # a bandwidth: every card's median


def test_a_partly_offloaded_run_without_gpu_figures_says_so(tmp_path: Path) -> None:
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "lfm2.gguf", replace(LFM2_1_2B)))))
    estimate = estimate_run(spec, RunRequest(ctx=4096, parallel=1, ngl=4), _machine(gpu=True))
    speed = estimate_speed(spec, estimate, _known_speed(), None)
    assert speed.decode_tokens_per_s is None and speed.reason and "GPU" in speed.reason
    with_gpu = estimate_speed(spec, estimate, _known_speed(), gpu_speed_for("RTX 4090", None))
    cpu_only = estimate_speed(spec, estimate_run(spec, RunRequest(ctx=4096, parallel=1, ngl=0), _machine(gpu=True)), _known_speed())
    assert with_gpu.decode_tokens_per_s and cpu_only.decode_tokens_per_s and with_gpu.decode_tokens_per_s > cpu_only.decode_tokens_per_s
    assert set(with_gpu.decode_s) == {"host", "gpu"} and with_gpu.sources["gpu"].startswith("published: fitted to")


def test_the_fit_holds_on_the_published_rows_it_did_not_see() -> None:
    """The issue's bar, on the rows recipes/gpu_speed.toml holds out (use = "test"): decode
    within 15% at the median and 40% at worst, prefill within 25% at the median, over ≥ 12 cards
    and dense small, dense large and MoE shapes. Predicted as `check` prices a GPU: bytes read
    per token at the card's fitted rate plus its overhead (per token and per layer)."""
    from tierlocal.catalog import load_published_rows
    from tierlocal.gpu_figures import gpu_fits

    fits, kappa = gpu_fits()
    decode, prefill, cards, shapes = [], [], set(), set()
    for row in load_published_rows():
        if row.use != "test":
            continue
        speed = gpu_speed_for(row.gpu, None)
        assert speed is not None and speed.source == "published", row.gpu  # every tested card has rows of its own to fit
        if row.test.startswith("tg"):
            rate = speed.decode_bytes_per_s["F16" if row.half else "*"]
            overhead = speed.token_overhead_s + speed.layer_overhead_s * row.shape.n_layer
            decode.append(abs(1 / (row.read_bytes / rate + overhead) / row.tokens_per_s - 1))
            cards.add(row.gpu)
            shapes.add(row.shape.name)
        elif speed.prefill_flops_per_s:
            rate = speed.prefill_flops_per_s["F16" if row.half else "*"]
            prefill.append(abs(rate / row.flops / row.tokens_per_s - 1))
    decode.sort()
    prefill.sort()
    assert len(cards) >= 12 and {"llama 8B", "llama 70B", "gpt-oss 20B"} <= shapes
    assert decode[len(decode) // 2] <= 0.15 and decode[-1] <= 0.40
    # bench/gpu_speed.py: 19 rows, median 8.7%, worst 73% (the A40's 70B, 0.43× the same chip's RTX A6000)
    assert len(prefill) >= 15 and prefill[len(prefill) // 2] <= 0.15
    assert 0.5 <= kappa <= 1.5 and all(0 < fit.efficiency <= 1 for fit in fits.values())


@pytest.mark.parametrize(
    ("gpu", "basis"), [("RTX 4090", "published"), ("RTX 4060", "derived"), ("8GiB", "derived"), ("M3 Max 64GB", "published"), ("none", "derived")]
)
def test_every_catalog_row_on_every_gpu_has_a_decode_estimate_with_its_basis(gpu: str, basis: str) -> None:
    """Rows wholly on the GPU rest on the card's fit (a bare size: a typical card of that size,
    derived); this CPU-only machine, not calibrated, is priced from published runs of CPUs like
    it (derived; issue 47: it had the bound). The headline is never above the bound, which keeps a
    field of its own."""
    import json

    from tests.support.cli import run_cli
    from tierlocal.fit.speed import BASES

    done = run_cli("check", "--gpu", gpu, "--json")
    assert done.returncode == 0, done.stderr
    candidates = json.loads(done.stdout)["candidates"]
    for row in candidates:
        if row["status"] == "no room":
            continue
        assert row["est_decode_tokens_per_s"] > 0 and row["speed_basis"] in BASES, row["model"]
        bound = row["bound_decode_tokens_per_s"]  # None for a bare size: its bandwidth is not known
        assert bound is None or row["est_decode_tokens_per_s"] <= bound + 0.01, row["model"]
        if row["where"] in ("GPU", "CPU"):
            assert row["speed_basis"] == basis, (row["model"], row["where"])
    on_gpu = [row for row in candidates if row["where"] == "GPU"]
    assert bool(on_gpu) == (gpu != "none")
    assert all(row["est_prefill_tokens_per_s"] for row in on_gpu)  # prefill too, wherever the GPU does it all


@pytest.mark.parametrize("value", [1.5, -0.1, "0.7", True])
def test_an_overhead_layer_share_outside_zero_to_one_is_refused_with_the_fix(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import tierlocal.catalog as catalog

    monkeypatch.setattr(catalog, "_load", lambda name: {"fit": {"overhead_layer_share": value}})
    catalog.load_overhead_layer_share.cache_clear()
    try:
        with pytest.raises(catalog.CatalogError, match="overhead_layer_share is not a number from 0 to 1"):
            catalog.load_overhead_layer_share()
    finally:
        monkeypatch.undo()
        catalog.load_overhead_layer_share.cache_clear()
    assert catalog.load_overhead_layer_share() == 0.7


def test_each_probe_keeps_its_fastest_decode_and_prefill_of_the_rounds() -> None:
    """Other work only slows a timing, for minutes at a time: the fit sees each probe's fastest
    decode and fastest prefill, which may come from different rounds, in first-timed order."""
    from tierlocal.measure.calibrate import fastest_runs

    def run(name: str, decode_s: float, prefill_s: float) -> TimedRun:
        return TimedRun(name, {"bytes:Q8_0": 1.0}, {"flops:Q8_0": 1.0}, {}, 64, decode_s, prefill_s)

    kept = fastest_runs([run("a", 0.030, 0.002), run("b", 0.010, 0.001), run("a", 0.024, 0.003), run("b", 0.012, 0.0008)])
    assert [(r.name, r.decode_s, r.prefill_s_per_token) for r in kept] == [("a", 0.024, 0.002), ("b", 0.010, 0.0008)]

"""The speed model without an engine: what each run asks of each device (checked against the
tensor table the gguf package reads), the calibration fit recovering figures it did not
produce, the damaged-cache guard, and the published GPU rows' arithmetic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFReader

from tests.support.sparse_models import LFM2_1_2B, QWEN3_30B_A3B, write_sparse_gguf
from tierlocal.catalog import find_gpu, load_gpu_speed_rows
from tierlocal.fit.calibration import TimedRun, fit_device_speed
from tierlocal.fit.device_speed import DeviceSpeed, gpu_device_speed
from tierlocal.fit.estimate import Machine, RunRequest, estimate_run
from tierlocal.fit.model import model_spec
from tierlocal.fit.speed import estimate_speed, run_features
from tierlocal.gguf.sources import read_headers
from tierlocal.gguf.synthetic import ProbeShape, write_probe_gguf
from tierlocal.hardware.calibrate import PROBES

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
        "cpu", "measured", "by hand",
        decode_bytes_per_s={name: 12e9 + 1.5e9 * i for i, name in enumerate(types)},
        prefill_flops_per_s={**{name: 90e9 + 10e9 * i for i, name in enumerate(types)}, "x:Q4_K": 70e9},
        attention_flops_per_s=40e9, token_overhead_s=4e-4, layer_overhead_s=3e-5, vocab_overhead_s=5e-9,
        decode_row_s={name: 1e-9 + 2e-10 * i for i, name in enumerate(types)},
        prefill_token_overhead_s=2e-5, prefill_layer_overhead_s=1e-6, prefill_element_s=2e-10,
    )  # fmt: skip


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
            TimedRun(probe.shape.name, features.decode["host"], features.prefill["host"], features.once["host"], probe.prompt,
                     1 / predicted.decode_tokens_per_s, 1 / predicted.prefill_tokens_per_s)
        )  # fmt: skip
    fitted = fit_device_speed(runs)
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
    for damage in ({"decode_bytes_per_s": {"Q4_K": -1}}, {"decode_bytes_per_s": "fast"}, {"layer_overhead_s": float("nan")}, {"attention_flops_per_s": 0}):
        with pytest.raises(ValueError):
            DeviceSpeed.from_json({**good, **damage})


def test_a_gpu_is_priced_from_its_published_row_or_its_datasheet_derated() -> None:
    rows = load_gpu_speed_rows()
    row = next(r for r in rows if r.gpu == "RTX 4090")
    own = gpu_device_speed("RTX 4090", rows, datasheet_bytes_per_s=None, datasheet={})
    assert own is not None and own.source == "table"
    # 3.56 GiB of llama 7B Q4_0 less its 32000 × 4096 embedding, at 146.81 tokens/s
    assert own.decode_bytes_per_s["*"] == pytest.approx(3_822_520_320 * (1 - 131_072_000 / 6_740_000_000) * 146.81)
    assert own.prefill_flops_per_s["*"] == pytest.approx(2 * (6_740_000_000 - 2 * 131_072_000) * row.pp_tokens_per_s)  # type: ignore[operator]
    datasheet = {r.gpu: spec.bandwidth_bytes_per_s for r in rows if (spec := find_gpu(r.gpu)) is not None}
    assert len(datasheet) >= 2  # the rows' GPUs are in recipes/gpus.toml
    h100 = find_gpu("H100")
    assert h100 is not None
    derated = gpu_device_speed("H100", rows, datasheet_bytes_per_s=h100.bandwidth_bytes_per_s, datasheet=datasheet)
    assert derated is not None and derated.source == "table-derated"
    assert 0.3 * h100.bandwidth_bytes_per_s < derated.decode_bytes_per_s["*"] < h100.bandwidth_bytes_per_s
    assert derated.prefill_flops_per_s == {}  # no published prefill for it: not invented
    assert gpu_device_speed("Unknown GPU", rows, datasheet_bytes_per_s=None, datasheet=datasheet) is None


def test_a_partly_offloaded_run_without_gpu_figures_says_so(tmp_path: Path) -> None:
    spec = model_spec(read_headers(str(write_sparse_gguf(tmp_path / "lfm2.gguf", replace(LFM2_1_2B)))))
    estimate = estimate_run(spec, RunRequest(ctx=4096, parallel=1, ngl=4), _machine(gpu=True))
    speed = estimate_speed(spec, estimate, _known_speed(), None)
    assert speed.decode_tokens_per_s is None and speed.reason and "GPU" in speed.reason
    with_gpu = estimate_speed(spec, estimate, _known_speed(), gpu_device_speed("RTX 4090", load_gpu_speed_rows(), datasheet_bytes_per_s=None, datasheet={}))
    cpu_only = estimate_speed(spec, estimate_run(spec, RunRequest(ctx=4096, parallel=1, ngl=0), _machine(gpu=True)), _known_speed())
    assert with_gpu.decode_tokens_per_s and cpu_only.decode_tokens_per_s and with_gpu.decode_tokens_per_s > cpu_only.decode_tokens_per_s
    assert set(with_gpu.decode_s) == {"host", "gpu"} and "table" in with_gpu.sources["gpu"]

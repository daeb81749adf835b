"""Calibration: the device figures of :mod:`tierlocal.fit.speed` that best reproduce timed runs
of probe models on the real engine. Pure: the timings come in as arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .device_speed import DeviceSpeed
from .speed import Features, add_feature

__all__ = ["TimedRun", "fit_device_speed"]


@dataclass(frozen=True)
class TimedRun:
    """One probe timed on the engine: its features (``RunFeatures`` of the device) and the
    measured seconds per decoded token and per prompt token."""

    name: str
    decode: Features
    prefill: Features
    once: Features
    prompt: int
    decode_s: float
    prefill_s_per_token: float
    #: Whether the decode fit uses it (a probe whose weights stay in the CPU's cache does not).
    decode_fitted: bool = True


def _solve(rows: Sequence[tuple[Features, float]], names: Sequence[str]) -> dict[str, float]:
    """Non-negative least squares on relative error: Σ_i ((Σ_j a_ij x_j − t_i) / t_i)², x ≥ 0.
    Small and dense (a dozen unknowns): an active-set loop over numpy's lstsq."""
    import numpy as np

    matrix = np.array([[features.get(name, 0.0) / seconds for name in names] for features, seconds in rows])
    target = np.ones(len(rows))
    active = list(range(len(names)))
    solution = np.zeros(len(names))
    for _ in range(len(names) + 1):
        scale = np.maximum(np.abs(matrix[:, active]).max(axis=0), 1e-300)
        fitted, *_ = np.linalg.lstsq(matrix[:, active] / scale, target, rcond=None)
        fitted = fitted / scale
        negative = [index for index, value in zip(active, fitted, strict=True) if value < 0]
        if not negative:
            solution[:] = 0
            solution[active] = fitted
            break
        worst = min(negative, key=lambda index: fitted[active.index(index)])
        active.remove(worst)
    return {name: float(value) for name, value in zip(names, solution, strict=True)}


def fit_device_speed(runs: Iterable[TimedRun], *, device: str = "cpu", note: str = "") -> DeviceSpeed:
    """Effective figures that reproduce ``runs`` best (relative least squares, non-negative).

    Raises:
        ValueError: the runs do not determine a rate for some weight type they contain, or none
            of them is in the decode fit.
    """
    runs = list(runs)
    decode_rows = []
    for run in (run for run in runs if run.decode_fitted):  # the KV cache is read at the F16 rate, as estimate_speed prices it
        features = {name: amount for name, amount in run.decode.items() if name != "kv_bytes"}
        add_feature(features, "bytes:F16", run.decode.get("kv_bytes", 0.0))
        decode_rows.append((features, run.decode_s))
    if not decode_rows:
        raise ValueError("no probe that the decode fit prices by its matrices was timed")
    decode_names = sorted({name for features, _ in decode_rows for name in features})
    decode = _solve(decode_rows, decode_names)
    prefill_rows = []
    for run in runs:
        per_token = {name: amount for name, amount in run.prefill.items() if not name.startswith("xread:")}  # a GPU's, not fitted here
        for name, amount in run.once.items():
            per_token[name] = per_token.get(name, 0.0) + amount / run.prompt
        prefill_rows.append((per_token, run.prefill_s_per_token))
    prefill_names = sorted({name for features, _ in prefill_rows for name in features})
    prefill = _solve(prefill_rows, prefill_names)

    def rates(solution: Mapping[str, float], unit: str) -> dict[str, float]:
        """``{unit}:T`` → T and ``x{unit}:T`` → ``x:T`` (experts), as rates."""
        out = {}
        for name, seconds_per_unit in solution.items():
            kind, _, ggml_type = name.partition(":")
            if kind in (unit, f"x{unit}"):
                if seconds_per_unit <= 0:
                    raise ValueError(f"the probes do not determine a rate for {ggml_type}")
                out[ggml_type if kind == unit else f"x:{ggml_type}"] = 1 / seconds_per_unit
        return out

    attention = prefill.get("attn_flops", 0.0)
    if attention <= 0:
        raise ValueError("the probes do not determine the attention rate")
    decode_rates = rates(decode, "bytes")
    return DeviceSpeed(
        device=device,
        source="measured",
        note=note,
        decode_bytes_per_s=decode_rates,
        prefill_flops_per_s=rates(prefill, "flops"),
        attention_flops_per_s=1 / attention,
        token_overhead_s=decode.get("token", 0.0),
        layer_overhead_s=decode.get("layer", 0.0),
        vocab_overhead_s=decode.get("vocab", 0.0),
        decode_row_s={name.partition(":")[2]: cost for name, cost in decode.items() if name.startswith("rows:")},
        prefill_token_overhead_s=prefill.get("token", 0.0),
        prefill_layer_overhead_s=prefill.get("layer", 0.0),
        prefill_element_s=prefill.get("elems", 0.0),
    )

"""Verified loads, remembered: ``$TIERLOCAL_HOME/loads.jsonl`` (one JSON object per line,
appended by `tierlocal serve`), and the correction they give the next estimate of the same
model with the same engine build."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from .records import append_record, read_records
from .state import ServeState

__all__ = ["GpuCorrection", "history_path", "gpu_correction", "record_load"]


@dataclass(frozen=True)
class GpuCorrection:
    """Bytes to add to the GPU estimate, from ``loads`` matching records (the median miss)."""

    bytes: int
    loads: int


def history_path() -> Path:
    return constants.home_dir() / "loads.jsonl"


def gpu_correction(match: dict[str, object], path: Path | None = None) -> GpuCorrection | None:
    """The median of (actual − uncorrected planned) GPU bytes over the records whose ``key``
    equals ``match`` (model file and size, engine build, the request as typed)."""
    misses = []
    for record in read_records(path or history_path()):
        key = record.get("key")
        gpu = record.get("gpu")
        if key != match or not isinstance(gpu, dict):
            continue
        try:
            misses.append(int(gpu["actual_bytes"]) - (int(gpu["planned_bytes"]) - int(gpu.get("correction_bytes", 0))))
        except (KeyError, TypeError, ValueError):
            continue
    if not misses:
        return None
    return GpuCorrection(int(statistics.median(misses)), len(misses))


def record_load(key: dict[str, object], state: ServeState, planned_gpu: int, actual_gpu: int, correction: int) -> None:
    """Append a verified load (``key``: what :func:`gpu_correction` matches on; ``state``:
    the serve's state; GPU bytes planned, allocated, and the correction applied)."""
    payload = state.to_json()
    record = {
        "key": key,
        "gpu": {"planned_bytes": planned_gpu, "actual_bytes": actual_gpu, "correction_bytes": correction},
        **{name: payload[name] for name in ("engine", "engine_version", "plan", "actual", "delta")},
    }
    append_record(history_path(), record)

"""The load history's correction: median miss over matching records; damaged lines skipped."""

from __future__ import annotations

import json
from pathlib import Path

from tierlocal.serve.history import GpuCorrection, gpu_correction

KEY = {"model": "/m.gguf", "file_bytes": 10, "engine": "/bin/llama-server", "engine_version": "b1", "ctx": "4096", "parallel": "1", "gpus": []}


def _line(key: dict[str, object], planned: int, actual: int, correction: int = 0) -> str:
    return json.dumps({"key": key, "gpu": {"planned_bytes": planned, "actual_bytes": actual, "correction_bytes": correction}})


def test_median_of_uncorrected_misses_for_the_same_key_only(tmp_path: Path) -> None:
    history = tmp_path / "loads.jsonl"
    other = {**KEY, "engine_version": "b2"}
    history.write_text(
        "\n".join(
            [
                _line(KEY, 100, 110),  # missed by +10
                _line(KEY, 125, 130, correction=20),  # planned 105 before the correction: +25
                "{not json",
                _line(other, 100, 500),  # another engine build: ignored
                json.dumps(["a list"]),
                _line(KEY, 100, 90),  # -10
            ]
        )
        + "\n"
    )
    assert gpu_correction(KEY, history) == GpuCorrection(10, 3)


def test_no_history_no_correction(tmp_path: Path) -> None:
    assert gpu_correction(KEY, tmp_path / "missing.jsonl") is None

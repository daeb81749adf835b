"""The compact header a catalog entry keeps: read back, it gives the estimator exactly what the
file's own header gives — the same spec, field by field, and the same plans — for the real
Gemma model and sparse GGUFs of real architectures; and a damaged or oversized one is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.sparse_models import DEEPSEEK_V2_LITE, KIMI_LINEAR_4L, LFM2_1_2B, QWEN3_30B_A3B, QWEN3_NEXT_4L, RWKV7_168M, write_sparse_gguf
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.estimate import Machine, RunRequest
from tierlocal.fit.model import model_spec
from tierlocal.fit.search import plan_run
from tierlocal.gguf import summarize
from tierlocal.gguf.compact import CompactError, from_compact, to_compact
from tierlocal.gguf.parse import HeaderLimits

GIB = 1 << 30
#: A 24 GiB GPU and 64 GiB of RAM: room for partial and full offload plans.
MACHINE = Machine("test GPU", "cuda", 24 * GIB, 23 * GIB, 1_000_000_000_000, 64 * GIB, 60 * GIB, 50_000_000_000, 300 << 20, 1 << 30)
REQUESTS = [
    RunRequest(ctx=8192, parallel=1),
    RunRequest(ctx=32768, parallel=4, cache_type_k="q8_0", cache_type_v="q8_0"),
    RunRequest(ctx=4096, ngl=5),
]


def _round_trip(path: Path) -> tuple[list, list]:  # type: ignore[type-arg]
    headers = read_headers(str(path))
    text = json.dumps(to_compact(headers))
    return headers, from_compact(json.loads(text), str(path))


def _check_same_plans(path: Path) -> None:
    headers, back = _round_trip(path)
    spec, spec_back = model_spec(headers), model_spec(back)
    for field in dataclasses.fields(spec):
        assert getattr(spec_back, field.name) == getattr(spec, field.name), field.name
    assert summarize(back) == summarize(headers)
    for request in REQUESTS:
        assert plan_run(spec_back, request, MACHINE) == plan_run(spec, request, MACHINE)


def test_gemma_round_trips_to_the_same_spec_and_plans(gemma: Path) -> None:
    _check_same_plans(gemma)
    compact = json.dumps(to_compact(read_headers(str(gemma))))
    assert len(compact) < 64 * 1024  # the 262,144-entry vocabulary is kept as its length
    assert gemma.stat().st_size > 100 * len(compact)


@pytest.mark.parametrize("arch", [QWEN3_30B_A3B, DEEPSEEK_V2_LITE, LFM2_1_2B, QWEN3_NEXT_4L, KIMI_LINEAR_4L, RWKV7_168M], ids=lambda a: a.name)
def test_sparse_architectures_round_trip_to_the_same_spec_and_plans(tmp_path: Path, arch: object) -> None:
    _check_same_plans(write_sparse_gguf(tmp_path / "model.gguf", arch))  # type: ignore[arg-type]


def test_damaged_or_oversized_compact_headers_are_refused(tmp_path: Path) -> None:
    good = to_compact(read_headers(str(write_sparse_gguf(tmp_path / "m.gguf", RWKV7_168M))))
    file = good["files"][0]  # type: ignore[index]
    cases = {
        "not a tierlocal-gguf-compact version 1": {**good, "version": 2},
        "'files' must list": {**good, "files": []},
        "tensors must be a list of at most 3": good,
        "has unknown type 'Q9_K'": {**good, "files": [{**file, "tensors": [["t", [32], "Q9_K", 0]]}]},
        "is not whole Q4_K blocks": {**good, "files": [{**file, "tensors": [["t", [100], "Q4_K", 0]]}]},
        "must be a count, not -1": {**good, "files": [{**file, "file_bytes": -1}]},
        "has 5 dimensions": {**good, "files": [{**file, "tensors": [["t", [1, 1, 1, 1, 1], "F32", 0]]}]},
        "an object value must be an array summary": {**good, "files": [{**file, "metadata": {"k": {"x": 1}}}]},
    }
    for message, data in cases.items():
        limits = HeaderLimits(max_tensors=3) if message.startswith("tensors") else None
        with pytest.raises(CompactError, match=message):
            from_compact(data, "bad.json", limits)


def test_catalog_capture_writes_the_compact_header(tmp_path: Path) -> None:
    model = write_sparse_gguf(tmp_path / "lfm2.gguf", LFM2_1_2B)
    out = tmp_path / "recipes" / "headers" / "lfm2.json"
    result = run_cli("catalog", "capture", str(model), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert model_spec(from_compact(json.loads(out.read_text()), "lfm2")) == model_spec(read_headers(str(model)))
    assert not out.with_name("lfm2.json.partial").exists()
    missing = run_cli("catalog", "capture", str(tmp_path / "none.gguf"))
    assert missing.returncode != 0 and "no such file" in missing.stderr and missing.stdout == ""

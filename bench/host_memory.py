"""System RAM as the kernel counts it: tierlocal's host-memory figures beside what /proc says of
a real llama-server (the prepared CPU build) after its load and one short request.

For each model, context and --load-mode: predicted page cache mapped (RssFile less the engine's
own 12 MiB of binary), anonymous (RssAnon: repacked weights, KV, output, the engine's heap, and
the weights themselves without mmap) and peak (VmHWM), with the ratio predicted/actual. Rows
marked "fit" are the two loads the engine's heap constants were fitted to; every other row is
held out. Models: the real Gemma 3 270M and sparse GGUFs of real shapes
(tests/support/sparse_models.py).

    .venv/bin/python -m bench.host_memory [--json]
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from tests.support.assets import load_assets
from tests.support.kernel_memory import measure_load
from tests.support.sparse_models import LFM2_1_2B, LLAMA3_8B, QWEN3_8B, write_sparse_gguf
from tierlocal.engines.llama_server import build_cpu_features
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.estimate import Machine, RunRequest
from tierlocal.fit.host_memory import ENGINE_FILE_BYTES, host_memory
from tierlocal.fit.model import model_spec
from tierlocal.fit.search import plan_run

MIB = 2**20
# (model, context, load mode, fitted?)
MATRIX = [
    ("gemma-3-270m", 4096, "mmap", True),
    ("llama-3-8b", 4096, "mmap", True),
    ("gemma-3-270m", 16384, "mmap", False),
    ("gemma-3-270m", 8192, "none", False),
    ("gemma-3-270m", 4096, "mlock", False),
    ("llama-3-8b", 8192, "none", False),
    ("qwen3-8b", 8192, "mmap", False),
    ("lfm2-1.2b", 8192, "mmap", False),
    ("lfm2-1.2b", 4096, "none", False),
]


def _models(scratch: Path, gemma: Path) -> dict[str, Path]:
    return {
        "gemma-3-270m": gemma,
        "llama-3-8b": write_sparse_gguf(scratch / "llama-3-8b.gguf", LLAMA3_8B),
        "qwen3-8b": write_sparse_gguf(scratch / "qwen3-8b.gguf", QWEN3_8B),
        "lfm2-1.2b": write_sparse_gguf(scratch / "lfm2.gguf", replace(LFM2_1_2B)),
    }


def main(argv: list[str]) -> int:
    assets = load_assets()
    if assets is None:
        print("test assets are not prepared: run bash tests/run.sh (or python tests/assets/prepare.py) first", file=sys.stderr)
        return 2
    binary = assets.llama_server_cpu
    features = build_cpu_features(binary) or ()
    machine = Machine(None, None, 0, 0, None, 24 << 30, 20 << 30, 40_000_000_000, 0, 1 << 30, cpu_arch="x86_64", cpu_features=features)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tierlocal-hostmem-") as scratch:
        models = _models(Path(scratch), assets.gemma_gguf)
        for name, ctx, mode, fitted in MATRIX:
            spec = model_spec(read_headers(str(models[name])))
            estimate = plan_run(spec, RunRequest(ctx=ctx, parallel=1), machine)
            predicted = host_memory(spec, estimate, machine, mode)
            actual = measure_load(binary, models[name], Path(scratch), ctx=ctx, load_mode=mode)
            rows.append(
                {
                    "model": name,
                    "ctx": ctx,
                    "load_mode": mode,
                    "fitted": fitted,
                    "mapped": (predicted.mapped_bytes, actual.file_bytes - ENGINE_FILE_BYTES),
                    "anonymous": (predicted.anonymous_bytes, actual.anonymous_bytes),
                    "peak": (predicted.peak_bytes, actual.peak_bytes),
                    "repack": predicted.repack_bytes,
                }
            )
            print_row(rows[-1])
    if "--json" in argv:
        print(json.dumps({"cpu_features": list(features), "rows": rows}, indent=2))
    held_out = [row for row in rows if not row["fitted"]]
    worst = max(abs(row[key][0] / row[key][1] - 1) for row in held_out for key in ("anonymous", "peak"))
    print(f"held out: worst anonymous/peak error {worst:.1%} over {len(held_out)} loads (CPU features as built: {', '.join(features) or 'none'})")
    return 0


def print_row(row: dict) -> None:  # type: ignore[type-arg]
    cells = []
    for key in ("mapped", "anonymous", "peak"):
        predicted, actual = row[key]
        ratio = f"{predicted / actual:.3f}" if actual > 0 else "-"
        cells.append(f"{key} {predicted / MIB:8.1f} / {actual / MIB:8.1f} MiB ({ratio})")
    mark = "fit " if row["fitted"] else "held"
    print(f"{mark} {row['model']:13} {row['ctx']:6} {row['load_mode']:6}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

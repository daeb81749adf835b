"""The plan against a real GPU's buffers: `tierlocal serve` (which plans, launches llama-server
with the plan, and reads its load log) on sparse GGUFs of real architectures, full and partial
offload, then one table: per device, what tierlocal planned and what llama.cpp allocated.

Run where a GPU build of llama-server exists (bench/device_cuda.sh does it on a lent NVIDIA
machine):

    python -m bench.cuda_loads --llama-server build/bin/llama-server --models DIR [--json OUT.json]

Models are written into DIR with tests/support/sparse_models.py when missing. A case that does
not load is reported with its error, not skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.engines import first_json_document, free_port
from tests.support.sparse_models import DEEPSEEK_V2_LITE, LFM2_1_2B, LLAMA3_8B, QWEN3_8B, QWEN3_30B_A3B, write_sparse_gguf

MODELS = {spec.name: spec for spec in (LLAMA3_8B, QWEN3_8B, QWEN3_30B_A3B, DEEPSEEK_V2_LITE, LFM2_1_2B)}
#: (model, serve arguments): every model whole on the GPU at 8k, then partial offloads that a
#: smaller card (--gpu SIZE: this GPU with that much memory) forces, dense and MoE.
CASES = [
    *((name, ("--ctx", "8192")) for name in MODELS),
    ("llama-3-8b-q4k", ("--ctx", "8192", "--parallel", "2")),
    ("llama-3-8b-q4k", ("--ctx", "8192", "--gpu", "4GiB")),
    ("qwen3-30b-a3b-q4k", ("--ctx", "8192", "--gpu", "10GiB")),
]
_MIB = 2**20


def _serve(binary: str, model: Path, args: tuple[str, ...], home: Path) -> dict[str, object]:
    env = {**os.environ, "TIERLOCAL_HOME": str(home)}
    argv = [sys.executable, "-m", "tierlocal", "serve", str(model), "--llama-server", binary, "--port", str(free_port()), "--json", *args]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = first_json_document(process)
    except BaseException as exc:  # the load failed: keep what it said
        process.kill()
        _out, err = process.communicate()
        return {"error": f"{type(exc).__name__}: {err[-1500:]}"}
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
    return ready


def _rows(case: str, ready: dict[str, object]) -> list[dict[str, object]]:
    """Per device: planned and allocated weights, KV, compute and total (MiB)."""
    plan, actual = ready["plan"], ready["actual"]
    assert isinstance(plan, dict) and isinstance(actual, dict)
    planned = {("host" if d["backend"] == "cpu" else "gpu"): d for d in plan["devices"]}
    allocated = {("host" if d["name"] == "host" else "gpu"): d for d in actual["devices"]}
    rows = []
    for side in ("gpu", "host"):
        p, a = planned.get(side), allocated.get(side)
        if p is None or a is None:
            continue
        row: dict[str, object] = {"case": case, "device": a["name"]}
        for part in ("weights", "kv", "compute"):
            row[f"{part}_planned_mib"] = round(p[f"{part}_bytes"] / _MIB, 2)
            row[f"{part}_actual_mib"] = round(a[f"{part}_bytes"] / _MIB, 2)
        p_total = sum(p[f"{k}_bytes"] for k in ("weights", "kv", "compute", "output"))
        a_total = sum(a[f"{k}_bytes"] for k in ("weights", "kv", "compute", "output"))
        row["total_error"] = round((p_total - a_total) / a_total, 4) if a_total else None
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--json", type=Path, help="write every case's plan, load and delta here")
    args = parser.parse_args()
    args.models.mkdir(parents=True, exist_ok=True)
    results, rows = [], []
    for name, serve_args in CASES:
        path = args.models / f"{name}.gguf"
        if not path.is_file():
            write_sparse_gguf(path, MODELS[name])
        case = f"{name} {' '.join(serve_args)}"
        ready = _serve(args.llama_server, path, serve_args, args.models / "home")
        results.append({"case": case, **ready})
        if "error" in ready:
            print(f"{case}: FAILED {ready['error'][-300:]}", flush=True)
            continue
        delta = ready["delta"]
        assert isinstance(delta, dict)
        plan, actual = ready["plan"], ready["actual"]
        print(
            f"{case}: layers {plan['layers_offloaded']}/{plan['layers_total']} planned, {actual['layers_offloaded']} loaded; verified "
            f"{delta['verified']}",
            flush=True,
        )  # type: ignore[index]
        rows += _rows(case, ready)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    header = f"{'case':48} {'device':8} {'weights plan/act MiB':>22} {'KV plan/act':>18} {'compute plan/act':>20} {'total err':>9}"
    print(header)
    for row in rows:
        error = "-" if row["total_error"] is None else f"{row['total_error']:+.2%}"
        print(
            f"{str(row['case'])[:48]:48} {str(row['device'])[:8]:8} "
            f"{row['weights_planned_mib']:>10}/{row['weights_actual_mib']:<11} {row['kv_planned_mib']:>8}/{row['kv_actual_mib']:<9} "
            f"{row['compute_planned_mib']:>9}/{row['compute_actual_mib']:<10} {error:>9}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

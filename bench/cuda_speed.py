"""GPU speed on a real card: llama-bench's own pp512 / tg128 for sparse GGUFs of the shapes the
catalog ranks (full depth where a shape has one), beside the speed ``tierlocal check FILE``
estimates for the same file on the same card. The estimate is what the ranking of ``check``
weighs quality against; no row here was used to fit it.

Two halves, because the card is on another machine:

    # where the GPU is (bench/device_cuda.sh runs it with STEPS=speed):
    python -m bench.cuda_speed measure --llama-bench build/bin/llama-bench --models DIR --json speed.json
    # here, on the measured rows (writes the same sparse files, asks tierlocal, prints the table):
    python -m bench.cuda_speed compare speed.json --gpu H200 [--json table.json]

The sparse models' weights are zeros: a generated token reads every weight it would read with
real ones, so decode (tg128) is a fair test; a MoE router sends every token of a prompt to the
same experts, so a MoE's pp512 is that of a batch the experts share (real routing spreads it).
tierlocal quotes decode at 512 tokens of context and llama-bench's tg128 starts from none: the
KV read that adds is ~1% of an 8B model's weights. A case that fails says so; none is dropped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from tests.support.sparse_models import (
    DEEPSEEK_V2_LITE,
    EXAONE4_32B,
    GEMMA4_26B_A4B_6L,
    GEMMA4_31B_6L,
    GPT_OSS_20B_4L,
    LLAMA3_8B,
    PHI4_MINI,
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN25_7B,
    QWEN35_35B_A3B_4L,
    SEED_OSS_36B_4L,
    SMOLLM3_3B,
    SparseArch,
    write_sparse_gguf,
)
from tests.support.sparse_models import Q as QuantType

#: Llama-3.3-70B (meta-llama/Llama-3.3-70B-Instruct config.json): 80 blocks of 8192, 64 heads
#: and 8 KV heads of 128, FFN 28,672, vocabulary 128,256.
_LLAMA3_70B = replace(LLAMA3_8B, name="llama-3.3-70b-q4k", n_layer=80, n_embd=8192, n_head=64, n_ff=28672)

#: Smallest first, so a run cut short still has the small and mid-sized shapes. Depths are the
#: published ones (the sparse specs keep a few blocks for the CPU tests; widths are whole).
CASES: tuple[SparseArch, ...] = (
    SMOLLM3_3B,
    replace(PHI4_MINI, name="phi-4-mini-q4k"),
    QWEN25_7B,
    LLAMA3_8B,
    replace(LLAMA3_8B, name="llama-3-8b-q8", weight_type=QuantType.Q8_0, output_type=QuantType.Q8_0),
    QWEN3_8B,
    DEEPSEEK_V2_LITE,
    replace(GPT_OSS_20B_4L, name="gpt-oss-20b-mxfp4", n_layer=24),
    QWEN3_30B_A3B,
    replace(GEMMA4_26B_A4B_6L, name="gemma-4-26b-a4b-q4k", n_layer=30),
    replace(QWEN35_35B_A3B_4L, name="qwen3.5-35b-a3b-q4k", n_layer=40),
    replace(GEMMA4_31B_6L, name="gemma-4-31b-q4k", n_layer=60),
    replace(SEED_OSS_36B_4L, name="seed-oss-36b-q4k", n_layer=64),
    EXAONE4_32B,
    _LLAMA3_70B,
)
_BY_NAME = {case.name: case for case in CASES}


def _model(models: Path, case: SparseArch) -> Path:
    path = models / f"{case.name}.gguf"
    if not path.is_file():
        write_sparse_gguf(path, case)
    return path


def _llama_bench(binary: str, path: Path, timeout_s: float) -> dict[str, object]:
    """llama-bench's pp512 and tg128 (mean and spread of 3 runs, tokens/s) with every layer on
    the GPU and flash attention on, as tierlocal plans a model that fits."""
    argv = [binary, "-m", str(path), "-ngl", "99", "-fa", "1", "-p", "512", "-n", "128", "-r", "3", "-o", "json"]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"llama-bench ran past {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": f"llama-bench exit {done.returncode}: {done.stderr[-600:]}"}
    rows = json.loads(done.stdout)
    result: dict[str, object] = {"seconds": round(time.monotonic() - started, 1)}
    for row in rows:
        test = "pp512" if row["n_prompt"] else "tg128"
        result[test] = round(row["avg_ts"], 2)
        result[f"{test}_stddev"] = round(row["stddev_ts"], 2)
        result["size_bytes"] = row["model_size"]
        result["build"] = f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})"
        result["gpu_info"] = row.get("gpu_info", "")
        result["backends"] = row.get("backends", "")
    return result


def measure(args: argparse.Namespace) -> int:
    args.models.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    results: list[dict[str, object]] = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        if time.monotonic() > deadline:
            results.append({"case": case.name, "error": f"not run: the {args.budget_s:.0f} s budget was spent"})
            continue
        row: dict[str, object] = {"case": case.name}
        try:
            row.update(_llama_bench(args.llama_bench, _model(args.models, case), args.case_timeout_s))
        except Exception as exc:  # a case that fails is reported, never dropped
            row["error"] = f"{type(exc).__name__}: {exc}"
        results.append(row)
        print(json.dumps(row), flush=True)
        args.json.write_text(json.dumps(results, indent=2))  # after each case: a run cut short keeps what it measured
    return 0


def _predicted(path: Path, gpu: str) -> dict[str, object]:
    """What ``tierlocal check FILE --gpu GPU --json`` says of the file's speed."""
    argv = [sys.executable, "-m", "tierlocal", "check", str(path), "--gpu", gpu, "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    speed = report["speed"]
    estimate = speed["estimate"] or {}
    return {
        "decode": estimate.get("decode_tokens_per_s"),
        "prefill": estimate.get("prefill_tokens_per_s"),
        "basis": estimate.get("basis"),
        "bound": speed["all_on_gpu_tokens_per_s"],
        "offloaded": f"{report['layers_offloaded']}/{report['layers_total']}",
    }


def _ratio(predicted: object, actual: object) -> float | None:
    if not isinstance(predicted, int | float) or not isinstance(actual, int | float) or not actual:
        return None
    return predicted / actual


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def compare(args: argparse.Namespace) -> int:
    measured = json.loads(args.measured.read_text())
    args.models.mkdir(parents=True, exist_ok=True)
    table = []
    for row in measured:
        case = _BY_NAME.get(str(row["case"]))
        if case is None:
            continue
        predicted = _predicted(_model(args.models, case), args.gpu) if "error" not in row else {}
        table.append(
            {
                **row,
                "predicted": predicted,
                "decode_ratio": _ratio(predicted.get("decode"), row.get("tg128")),
                "prefill_ratio": _ratio(predicted.get("prefill"), row.get("pp512")),
                "bound_ratio": _ratio(predicted.get("bound"), row.get("tg128")),
            }
        )
    print(f"{'shape':26} {'GiB':>6} {'tg128':>8} {'estimate':>9} {'ratio':>6} {'bound ×':>8} {'pp512':>9} {'estimate':>9} {'ratio':>6}")
    for row in table:
        if "error" in row:
            print(f"{row['case']:26} {str(row['error'])[:100]}")
            continue
        predicted = row["predicted"]
        size = int(row["size_bytes"]) / 2**30
        print(
            f"{row['case']:26} {size:>6.1f} {row['tg128']:>8.1f} {_cell(predicted['decode'], '.1f'):>9} {_cell(row['decode_ratio'], '.2f'):>6} "
            f"{_cell(row['bound_ratio'], '.2f'):>8} {row['pp512']:>9.0f} {_cell(predicted['prefill'], '.0f'):>9} "
            f"{_cell(row['prefill_ratio'], '.2f'):>6}"
        )
    decode = [abs(r["decode_ratio"] - 1) for r in table if r.get("decode_ratio")]
    prefill = [abs(r["prefill_ratio"] - 1) for r in table if r.get("prefill_ratio")]
    bound = [abs(r["bound_ratio"] - 1) for r in table if r.get("bound_ratio")]
    for what, errors in (("decode estimate", decode), ("prefill estimate", prefill), ("bandwidth bound", bound)):
        if errors:
            print(f"{what}: median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%} over {len(errors)} shapes")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    run = sub.add_parser("measure", help="llama-bench every shape on this machine's GPU")
    run.add_argument("--llama-bench", required=True)
    run.add_argument("--models", type=Path, required=True)
    run.add_argument("--json", type=Path, required=True)
    run.add_argument("--only", nargs="*", help="case names to run (default: all)")
    run.add_argument("--budget-s", type=float, default=300.0, help="stop starting cases after this many seconds")
    run.add_argument("--case-timeout-s", type=float, default=120.0)
    table = sub.add_parser("compare", help="tierlocal's estimate beside measured rows")
    table.add_argument("measured", type=Path)
    table.add_argument("--gpu", required=True, help="the card the rows were measured on, as --gpu takes it")
    table.add_argument("--models", type=Path, default=Path("/tmp/tierlocal-cuda-speed"))
    table.add_argument("--json", type=Path)
    args = parser.parse_args()
    return measure(args) if args.step == "measure" else compare(args)


if __name__ == "__main__":
    sys.exit(main())

"""Single-stream prefill on GPUs, MoE included: tierlocal's estimate beside the published
llama-batched-bench S_PP at one sequence (recipes/batched_bench.toml, B = 1: one prompt of PP
tokens, in batches of the row's -ub), and the one figure fitted for it — how many times a GPU's
prompt batch streams the weights of the experts it touches (``expert_batch_reads``), fitted on the
use = "fit" gpt-oss-20b rows and only compared on the others (every other model held out).

    .venv/bin/python -m bench.prefill_published [--write] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from tierlocal.catalog import _read_compact, recipes_dir
from tierlocal.fit.concurrency import batch_costs
from tierlocal.fit.device_speed import DeviceSpeed
from tierlocal.fit.estimate import RunRequest
from tierlocal.fit.model import ModelSpec, model_spec
from tierlocal.fit.speed import bound_speed
from tierlocal.gpu_figures import gpu_speed_for

GRID = [step / 8 for step in range(41)]
HOST = bound_speed("host CPU", 100_000_000_000, "sampling only")


def _rows() -> list[dict[str, object]]:
    data = tomllib.loads((recipes_dir() / "batched_bench.toml").read_text())
    return [row for row in data["row"] if row["use"] in ("fit", "test") and row["b"] == 1]


def _ubatch(row: dict[str, object]) -> int:
    found = re.search(r"-ub (\d+)", str(row.get("flags", "")))
    return int(found.group(1)) if found else 512


def predict(row: dict[str, object], spec: ModelSpec, gpu: DeviceSpeed, reads: float) -> float:
    """Prefill tokens/s of the row's prompt, all of it on the GPU."""
    pp, ubatch = int(row["pp"]), _ubatch(row)  # type: ignore[call-overload]
    request = RunRequest(ctx=pp + 64, parallel=1, ngl=spec.n_layer + 1, flash_attn=True, n_ubatch=ubatch)
    costs = batch_costs(spec, request, {"host": HOST, "gpu": replace(gpu, expert_batch_reads=reads)}, prompt=min(pp, ubatch), depth=pp)
    assert costs is not None
    return pp / (pp * costs.prompt_token_s + costs.prompt_once_s * math.ceil(pp / ubatch))


def _summary(label: str, errors: list[float]) -> str:
    return f"{label}: {len(errors)} rows, median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%}" if errors else f"{label}: none"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fitted expert_batch_reads into recipes/batched_bench.toml")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = _rows()
    specs = {str(row["header"]): model_spec(list(_read_compact(f"{row['header']}.json"))) for row in rows}
    gpus = {str(row["gpu"]): gpu_speed_for(str(row["gpu"]), None) for row in rows}
    if any(speed is None for speed in gpus.values()):
        print("no speed figures for", [name for name, speed in gpus.items() if speed is None], file=sys.stderr)
        return 2

    def error(row: dict[str, object], reads: float) -> float:
        return predict(row, specs[str(row["header"])], gpus[str(row["gpu"])], reads) / float(row["s_pp"])  # type: ignore[arg-type]

    fit = [row for row in rows if row["use"] == "fit" and specs[str(row["header"])].n_expert]
    reads = min(GRID, key=lambda value: sum(math.log(error(row, value)) ** 2 for row in fit))
    print(f"fitted expert_batch_reads: {reads:g} (on {len(fit)} MoE fit rows)\n")
    print(f"{'use':4} {'gpu':17} {'model':26} {'pp':>5} {'ub':>5} | {'S_PP published':>14} {'predicted':>9} {'ratio':>6} | {'reads 0':>7}")
    results = []
    for row in rows:
        ratio, before = error(row, reads), error(row, 0.0)
        results.append({**{k: row[k] for k in ("use", "gpu", "header", "pp", "s_pp", "source")}, "ratio": ratio, "ratio_without_reads": before})
        print(
            f"{row['use']:4} {row['gpu']:17} {row['header']:26} {row['pp']:>5} {_ubatch(row):>5} | {row['s_pp']:>14} "
            f"{ratio * float(row['s_pp']):9.1f} {ratio:6.2f} | {before:7.2f}"  # type: ignore[arg-type]
        )
    print()
    for use in ("fit", "test"):
        mine = [r for r in results if r["use"] == use]
        print(_summary(f"{use} rows, prefill", [abs(r["ratio"] - 1) for r in mine]))
        print(_summary(f"{use} rows, prefill without the experts' reads", [abs(r["ratio_without_reads"] - 1) for r in mine]))
    if args.write:
        path = recipes_dir() / "batched_bench.toml"
        text = path.read_text()
        start = text.index("expert_batch_reads = ")
        path.write_text(text[:start] + f"expert_batch_reads = {reads:g}" + text[text.index("\n", start) :])
        print(f"written to {path}")
    if args.json:
        args.json.write_text(json.dumps({"expert_batch_reads": reads, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

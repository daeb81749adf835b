"""Many sequences at once on GPUs: tierlocal's concurrency model beside published
llama-batched-bench tables (recipes/batched_bench.toml), and beside what the single-stream figure
says (B × one sequence's speed).

Each row's model is planned from its header in recipes/headers/ with every layer on its GPU
(recipes/gpus.toml's figures, as `check --gpu` prices it), and one decode step of B sequences at the
row's depth (PP + TG/2) is priced by tierlocal/fit/concurrency.py: aggregate decode = B ÷ step.
The batch FLOP share of each backend is fitted on the use = "fit" rows (least squares on log
ratios over a grid) and only compared on the use = "test" rows. `--skews` also refits the shares
with the routers skewed (tierlocal/fit/routing.py, α = 0, 0.1, … 2) and prints, per α, the loss on
the fit rows and the error on both kinds of rows. `--layer-shares` refits the GPUs with each share
of their overhead paid per layer (recipes/gpu_speed.toml [fit]; 0, 0.1, … 1), then α and the
batch shares, and prints the fit rows' least loss at each: the product's α (ROUTING_SKEW) and
per-layer share are the pair with the least (1.5 and 0.7, 2026-12-07).

    .venv/bin/python -m bench.concurrency_published [--write] [--json FILE] [--rows] [--skews] [--layer-shares]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from tierlocal.catalog import _read_compact, gpu_cards, load_published_rows, recipes_dir
from tierlocal.fit.concurrency import batch_costs
from tierlocal.fit.device_speed import DeviceSpeed
from tierlocal.fit.estimate import RunRequest
from tierlocal.fit.gpu_speed import fit_cards
from tierlocal.fit.model import ModelSpec, model_spec
from tierlocal.fit.routing import ROUTING_SKEW
from tierlocal.fit.speed import bound_speed
from tierlocal.gpu_figures import gpu_speed_for

GRID = [round(0.02 * 1.1**step, 4) for step in range(60)]
SKEWS = [round(0.1 * step, 1) for step in range(21)]
LAYER_SHARES = [round(0.1 * step, 1) for step in range(11)]
HOST = bound_speed("host CPU", 100_000_000_000, "sampling only")


def _rows() -> list[dict[str, object]]:
    data = tomllib.loads((recipes_dir() / "batched_bench.toml").read_text())
    return [row for row in data["row"] if row["use"] in ("fit", "test")]


def _spec(header: str, cache: dict[str, ModelSpec]) -> ModelSpec:
    if header not in cache:
        cache[header] = model_spec(list(_read_compact(f"{header}.json")))
    return cache[header]


def _predict(row: dict[str, object], spec: ModelSpec, gpu: DeviceSpeed, share: float, skew: float = ROUTING_SKEW) -> tuple[float, float]:
    """Aggregate decode tokens/s at the row's B, and B × one sequence's (the single-stream figure),
    the routers skewed by ``skew``."""
    b, pp, tg = int(row["b"]), int(row["pp"]), int(row["tg"])  # type: ignore[call-overload]
    request = RunRequest(ctx=(pp + tg) * b, parallel=b, ngl=spec.n_layer + 1, flash_attn=True)
    speeds = {"host": HOST, "gpu": replace(gpu, batch_flops_share=share)}
    costs = batch_costs(spec, request, speeds, prompt=pp, depth=pp + tg // 2)
    assert costs is not None
    costs = replace(costs, routing_skew=skew)
    return b / costs.decode_step_s(b), b / costs.decode_step_s(1)


def _fit(
    rows: list[dict[str, object]], specs: dict[str, ModelSpec], gpus: dict[str, DeviceSpeed], skew: float = ROUTING_SKEW
) -> tuple[dict[str, float], float]:
    """Each backend's batch share at routing skew ``skew``: the grid value with the least squared
    log error on its fit rows; and the fit rows' summed loss at those shares."""

    def loss(mine: list[dict[str, object]], share: float) -> float:
        return sum(
            math.log(_predict(row, specs[str(row["header"])], gpus[str(row["gpu"])], share, skew)[0] / float(row["s_tg"])) ** 2  # type: ignore[arg-type]
            for row in mine
        )

    fit = [row for row in rows if row["use"] == "fit"]
    shares, total = {}, 0.0
    for backend in sorted({str(row["backend"]) for row in fit}):
        mine = [row for row in fit if row["backend"] == backend]
        shares[backend] = min(GRID, key=lambda share, mine=mine: loss(mine, share))  # type: ignore[misc]
        total += loss(mine, shares[backend])
    return shares, total


def _errors(
    rows: list[dict[str, object]], specs: dict[str, ModelSpec], gpus: dict[str, DeviceSpeed], shares: dict[str, float], skew: float
) -> dict[str, list[float]]:
    """|predicted ÷ published − 1| of aggregate decode, per kind of row (``fit``, ``test``)."""
    fallback = statistics.median(shares.values())
    errors: dict[str, list[float]] = {"fit": [], "test": []}
    for row in rows:
        share = shares.get(str(row["backend"]), fallback)
        predicted = _predict(row, specs[str(row["header"])], gpus[str(row["gpu"])], share, skew)[0]
        errors[str(row["use"])].append(abs(predicted / float(row["s_tg"]) - 1))  # type: ignore[arg-type]
    return errors


def _skews(rows: list[dict[str, object]], specs: dict[str, ModelSpec], gpus: dict[str, DeviceSpeed]) -> None:
    """Per routing skew α: the shares refitted, the fit rows' loss, and each kind of row's error."""
    print("\nα     fit loss  shares                          fit median/worst  test median/worst")
    for skew in SKEWS:
        shares, total = _fit(rows, specs, gpus, skew)
        errors = _errors(rows, specs, gpus, shares, skew)
        shown = ", ".join(f"{backend} {share:.3f}" for backend, share in shares.items())
        fit, test = errors["fit"], errors["test"]
        print(
            f"{skew:<5} {total:8.3f}  {shown:30}  {statistics.median(fit):6.1%} / {max(fit):5.1%}   {statistics.median(test):6.1%} / {max(test):5.1%}"
        )


def _layer_shares(rows: list[dict[str, object]], specs: dict[str, ModelSpec]) -> None:
    """Per share of the GPU overhead paid per layer (tierlocal/fit/gpu_speed.py overhead_scale):
    the cards refitted with it, then α and the batch shares refitted; the fit rows' least loss and
    each kind of row's error there."""
    print("\nper layer  α     fit loss  fit median/worst  test median/worst")
    published, cards = load_published_rows(), gpu_cards()
    for layer_share in LAYER_SHARES:
        fitted = fit_cards(published, cards, layer_share)
        gpus = {name: speed for name in {str(row["gpu"]) for row in rows} if (speed := gpu_speed_for(name, None, fitted)) is not None}
        shares, total, skew = min(((*_fit(rows, specs, gpus, skew), skew) for skew in SKEWS), key=lambda result: result[1])
        errors = _errors(rows, specs, gpus, shares, skew)
        fit, test = errors["fit"], errors["test"]
        print(
            f"{layer_share:<9}  {skew:<5} {total:8.3f}  {statistics.median(fit):6.1%} / {max(fit):5.1%}   "
            f"{statistics.median(test):6.1%} / {max(test):5.1%}"
        )


def _summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no rows"
    return f"{label}: {len(errors)} rows, median |error| {statistics.median(errors):.0%}, worst {max(errors):.0%}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the fitted shares into recipes/batched_bench.toml's [fit]")
    parser.add_argument("--rows", action="store_true", help="print every row, not only the summary")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--skews", action="store_true", help="also refit at each routing skew α and show what it does to both kinds of rows")
    parser.add_argument(
        "--layer-shares", action="store_true", help="also refit the GPUs at each share of their overhead paid per layer, then α and the shares"
    )
    args = parser.parse_args(argv)
    rows = _rows()
    specs = {str(row["header"]): _spec(str(row["header"]), {}) for row in rows}
    gpus = {}
    for name in {str(row["gpu"]) for row in rows}:
        speed = gpu_speed_for(name, None)
        if speed is None:
            print(f"no speed figures for {name}", file=sys.stderr)
            return 2
        gpus[name] = speed
    shares, _ = _fit(rows, specs, gpus)
    fallback = statistics.median(shares.values())
    print("fitted batch FLOP share per backend:", {backend: round(share, 3) for backend, share in shares.items()}, f"(others: {fallback:.3f})")
    results = []
    for row in rows:
        share = shares.get(str(row["backend"]), fallback)
        predicted, single = _predict(row, specs[str(row["header"])], gpus[str(row["gpu"])], share)
        results.append(
            {**{k: row[k] for k in ("use", "gpu", "header", "pp", "tg", "b", "s_tg", "source")}, "predicted": predicted, "single_stream": single}
        )
    if args.rows:
        head = f"\n{'use':4} {'gpu':17} {'model':24} {'pp':>5} {'b':>3} | {'S_TG published':>14} {'predicted':>9} {'ratio':>6}"
        print(head + f" | {'B x 1-stream':>12} {'ratio':>6}")
        for r in results:
            print(
                f"{r['use']:4} {r['gpu']:17} {r['header']:24} {r['pp']:>5} {r['b']:>3} | {r['s_tg']:>14} {r['predicted']:9.1f} "
                f"{r['predicted'] / r['s_tg']:6.2f} | {r['single_stream']:12.1f} {r['single_stream'] / r['s_tg']:6.2f}"
            )
    print()
    for use in ("fit", "test"):
        mine = [r for r in results if r["use"] == use]
        print(_summary(f"{use} rows, aggregate decode", [abs(r["predicted"] / r["s_tg"] - 1) for r in mine]))
        print(_summary(f"{use} rows, B × single stream", [abs(r["single_stream"] / r["s_tg"] - 1) for r in mine]))
        for header in sorted({r["header"] for r in mine}):
            errors = [abs(r["predicted"] / r["s_tg"] - 1) for r in mine if r["header"] == header]
            print("   ", _summary(header, errors))
    if args.skews:
        _skews(rows, specs, gpus)
    if args.layer_shares:
        _layer_shares(rows, specs)
    if args.write:
        path = recipes_dir() / "batched_bench.toml"
        table = ", ".join(f"{backend} = {share}" for backend, share in sorted(shares.items()))
        text = path.read_text()
        start = text.index("batch_flops_share = ")
        end = text.index("\n", start)
        path.write_text(text[:start] + "batch_flops_share = { " + table + " }" + text[end:])
        print(f"written to {path}")
    if args.json:
        args.json.write_text(json.dumps({"shares": shares, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

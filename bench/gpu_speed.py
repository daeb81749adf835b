"""GPU speed: tierlocal's estimate beside published llama-bench results it was not fitted on,
and beside LlamaFit's and llmfit's estimates for the same model on the same card.

The rows are recipes/gpu_speed.toml's held-out ones (``use = "test"``; ``--all`` adds the
fitted rows, which only show the fit's residual). Each tool is asked as its user would ask it
(bench/gpu_speed_tools.py): tierlocal through ``tierlocal check ENTRY --gpu CARD --json``.
Published tg rows are at depth 0 and tierlocal quotes decode at 512 tokens of context: the KV
read that adds is ~1% of an 8B model's weights.

Peers run from venvs of their own, never our dependency (install: ``python3 -m venv
/tmp/peer-llamafit && /tmp/peer-llamafit/bin/pip install llamafit==0.1.1``, the same for
``llmfit==1.1.17``). LlamaFit is given each card as a hardware profile written here; llmfit
reads a GPU from ``nvidia-smi`` alone, so a stand-in ``nvidia-smi`` first on its PATH prints the
card's real name and memory in nvidia-smi's CSV form (an Apple chip: a /proc/cpuinfo of its
own, bind-mounted in a private mount namespace, which needs root). A peer that does not know
the model answers ``-``; one that does not know the card answers with its fallback, marked.

    .venv/bin/python -m bench.gpu_speed [--llamafit EXE] [--llmfit EXE] [--all] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

from bench.gpu_speed_tools import Figure, llamafit_figure, llmfit_figure, tierlocal_figure
from tierlocal.catalog import load_published_rows
from tierlocal.fit.gpu_speed import PublishedRow


def _ratio(figure: Figure, row: PublishedRow) -> float | None:
    return None if figure.tokens_per_s is None else figure.tokens_per_s / row.tokens_per_s


def summary(ratios: list[float | None]) -> dict[str, object]:
    """Median and worst |error|, rows within ±25%, rows answered."""
    errors = sorted(abs(r - 1) for r in ratios if r is not None)
    if not errors:
        return {"answered": 0}
    return {
        "answered": len(errors),
        "median_ratio": round(statistics.median(r for r in ratios if r is not None), 3),
        "median_abs_error": round(statistics.median(errors), 3),
        "worst_abs_error": round(errors[-1], 3),
        "within_25_percent": sum(e <= 0.25 for e in errors),
    }


def _line(name: str, stats: dict[str, object]) -> str:
    if not stats["answered"]:
        return f"{name} answered none"
    return (
        f"{name} answered {stats['answered']}: median {stats['median_ratio']}×, median |error| {float(stats['median_abs_error']):.1%}, "  # type: ignore[arg-type]
        f"worst {float(stats['worst_abs_error']):.1%}, within ±25% {stats['within_25_percent']}"  # type: ignore[arg-type]
    )


def print_summaries(table: list[dict[str, Any]], tools: list[str]) -> dict[str, dict[str, object]]:
    """Per kind (decode, prefill): each tool over every row; then for each peer, tierlocal on
    the same rows the peer answered, and the peer on the cards its own table knows."""
    summaries: dict[str, dict[str, object]] = {}
    for kind, prefix in (("decode", "tg"), ("prefill", "pp")):
        kept = [entry for entry in table if str(entry["test"]).startswith(prefix)]
        print(f"\n{kind}: {len(kept)} rows on {len({entry['gpu'] for entry in kept})} cards (estimate ÷ published)")
        for name in tools:
            summaries[f"{kind}:{name}"] = stats = summary([entry[name]["ratio"] for entry in kept])
            print(f"  {_line(name, stats)}")
        for peer in tools[1:]:
            answered = [entry for entry in kept if entry[peer]["ratio"] is not None]
            if not answered:
                continue
            ours = summary([entry["tierlocal"]["ratio"] for entry in answered])
            known = summary([entry[peer]["ratio"] for entry in answered if "card not in its table" not in entry[peer]["via"]])
            summaries[f"{kind}:tierlocal on {peer}'s rows"], summaries[f"{kind}:{peer} on cards it knows"] = ours, known
            print(f"    on the rows {peer} answered, {_line('tierlocal', ours)}")
            print(f"    on the cards {peer}'s own table knows, {_line(peer, known)}")
    return summaries


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llamafit", help="LlamaFit's executable (its own venv)")
    parser.add_argument("--llmfit", help="llmfit's executable (its own venv)")
    parser.add_argument("--all", action="store_true", help="the fitted rows too (their residual, not accuracy)")
    parser.add_argument("--json", help="write the rows and summaries here")
    args = parser.parse_args(argv)

    tools: dict[str, Callable[[PublishedRow], Figure]] = {"tierlocal": tierlocal_figure}
    if args.llamafit:
        tools["LlamaFit"] = lambda row: llamafit_figure(args.llamafit, row)
    if args.llmfit:
        tools["llmfit"] = lambda row: llmfit_figure(args.llmfit, row)
    rows = [row for row in load_published_rows() if args.all or row.use == "test"]
    rows.sort(key=lambda row: (not row.test.startswith("tg"), row.gpu, row.model, row.test))
    table: list[dict[str, Any]] = []
    header = f"{'card':24} {'model':27} {'test':6} {'published':>10} " + " ".join(f"{name:>18}" for name in tools)
    print(header)
    print("-" * len(header))
    for row in rows:
        figures = {name: tool(row) for name, tool in tools.items()}
        cells = []
        for figure in figures.values():
            ratio = _ratio(figure, row)
            cells.append(f"{figure.tokens_per_s:9,.1f} ({ratio:4.2f}×)" if figure.tokens_per_s is not None and ratio is not None else f"{'-':>18}")
        print(f"{row.gpu:24} {row.model:27} {row.test:6} {row.tokens_per_s:10,.1f} " + " ".join(f"{cell:>18}" for cell in cells))
        table.append(
            {
                "gpu": row.gpu,
                "model": row.model,
                "test": row.test,
                "use": row.use,
                "published": row.tokens_per_s,
                "source": row.source,
                **{name: {"tokens_per_s": figure.tokens_per_s, "ratio": _ratio(figure, row), "via": figure.via} for name, figure in figures.items()},
            }
        )
    summaries = print_summaries(table, list(tools))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": table, "summary": summaries}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

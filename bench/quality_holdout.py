"""The quality ranking against independent aggregates it was never fitted on (issue 51): the
catalog's chat scores (recipes/quality.toml through tierlocal/plan/quality.py) beside each
aggregate of recipes/holdout.toml, as Spearman's rank correlation over the models both rank and
among the ten the chat score ranks highest of those.

A model that both thinks and answers directly has two values in an aggregate that lists both
variants; the one compared is the variant in the mode most of the model's own figures are in
(``--variant best`` takes the higher instead); a model whose figures are all in a mode the
aggregate has no variant of is left out (the Open LLM Leaderboard's few-shot runs have no
thinking: QwQ and the R1 distills are published thinking only). Two rows of one model (Open LLM Leaderboard v2's
precisions) are averaged.

    .venv/bin/python -m bench.quality_holdout [--variant mode|best] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from collections import Counter

from tierlocal.catalog import load_quality, recipes_dir
from tierlocal.recommendation import catalog_quality

TOP = 10


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank (as Spearman's rho takes them)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    found = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            found[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return found


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the ranks (None under three pairs)."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy) if sx and sy else None


def _held_back(variant: str) -> dict[str, dict[str, float]]:
    """aggregate → model → the value compared (module docstring)."""
    data = tomllib.loads((recipes_dir() / "holdout.toml").read_text())
    own_modes = Counter((figure.model, figure.mode) for figure in load_quality().figures)
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for value in data["value"]:
        rows.setdefault((value["aggregate"], value["model"]), {}).setdefault(value["mode"], []).append(float(value["value"]))
    found: dict[str, dict[str, float]] = {}
    for (aggregate, model), by_mode in rows.items():
        # Like with like: a variant in a mode the model has no figure in is not its score's peer
        # (the Leaderboard's few-shot runs without thinking, of models published thinking only).
        means = {mode: statistics.fmean(values) for mode, values in by_mode.items() if own_modes[(model, mode)]}
        if not means:
            continue
        if variant == "best" or len(means) == 1:
            chosen = max(means.values())
        else:
            mode = max(means, key=lambda m: (own_modes[(model, m)], m == "thinking"))
            chosen = means[mode]
        found.setdefault(aggregate, {})[model] = chosen
    return found


def compare(variant: str) -> list[dict[str, object]]:
    scores = {model: tasks["chat"].score for model, tasks in catalog_quality().items() if "chat" in tasks}
    results = []
    for aggregate, values in _held_back(variant).items():
        shared = sorted((model for model in values if model in scores), key=lambda m: -scores[m])
        top = shared[:TOP]
        results.append(
            {
                "aggregate": aggregate,
                "models": len(shared),
                "rho": spearman([scores[m] for m in shared], [values[m] for m in shared]),
                "rho_top": spearman([scores[m] for m in top], [values[m] for m in top]),
                "top": [(m, round(scores[m], 1), values[m]) for m in top],
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=("mode", "best"), default="mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = compare(args.variant)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        rho, top = result["rho"], result["rho_top"]
        print(f"{result['aggregate']}: {result['models']} models, rho {rho:.3f} overall, {top:.3f} among our top {TOP}")  # type: ignore[str-format]
        for model, score, value in result["top"]:  # type: ignore[attr-defined]
            print(f"    {model:24} chat {score:5.1f}   {value:g}")


if __name__ == "__main__":
    main()

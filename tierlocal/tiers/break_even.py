"""Measured usage against renting: for a hosted frontier model (Kimi K3), the volume the
gateway recorded, extrapolated to a month, priced at the API and against the smallest cluster
that serves the model (recipes/, dated). Used by ``tierlocal usage``."""

from __future__ import annotations

from collections.abc import Mapping

from ..catalog import find_frontier, load_precisions, load_rental_defaults
from .arithmetic import ApiPrices
from .facts import gpu_options, resolve_model_facts
from .plan import PlanOptions, build_plan

__all__ = ["break_even_verdicts"]

#: Shortest stretch of measured usage extrapolated to a month, in seconds.
_MIN_MEASURED_S = 3600.0


def break_even_verdicts(
    totals: Mapping[str, Mapping[str, float | int]], prices_by_model: Mapping[str, ApiPrices], since: float, now: float
) -> dict[str, dict[str, object]]:
    """For each hosted frontier model in ``totals``: the measured volume extrapolated to a month,
    what the API costs at that volume, what renting the smallest cluster that serves the model
    costs, and which is cheaper (tier arithmetic from recipes/, dated). ``totals`` per model:
    prompt, cached and completion tokens; ``since``/``now`` in seconds since the epoch."""
    verdicts: dict[str, dict[str, object]] = {}
    for model, row in totals.items():
        prices = prices_by_model.get(model)
        tokens = int(row["prompt_tokens"]) + int(row["completion_tokens"])
        if find_frontier(model) is None or prices is None or tokens == 0:
            continue
        measured_s = max(now - since, _MIN_MEASURED_S)
        per_month = tokens * (30 * 86400) / measured_s
        rental = load_rental_defaults()
        options = PlanOptions(
            gpus=gpu_options(())[0],
            rate_usd_per_gpu_hour=rental.default,
            input_share=int(row["prompt_tokens"]) / tokens,
            cache_hit=int(row["cached_tokens"]) / int(row["prompt_tokens"]) if row["prompt_tokens"] else 0.0,
            bandwidths_bytes_per_s=(),
            tokens_per_month=per_month,
            api_prices=prices,
        )
        plan = build_plan(resolve_model_facts(model), options, load_precisions())
        if plan.volume_verdict is None or plan.chosen is None or plan.break_even is None:
            continue
        verdicts[model] = {
            **plan.volume_verdict,
            "measured_seconds": round(measured_s),
            "rent": f"{plan.chosen.count}× {plan.chosen.gpu} always on at ${rental.default:.2f}/GPU-h ({rental.source}, {rental.date})",
            "break_even_tokens_per_month": plan.break_even.blended_tokens_per_month,
        }
    return verdicts

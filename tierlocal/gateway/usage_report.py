"""What ``tierlocal usage --json`` prints and the dashboard's spend page shows: one report, built
once, from the store's totals and the config (one source of truth for both)."""

from __future__ import annotations

import time

from .config import GatewayConfig
from .store import Store, period_start

__all__ = ["usage_report", "PERIODS"]

#: Periods a report may cover: from the start of the current day/week/month (UTC), or everything.
PERIODS = ("day", "week", "month", "all")
_COLUMNS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd")


def usage_report(config: GatewayConfig, store: Store, period: str, now: float | None = None) -> dict[str, object]:
    """Requests, tokens and spend (USD) per user, per model and per target since the start of
    ``period``; the same summed for local and hosted targets; each budgeted user's spend in
    their own budget period (recorded plus held) against the budget; and, for hosted frontier
    models, the break-even verdict at the measured volume. ``since`` in seconds since the epoch."""
    moment = time.time() if now is None else now
    since = 0.0 if period == "all" else period_start(period, moment)
    totals = store.totals(since)
    if period == "all":
        since = store.first_usage_time() or moment
    from ..tiers.break_even import break_even_verdicts  # recipes and the hub client: only for this report

    verdicts = break_even_verdicts(totals["models"], config.prices, since, moment)
    return {
        "period": period,
        "since": since,
        **totals,
        "by_kind": _by_kind(config, totals.get("targets", {})),
        "budgets": _budgets(config, store),
        "break_even": verdicts,
    }


def _by_kind(config: GatewayConfig, targets: dict[str, dict[str, float | int]]) -> dict[str, dict[str, float | int]]:
    """Target rows summed into local, hosted and — for requests no target answered, or a target
    no longer in the config — "none" and "other"."""
    kinds = {target.label: ("hosted" if target.hosted else "local") for route in config.routes for target in route.targets}
    result: dict[str, dict[str, float | int]] = {}
    for label, row in targets.items():
        kind = "none" if not label else kinds.get(label, "other")
        summed = result.setdefault(kind, dict.fromkeys(_COLUMNS, 0))
        for column in _COLUMNS:
            summed[column] += row[column]
    for row in result.values():
        row["cost_usd"] = round(float(row["cost_usd"]), 6)
    return result


def _budgets(config: GatewayConfig, store: Store) -> dict[str, dict[str, object]]:
    budgets: dict[str, dict[str, object]] = {}
    for user in config.users:
        if user.budget_usd is None:
            continue
        spent = store.spent(user.name, user.budget_period)
        budgets[user.name] = {
            "budget_usd": user.budget_usd,
            "budget_period": user.budget_period,
            "spent_usd": round(spent, 6),
            "left_usd": round(max(user.budget_usd - spent, 0.0), 6),
        }
    return budgets

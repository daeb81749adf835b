"""What ``tierlocal usage --json`` prints and the dashboard's spend page shows: one report, built
once, from the store's totals and the config (one source of truth for both)."""

from __future__ import annotations

import time

from ..tiers.arithmetic import ApiPrices
from .config import TIER_NAMES, GatewayConfig, Route
from .pricing import Usage, cost_usd
from .store import Store, period_start

__all__ = ["usage_report", "PERIODS"]

#: Periods a report may cover: from the start of the current day/week/month (UTC), or everything.
PERIODS = ("day", "week", "month", "all")


def usage_report(config: GatewayConfig, store: Store, period: str, now: float | None = None) -> dict[str, object]:
    """Requests, tokens and spend (USD) per user, per model and per target since the start of
    ``period``; the same per tier that answered (your cluster, local, hosted API); each
    budgeted user's spend in their own budget period (recorded plus held) against the budget;
    each cluster of your own against what its tokens would have cost on the API; what each local
    engine's tokens would have cost there; and, for
    hosted frontier models, the break-even verdict at the measured volume. ``since`` in
    seconds since the epoch."""
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
        "by_tier": _by_tier(totals.get("tiers", {})),
        "clusters": _clusters(config, totals.get("targets", {}), since, moment),
        "local": _local(config, totals.get("targets", {})),
        "budgets": _budgets(config, store),
        "break_even": verdicts,
    }


def _by_tier(tiers: dict[str, dict[str, float | int]]) -> dict[str, dict[str, object]]:
    """The recorded tiers' rows ("1", "2", "3"; "none" where no target answered or the row
    predates the tier being recorded), each with the tier's name."""
    result: dict[str, dict[str, object]] = {}
    for tier, row in tiers.items():
        name = TIER_NAMES.get(int(tier)) if tier.isdigit() else None
        result[tier if name else "none"] = {"name": name or "no tier recorded", **row}
    return result


def _route_prices(config: GatewayConfig, route: Route) -> tuple[str, ApiPrices | None]:
    """The API a route's tokens are priced at: its hosted target's model, else the route's own."""
    hosted = next((t for t in route.targets if t.tier == 3), None)
    for model in (hosted.model if hosted else None, route.model):
        if model is not None and model in config.prices:
            return model, config.prices[model]
    return (hosted.model if hosted else route.model), None


def _local(config: GatewayConfig, targets: dict[str, dict[str, float | int]]) -> dict[str, dict[str, object]]:
    """For each local engine (tier 2) that answered this period: the routes that name it, its
    requests and tokens, and what they would have cost on the first such route's hosted API
    (``api_usd`` at ``api_model``'s prices; None: the route has no price)."""
    result: dict[str, dict[str, object]] = {}
    routes: dict[str, list[str]] = {}  # the same list object as each entry's "routes"
    for route in config.routes:
        api_model, prices = _route_prices(config, route)
        for target in route.targets:
            row = targets.get(target.label)
            if target.tier != 2 or not row:
                continue
            if target.label in routes:
                routes[target.label].append(route.model)
                continue
            routes[target.label] = [route.model]
            usage = Usage(int(row.get("prompt_tokens", 0)), int(row.get("cached_tokens", 0)), int(row.get("completion_tokens", 0)))
            api_usd = cost_usd(prices, usage) if prices else None
            result[target.label] = {
                "routes": routes[target.label],
                "requests": int(row.get("requests", 0)),
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.cached_tokens,
                "completion_tokens": usage.completion_tokens,
                "api_model": api_model,
                "api_usd": None if api_usd is None else round(api_usd, 6),
            }
    return result


def _clusters(config: GatewayConfig, targets: dict[str, dict[str, float | int]], since: float, now: float) -> dict[str, dict[str, object]]:
    """For each cluster of your own (a tier-1 target with ``usd_per_hour``): what it cost over
    the period, always on from ``since`` to ``now`` (seconds since the epoch), against what the
    tokens it answered would have cost on the route's hosted API; and the tokens per hour at
    which the two cost the same, at this period's mix of input, cached input and output."""
    result: dict[str, dict[str, object]] = {}
    for route in config.routes:
        _, prices = _route_prices(config, route)
        for target in route.targets:
            if target.tier != 1 or target.usd_per_hour is None:
                continue
            row = targets.get(target.label, {})
            usage = Usage(int(row.get("prompt_tokens", 0)), int(row.get("cached_tokens", 0)), int(row.get("completion_tokens", 0)))
            hours = max(now - since, 0.0) / 3600
            cluster_usd = target.usd_per_hour * hours
            tokens = usage.prompt_tokens + usage.completion_tokens
            api_usd = cost_usd(prices, usage) if prices else None
            entry: dict[str, object] = {
                "route": route.model,
                "hours": round(hours, 6),
                "usd_per_hour": target.usd_per_hour,
                "cluster_usd": round(cluster_usd, 6),
                "requests": int(row.get("requests", 0)),
                "tokens": tokens,
                "api_usd": None if api_usd is None else round(api_usd, 6),
                "cheaper": None if api_usd is None else ("cluster" if cluster_usd < api_usd else "api"),
                "break_even_tokens_per_hour": round(target.usd_per_hour / (api_usd / tokens)) if api_usd and tokens else None,
            }
            result[target.label] = entry
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

"""The gateway file's ``[[users]]``: one user's limits and budget, and the check of one entry."""

from __future__ import annotations

from dataclasses import dataclass

from .config_values import USER_KEYS, as_table, config_error, flag, name_problem, positive_int

__all__ = ["BUDGET_PERIODS", "User", "parse_user"]

#: Budget periods a user may have.
BUDGET_PERIODS = ("day", "week", "month")


@dataclass(frozen=True)
class User:
    """A gateway user: limits per minute (None: unlimited) and a budget in USD per period."""

    #: The user's name (unique; no control characters): what `gateway keys add NAME` names.
    name: str
    #: Requests admitted per sliding minute (429 with Retry-After above it); none: unlimited.
    requests_per_minute: int | None = None
    #: Tokens (prompt and completion) per sliding minute; none: unlimited.
    tokens_per_minute: int | None = None
    #: Requests in flight at once; none: unlimited.
    concurrent_requests: int | None = None
    #: USD the user may spend on tier-3 targets per budget_period (≥ 0); none: no budget.
    budget_usd: float | None = None
    #: The budget's period: day, week or month (calendar, UTC).
    budget_period: str = "month"
    #: Sees every user's spend on the dashboard (others see their own).
    admin: bool = False


def parse_user(raw: object, source: str, where: str) -> User:
    """One [[users]] entry (``where`` names it in errors).

    Raises:
        UsageError: an unknown key, or a value that is not what it must be.
    """
    table = as_table(raw, source, where)
    unknown = set(table) - USER_KEYS
    if unknown:
        raise config_error(source, f"{where}.{sorted(unknown)[0]}", "unknown key", f"[[users]] has: {', '.join(sorted(USER_KEYS))}")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise config_error(source, f"{where}.name", "is missing", "each [[users]] needs a name")
    if problem := name_problem(name):
        raise config_error(source, f"{where}.name", problem, "use letters, digits and punctuation")
    budget = table.get("budget_usd")
    if budget is not None and (not isinstance(budget, int | float) or isinstance(budget, bool) or budget < 0):
        raise config_error(source, f"{where}.budget_usd", f"must be a number of dollars ≥ 0, not {budget!r}", "or leave it out for no budget")
    period = table.get("budget_period", "month")
    if period not in BUDGET_PERIODS:
        raise config_error(source, f"{where}.budget_period", f"{period!r} is not a period", f"one of: {', '.join(BUDGET_PERIODS)}")
    return User(
        name,
        positive_int(table.get("requests_per_minute"), source, f"{where}.requests_per_minute"),
        positive_int(table.get("tokens_per_minute"), source, f"{where}.tokens_per_minute"),
        positive_int(table.get("concurrent_requests"), source, f"{where}.concurrent_requests"),
        None if budget is None else float(budget),
        str(period),
        flag(table.get("admin", False), source, f"{where}.admin"),
    )

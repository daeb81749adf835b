"""How a plan's table of users at once reads on a terminal (``check SOURCE``, ``bench --users``):
each user's decode speed, what they add up to and the wait for the first token, per user count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from ..fit.concurrency import USERS_PROMPT, UsersSpeed

__all__ = ["render_users", "users_table_view"]


def users_table_view(rows: Sequence[UsersSpeed], *, asked: int | None = None, min_speed: float | None = None) -> Table:
    """One row per user count: per-user decode, aggregate, first token p50/p95, queued users."""
    prompt = rows[0].prompt_tokens if rows else USERS_PROMPT
    table = Table(title=f"Users at once ({rows[0].slots if rows else '?'} slot(s), {prompt}-token prompts arriving together)", title_justify="left")
    for column in ("users", "each user, tok/s", "all users, tok/s", "first token p50", "p95", "waiting for a slot", "basis"):
        table.add_column(column, justify="right")
    for row in rows:
        slow = min_speed is not None and row.per_user_decode_tokens_per_s < min_speed
        mark = "bold" if row.users == asked else ""
        table.add_row(
            f"[{mark}]{row.users}[/{mark}]" if mark else str(row.users),
            f"[red]{row.per_user_decode_tokens_per_s:,.1f}[/red]" if slow else f"{row.per_user_decode_tokens_per_s:,.1f}",
            f"{row.aggregate_decode_tokens_per_s:,.1f}",
            _seconds(row.first_token_p50_s),
            _seconds(row.first_token_p95_s),
            str(row.queued) if row.queued else "-",
            row.basis,
        )
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} s"


def render_users(
    out: Console, rows: Sequence[UsersSpeed], *, asked: int | None, min_speed: float | None, single: Mapping[str, float] | None = None
) -> None:
    """The table and, for the users asked, a line against the per-user floor (``min_speed``);
    while no row is measured, how to measure them."""
    if not rows:
        return
    out.print(users_table_view(rows, asked=asked, min_speed=min_speed))
    if all(row.basis != "measured" for row in rows):
        out.print(
            f"Estimated ({rows[0].basis}); `tierlocal bench --users 1,2,4` on the running serve measures them, and later plans use what it measured."
        )
    row = next((row for row in rows if row.users == asked), None)
    if row is None:
        return
    floor = ""
    if min_speed is not None:
        floor = f" — {'meets' if row.per_user_decode_tokens_per_s >= min_speed else 'misses'} the per-user floor of {min_speed:g} tok/s"
    wait = (
        f"first token after ~{row.first_token_p50_s:,.1f} s (p95 {row.first_token_p95_s:,.1f} s)"
        if row.first_token_p50_s is not None and row.first_token_p95_s is not None
        else "first token not estimated (no prefill figure for this CPU: `tierlocal hw --calibrate`)"
    )
    each = f"~{row.per_user_decode_tokens_per_s:,.1f} tok/s each, ~{row.aggregate_decode_tokens_per_s:,.0f} in all"
    out.print(f"{row.users} users at once: {each}, {wait}{floor}.")

"""A plan's users table with what `tierlocal bench --users` measured for the same model file,
engine build and device put in its place: measured rows as measured, the others scaled by the
measured/estimated ratio at the nearest count both have; or, with only a single-stream
measurement, every row scaled to it. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from .concurrency import UsersSpeed

__all__ = ["with_measured", "anchored"]


def with_measured(rows: Sequence[UsersSpeed], measured: Mapping[str, object] | None) -> tuple[UsersSpeed, ...]:
    """``rows`` with what `tierlocal bench --users` measured in their place (basis ``measured``),
    when it measured the same slots and prompt length (``measured``: its record's ``slots``,
    ``prompt_tokens`` and ``users`` rows); counts it measured that the table lacks are added, and
    the rows it did not measure are scaled by the measured/estimated ratios at the nearest count
    both have (basis ``derived``)."""
    if not rows or not measured or measured.get("slots") != rows[0].slots or measured.get("prompt_tokens") != rows[0].prompt_tokens:
        return tuple(rows)
    points = measured.get("users")
    estimated = {row.users: row for row in rows}
    table = dict(estimated)
    for point in points if isinstance(points, list) else []:
        values = [point.get(name) if isinstance(point, dict) else None for name in _MEASURED_FIELDS]
        if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in values):
            continue
        users, each, together, p50, p95 = (float(value) for value in values)  # type: ignore[arg-type]
        count = int(users)
        table[count] = UsersSpeed(count, rows[0].slots, each, together, p50, p95, rows[0].prompt_tokens, "measured", max(count - rows[0].slots, 0))
    anchors = [count for count in estimated if table[count].basis == "measured"]
    if anchors:
        for count, row in estimated.items():
            if table[count].basis != "measured":
                anchor = min(anchors, key=lambda other: (abs(other - min(count, row.slots)), -other))
                table[count] = _scaled(row, estimated[anchor], table[anchor])
    return tuple(table[count] for count in sorted(table))


def _scaled(row: UsersSpeed, estimated: UsersSpeed, measured: UsersSpeed) -> UsersSpeed:
    """``row`` scaled by ``measured`` ÷ ``estimated`` (decode and first token apart)."""
    speed = measured.per_user_decode_tokens_per_s / estimated.per_user_decode_tokens_per_s if estimated.per_user_decode_tokens_per_s else 1.0
    wait = measured.first_token_p50_s / estimated.first_token_p50_s if measured.first_token_p50_s and estimated.first_token_p50_s else None
    return replace(
        row,
        per_user_decode_tokens_per_s=row.per_user_decode_tokens_per_s * speed,
        aggregate_decode_tokens_per_s=row.aggregate_decode_tokens_per_s * speed,
        first_token_p50_s=row.first_token_p50_s * wait if wait and row.first_token_p50_s is not None else row.first_token_p50_s,
        first_token_p95_s=row.first_token_p95_s * wait if wait and row.first_token_p95_s is not None else row.first_token_p95_s,
        basis="derived",
    )


_MEASURED_FIELDS = ("users", "per_user_decode_tokens_per_s", "aggregate_decode_tokens_per_s", "first_token_p50_s", "first_token_p95_s")


def anchored(rows: Sequence[UsersSpeed], decode_ratio: float, prefill_ratio: float) -> tuple[UsersSpeed, ...]:
    """``rows`` scaled to a single-stream measurement (`tierlocal bench`): decode by the measured ÷
    estimated decode rate, first tokens by the estimated ÷ measured prefill rate (basis ``derived``);
    the model keeps the shape of the curve, the engine sets its scale."""
    return tuple(
        replace(
            row,
            per_user_decode_tokens_per_s=row.per_user_decode_tokens_per_s * decode_ratio,
            aggregate_decode_tokens_per_s=row.aggregate_decode_tokens_per_s * decode_ratio,
            first_token_p50_s=None if row.first_token_p50_s is None else row.first_token_p50_s * prefill_ratio,
            first_token_p95_s=None if row.first_token_p95_s is None else row.first_token_p95_s * prefill_ratio,
            basis="derived",
        )
        for row in rows
    )

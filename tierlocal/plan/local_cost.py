"""What a local token costs: the machine's price per hour over the tokens its users are given,
beside a hosted API's price per million output tokens, and the volume at which they break even.
Pure: the price, the users table and the API price come in as arguments."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..fit.concurrency import UsersSpeed
from ..published import RentalOffer

__all__ = ["LocalCost", "RentalOffer", "local_cost", "rental_price"]

SECONDS_PER_DAY = 86_400


def rental_price(card: str, gpus: int, offers: Sequence[RentalOffer]) -> tuple[float, str] | None:
    """A machine of ``gpus`` × ``card`` at the median on-demand price per GPU of its offers
    (USD per hour), and what that rests on; None: no offer."""
    mine = [offer for offer in offers if offer.card == card and offer.billing == "on-demand"]
    if not mine:
        return None
    per_gpu = statistics.median(offer.usd_per_gpu_hour for offer in mine)
    dates = sorted(offer.date for offer in mine)
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]}–{dates[-1]}"
    providers = ", ".join(sorted({offer.provider for offer in mine}))
    return per_gpu * gpus, f"the median on-demand price of {len(mine)} offer(s) of the {card} ({providers}; {span}; recipes/gpu_rental.toml)"


@dataclass(frozen=True)
class LocalCost:
    """The machine at ``usd_per_hour`` (``basis``: given, or the rental median): USD per million
    output tokens for each users row, the tokens per day the planned users are given at most, and
    against ``api_usd_per_million`` (output tokens) the tokens per day at which the machine costs
    the same as the API (None: no API price)."""

    usd_per_hour: float
    basis: str
    per_million: tuple[tuple[int, float], ...]
    users: int
    capacity_tokens_per_day: float
    api_usd_per_million: float | None = None
    break_even_tokens_per_day: float | None = None

    @property
    def cheaper(self) -> str | None:
        """``local`` when the planned users, kept busy, are given more than the break-even volume
        (the machine then costs less per token than the API), else ``api``; None: no API price."""
        if self.break_even_tokens_per_day is None:
            return None
        return "local" if self.capacity_tokens_per_day > self.break_even_tokens_per_day else "api"

    def to_json(self) -> dict[str, object]:
        return {
            "usd_per_hour": round(self.usd_per_hour, 4),
            "basis": self.basis,
            "usd_per_million_output_tokens": [{"users": users, "usd": round(usd, 4)} for users, usd in self.per_million],
            "users": self.users,
            "capacity_tokens_per_day": round(self.capacity_tokens_per_day),
            "api_usd_per_million_output_tokens": self.api_usd_per_million,
            "break_even_tokens_per_day": None if self.break_even_tokens_per_day is None else round(self.break_even_tokens_per_day),
            "cheaper": self.cheaper,
        }


def local_cost(rows: Sequence[UsersSpeed], users: int, usd_per_hour: float, basis: str, api_usd_per_million: float | None) -> LocalCost | None:
    """What a local output token costs at each users row (USD per million: the hour's price over
    the tokens all users are given in an hour), the capacity per day with ``users`` at once (the
    nearest row at or below), and the break-even against the API. None: no rows with a speed."""
    priced = [(row.users, usd_per_hour / (row.aggregate_decode_tokens_per_s * 3600) * 1e6) for row in rows if row.aggregate_decode_tokens_per_s > 0]
    if not priced:
        return None
    at = max((row for row in rows if row.users <= users), key=lambda row: row.users, default=rows[0])
    capacity = at.aggregate_decode_tokens_per_s * SECONDS_PER_DAY
    even = usd_per_hour * 24 / api_usd_per_million * 1e6 if api_usd_per_million else None
    return LocalCost(usd_per_hour, basis, tuple(priced), at.users, capacity, api_usd_per_million, even)

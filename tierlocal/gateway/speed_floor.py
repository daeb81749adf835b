"""Whether a local target is fast enough for one more user: a route's per-user floor
(``min_user_tokens_per_s``) and first-token limit (``max_first_token_s``) against the speed the
target's serve planned — or measured with ``tierlocal bench --users`` — at the users it would
have with this request (its requests in flight, plus one).

The gateway only looks the curve up (the serve's state file, :attr:`ServeState.users_curve`);
the concurrency model that made it lives in the estimator, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..serve.state import UsersPoint
from .config import Route

__all__ = ["LoadSpeed", "Shortfall", "speed_at", "shortfall", "engine_key", "BELOW_SPEED_FLOOR", "FIRST_TOKEN_OVER_LIMIT"]

#: The reasons a target passed over for speed is counted under (fallback metric, usage row).
BELOW_SPEED_FLOOR = "below_speed_floor"
FIRST_TOKEN_OVER_LIMIT = "first_token_over_limit"


@dataclass(frozen=True)
class LoadSpeed:
    """A target's speed with ``users`` at once: each user's decode (tokens/s), the median wait
    for the first token (seconds; None where the plan could not price prompts), and the basis
    (the curve row's own when it has a row for ``users``, else ``derived``, or ``bound``)."""

    users: int
    per_user_decode_tokens_per_s: float
    first_token_s: float | None
    basis: str

    def to_json(self) -> dict[str, object]:
        return {
            "users": self.users,
            "per_user_decode_tokens_per_s": round(self.per_user_decode_tokens_per_s, 2),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 3),
            "basis": self.basis,
        }


@dataclass(frozen=True)
class Shortfall:
    """Why a target is passed over for speed: the reason it is counted under, and the figures."""

    reason: str
    detail: str


def speed_at(curve: Sequence[UsersPoint], users: int) -> LoadSpeed | None:
    """The speed at ``users`` from a curve sorted by users: a row's own figures, linear between
    rows, and past the last row the same aggregate shared by more users (each user's decode falls
    as 1/users, the first-token wait grows as users). None: no curve."""
    if not curve:
        return None
    exact = next((point for point in curve if point.users == users), None)
    if exact is not None:
        return LoadSpeed(users, exact.per_user_decode_tokens_per_s, exact.first_token_p50_s, exact.basis)
    below = [point for point in curve if point.users < users]
    above = [point for point in curve if point.users > users]
    if not below:  # fewer users than the first row: that row, no faster
        first = above[0]
        return LoadSpeed(users, first.per_user_decode_tokens_per_s, first.first_token_p50_s, _basis(first, first))
    low = below[-1]
    if not above:
        scale = users / low.users
        first_token = None if low.first_token_p50_s is None else low.first_token_p50_s * scale
        return LoadSpeed(users, low.per_user_decode_tokens_per_s / scale, first_token, _basis(low, low))
    high = above[0]
    share = (users - low.users) / (high.users - low.users)
    decode = low.per_user_decode_tokens_per_s + share * (high.per_user_decode_tokens_per_s - low.per_user_decode_tokens_per_s)
    first_token = (
        None
        if low.first_token_p50_s is None or high.first_token_p50_s is None
        else low.first_token_p50_s + share * (high.first_token_p50_s - low.first_token_p50_s)
    )
    return LoadSpeed(users, decode, first_token, _basis(low, high))


def _basis(low: UsersPoint, high: UsersPoint) -> str:
    return "bound" if "bound" in (low.basis, high.basis) else "derived"


def shortfall(route: Route, speed: LoadSpeed | None) -> Shortfall | None:
    """Whether ``speed`` misses the route's per-user floor or first-token limit (None: it keeps
    both, the route sets neither, or the target has no curve — it is never passed over blind)."""
    if speed is None:
        return None
    floor, limit = route.min_user_tokens_per_s, route.max_first_token_s
    at = f"at {speed.users} user(s) ({speed.basis})"
    if floor is not None and speed.per_user_decode_tokens_per_s < floor:
        return Shortfall(BELOW_SPEED_FLOOR, f"{speed.per_user_decode_tokens_per_s:.1f} tok/s per user {at}, below the route's {floor:g}")
    if limit is not None and speed.first_token_s is not None and speed.first_token_s > limit:
        return Shortfall(FIRST_TOKEN_OVER_LIMIT, f"first token after {speed.first_token_s:.1f} s {at}, over the route's {limit:g} s")
    return None


def engine_key(url: str) -> tuple[str, int | None]:
    """(host, port) of an engine URL, ``localhost`` read as 127.0.0.1: how a target's base URL and
    a serve's state are matched."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return ("127.0.0.1" if host == "localhost" else host), parts.port

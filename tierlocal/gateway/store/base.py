"""What every gateway store holds and promises, whichever database keeps it: the records, the
key format and hashing, budget periods, and the Store protocol the server is written against.
Imports neither store, so both can import it."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from ..config import User

__all__ = [
    "KEY_PREFIX",
    "MAX_KEY_CHARS",
    "RESERVATION_TTL_S",
    "KeyInfo",
    "UsageRecord",
    "Reserve",
    "Settle",
    "BookOperation",
    "run_one_by_one",
    "SharedLimiter",
    "SharedTicket",
    "Store",
    "hash_key",
    "looks_like_key",
    "new_key",
    "period_start",
]

#: Every gateway key starts with this, so a leaked one is recognisable.
KEY_PREFIX = "tlk-"
#: Longest string ever looked up as a key (characters).
MAX_KEY_CHARS = 200
#: Seconds after which an unsettled reservation (its process died) stops counting.
RESERVATION_TTL_S = 15 * 60
#: Characters of a key that may be shown (``keys list``, revoking by prefix).
SHOWN_PREFIX_CHARS = 10


@dataclass(frozen=True)
class KeyInfo:
    """A stored key as it may be shown: its first characters, never the key. Times in seconds
    since the epoch."""

    user: str
    shown_prefix: str
    created: float
    revoked: float | None

    def to_json(self) -> dict[str, object]:
        return {"user": self.user, "prefix": self.shown_prefix, "created": self.created, "revoked": self.revoked}


@dataclass(frozen=True)
class UsageRecord:
    """One finished request. Tokens as the upstream's ``usage`` reported them; cost in USD."""

    user: str
    model: str
    route: str
    target: str
    status: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float = 0.0
    fallback_reason: str | None = None
    #: The upstream's response id (``chatcmpl-…``), when it gave one.
    request_id: str | None = None
    #: Only for routes with store_bodies: the first bytes of each, redacted.
    request_body: str | None = None
    response_body: str | None = None
    #: Which tier answered: 1 your cluster, 2 a local engine, 3 a hosted API (None: none did).
    tier: int | None = None
    #: The client's protocol (``chat_completions``, ``messages``, ``responses`` …), and the one
    #: the answering target was sent when it did not speak the client's (None: natively).
    protocol: str | None = None
    upstream_protocol: str | None = None


def new_key() -> str:
    """A fresh gateway key (shown once; only its hash is stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """What a store keeps of a key: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


def looks_like_key(key: str) -> bool:
    """Whether ``key`` has a gateway key's form (anything else is not looked up)."""
    return key.startswith(KEY_PREFIX) and len(key) <= MAX_KEY_CHARS


def period_start(period: str, now: float | None = None) -> float:
    """The start (UTC, seconds since the epoch) of the budget period containing ``now``."""
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start = midnight
    elif period == "week":
        start = midnight - timedelta(days=midnight.weekday())
    elif period == "month":
        start = midnight.replace(day=1)
    else:
        raise ValueError(f"unknown period {period!r}")
    return start.timestamp()


class SharedLimiter(Protocol):
    """Rate limits that several replicas share: ``admit`` gives a ticket or the seconds to
    wait; each ticket is released once, with the tokens the request used."""

    def admit(self, user: User, tokens: int, now: float) -> Any: ...
    def release(self, ticket: Any, tokens_used: int | None) -> None: ...


@dataclass
class SharedTicket:
    """An admitted request in the shared limiter: release it once with the tokens it used."""

    user: str
    id: str
    tokens: int
    released: bool = False


@dataclass(frozen=True)
class Reserve:
    """Hold ``amount_usd`` for ``user`` if the period's spend plus holds stays within the
    budget; its result is the reservation id, or None when it would not."""

    user: str
    amount_usd: float
    budget_usd: float
    period: str


@dataclass(frozen=True)
class Settle:
    """Replace a reservation by a finished request's usage row; its result is the user's spend
    plus holds in ``period`` afterwards (None without a period)."""

    reservation_id: int | None
    record: UsageRecord
    period: str | None = None


BookOperation = Reserve | Settle


def run_one_by_one(store: Store, operations: Sequence[BookOperation]) -> list[int | float | None]:
    """:meth:`Store.run_batch` for a store without a cheaper way: each operation on its own."""
    results: list[int | float | None] = []
    for operation in operations:
        if isinstance(operation, Reserve):
            results.append(store.reserve(operation.user, operation.amount_usd, operation.budget_usd, operation.period))
        else:
            store.settle(operation.reservation_id, operation.record)
            results.append(None if operation.period is None else store.spent(operation.record.user, operation.period))
    return results


class Store(Protocol):
    """What the gateway needs of its state: SQLite (sqlite.SqliteStore) or Redis (redis.RedisStore)."""

    def close(self) -> None: ...
    def maintain_in_background(self) -> None:
        """Start what keeps a long-running gateway's store healthy (SQLite: checkpoints off the
        request path); nothing for a store that needs nothing."""
        ...

    def shared_limiter(self) -> SharedLimiter | None: ...
    def add_key(self, user: str) -> str: ...
    def list_keys(self) -> list[KeyInfo]: ...
    def revoke(self, user_or_prefix: str) -> int: ...
    def authenticate(self, key: str) -> str | None: ...
    def reserve(self, user: str, amount_usd: float, budget_usd: float, period: str) -> int | None: ...
    def spent(self, user: str, period: str) -> float: ...
    def settle(self, reservation_id: int | None, record: UsageRecord) -> None: ...
    def run_batch(self, operations: Sequence[BookOperation]) -> list[int | float | None]:
        """Run reservations and settlements in order, committed together where the store can
        (one transaction for SQLite): every one is durable when this returns."""
        ...

    def first_usage_time(self) -> float | None: ...
    def totals(self, since: float) -> dict[str, dict[str, dict[str, float | int]]]: ...

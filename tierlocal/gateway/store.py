"""The gateway's state in SQLite (WAL): gateway keys (only their sha256 is stored), budget
reservations and usage records.

A request's worst-case cost is reserved before it is sent, inside one ``BEGIN IMMEDIATE``
transaction that also reads what the period has spent and holds, so no interleaving of
requests — threads or processes — can overrun a budget; the reservation is replaced by the
actual cost when the request ends. A reservation left by a process that died is still
counted (fail closed) until it expires.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .. import constants

if TYPE_CHECKING:
    from .config import GatewayConfig
    from .redis_store import RedisRateLimiter

__all__ = ["GatewayStore", "Store", "open_store", "KeyInfo", "UsageRecord", "period_start", "KEY_PREFIX"]

#: Every gateway key starts with this, so a leaked one is recognisable.
KEY_PREFIX = "tlk-"
#: Seconds after which an unsettled reservation (its process died) stops counting.
RESERVATION_TTL_S = 15 * 60
_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key_hash TEXT PRIMARY KEY,
    shown_prefix TEXT NOT NULL,
    user TEXT NOT NULL,
    created REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,
    amount_usd REAL NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    user TEXT NOT NULL,
    model TEXT NOT NULL,
    route TEXT NOT NULL,
    target TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    latency_ms REAL NOT NULL,
    fallback_reason TEXT,
    request_id TEXT,
    request_body TEXT,
    response_body TEXT
);
CREATE INDEX IF NOT EXISTS usage_user_time ON usage (user, time);
"""


@dataclass(frozen=True)
class KeyInfo:
    """A stored key as it may be shown: its first characters, never the key."""

    user: str
    shown_prefix: str
    created: float
    revoked: float | None


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


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class GatewayStore:
    """One SQLite database under the gateway's state directory (created 0700)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = state_dir / "gateway.sqlite3"
        self._connection = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        os.chmod(self.path, 0o600)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=NORMAL")  # WAL: a committed row survives kill -9 (not power loss)
        self._connection.executescript(_SCHEMA)
        columns = {row[1] for row in self._connection.execute("PRAGMA table_info(usage)")}
        for column in ("request_id", "request_body", "response_body"):  # a database from before these were kept
            if column not in columns:
                self._connection.execute(f"ALTER TABLE usage ADD COLUMN {column} TEXT")

    def close(self) -> None:
        self._connection.close()

    def shared_limiter(self) -> None:
        """None: one process, whose own limiter (limits.py) is the whole truth."""
        return None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._connection.execute("BEGIN IMMEDIATE")
        try:
            yield self._connection
        except BaseException:
            self._connection.execute("ROLLBACK")
            raise
        self._connection.execute("COMMIT")

    # --- keys ---------------------------------------------------------------------------------

    def add_key(self, user: str) -> str:
        """A new key for ``user``; the caller shows it once, only its hash is kept."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._transaction() as db:
            db.execute("INSERT INTO keys VALUES (?, ?, ?, ?, NULL)", (_hash(key), key[:10], user, time.time()))
        return key

    def list_keys(self) -> list[KeyInfo]:
        rows = self._connection.execute("SELECT user, shown_prefix, created, revoked FROM keys ORDER BY created").fetchall()
        return [KeyInfo(*row) for row in rows]

    def revoke(self, user_or_prefix: str) -> int:
        """Revoke every live key of a user, or the key starting with a shown prefix."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE keys SET revoked = ? WHERE revoked IS NULL AND (user = ? OR shown_prefix = ?)",
                (time.time(), user_or_prefix, user_or_prefix),
            )
            return cursor.rowcount

    def authenticate(self, key: str) -> str | None:
        """The user a live key belongs to, or None."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        row = self._connection.execute("SELECT user FROM keys WHERE key_hash = ? AND revoked IS NULL", (_hash(key),)).fetchone()
        return None if row is None else str(row[0])

    # --- budgets ------------------------------------------------------------------------------

    def _committed(self, db: sqlite3.Connection, user: str, since: float, now: float) -> float:
        spent = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE user = ? AND time >= ?", (user, since)).fetchone()[0]
        held = db.execute("SELECT COALESCE(SUM(amount_usd), 0) FROM reservations WHERE user = ? AND created >= ?", (user, now - RESERVATION_TTL_S)).fetchone()[0]
        return float(spent) + float(held)

    def reserve(self, user: str, amount_usd: float, budget_usd: float, period: str) -> int | None:
        """Hold ``amount_usd`` (a request's worst case) if the period's spend plus what is held
        stays within ``budget_usd``; returns the reservation id, or None when it would not."""
        now = time.time()
        with self._transaction() as db:
            if self._committed(db, user, period_start(period, now), now) + amount_usd > budget_usd + 1e-12:
                return None
            return int(db.execute("INSERT INTO reservations (user, amount_usd, created) VALUES (?, ?, ?)", (user, amount_usd, now)).lastrowid or 0)

    def spent(self, user: str, period: str) -> float:
        """USD recorded plus held for ``user`` in the current period."""
        now = time.time()
        return self._committed(self._connection, user, period_start(period, now), now)

    def settle(self, reservation_id: int | None, record: UsageRecord) -> None:
        """Replace the reservation (if any) by the request's actual usage, atomically."""
        with self._transaction() as db:
            if reservation_id is not None:
                db.execute("DELETE FROM reservations WHERE id = ?", (reservation_id,))
            db.execute(
                "INSERT INTO usage (time, user, model, route, target, status, prompt_tokens, cached_tokens, completion_tokens, cost_usd, latency_ms,"
                " fallback_reason, request_id, request_body, response_body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(), record.user, record.model, record.route, record.target, record.status, record.prompt_tokens,
                    record.cached_tokens, record.completion_tokens, record.cost_usd, record.latency_ms, record.fallback_reason, record.request_id,
                    record.request_body, record.response_body,
                ),
            )  # fmt: skip

    # --- reports ------------------------------------------------------------------------------

    def first_usage_time(self) -> float | None:
        """When the first recorded request ended (seconds since the epoch), if any."""
        value = self._connection.execute("SELECT MIN(time) FROM usage").fetchone()[0]
        return None if value is None else float(value)

    def totals(self, since: float) -> dict[str, dict[str, dict[str, float | int]]]:
        """Per user and per model since ``since``: requests, prompt/cached/completion tokens, cost."""
        result: dict[str, dict[str, dict[str, float | int]]] = {}
        for column, label in (("user", "users"), ("model", "models")):
            rows = self._connection.execute(
                f"SELECT {column}, COUNT(*), SUM(prompt_tokens), SUM(cached_tokens), SUM(completion_tokens), SUM(cost_usd)"  # noqa: S608 - fixed names
                f" FROM usage WHERE time >= ? GROUP BY {column} ORDER BY {column}",
                (since,),
            ).fetchall()
            result[label] = {
                str(name): {"requests": count, "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion, "cost_usd": round(cost, 6)}
                for name, count, prompt, cached, completion, cost in rows
            }
        return result


class Store(Protocol):
    """What the gateway needs of its state: SQLite (GatewayStore) or Redis (RedisStore)."""

    def close(self) -> None: ...
    def shared_limiter(self) -> RedisRateLimiter | None: ...
    def add_key(self, user: str) -> str: ...
    def list_keys(self) -> list[KeyInfo]: ...
    def revoke(self, user_or_prefix: str) -> int: ...
    def authenticate(self, key: str) -> str | None: ...
    def reserve(self, user: str, amount_usd: float, budget_usd: float, period: str) -> int | None: ...
    def spent(self, user: str, period: str) -> float: ...
    def settle(self, reservation_id: int | None, record: UsageRecord) -> None: ...
    def first_usage_time(self) -> float | None: ...
    def totals(self, since: float) -> dict[str, dict[str, dict[str, float | int]]]: ...


def open_store(config: GatewayConfig) -> Store:
    """Redis when the config names the variable holding its URL (``[server] redis_url_env``),
    else SQLite in ``state_dir``."""
    name = config.server.redis_url_env
    if name is None:
        return GatewayStore(config.server.state_dir)
    from ..errors import UsageError
    from .backends import credential
    from .redis_store import RedisStore

    url = constants.secret_from_env(name) or credential(name)
    if url is None:
        raise UsageError(f"{config.source}: server.redis_url_env names {name}, which is not set", hint=f"export {name}=redis://HOST:6379/0 (or hand it over as a systemd credential)")
    return RedisStore(url)

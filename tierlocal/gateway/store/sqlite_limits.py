"""Rate limits that several gateway processes on one machine share, kept in the gateway's
SQLite database: each admission is checked and recorded in one write transaction."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from ..config import User
from ..limits import WINDOW_S
from .base import RESERVATION_TTL_S, SharedTicket

__all__ = ["SqliteRateLimiter"]


class SqliteRateLimiter:
    """Per-user limits over a sliding minute that every gateway process on this machine shares:
    each admission is checked and recorded inside one ``BEGIN IMMEDIATE`` transaction, so
    workers cannot interleave past a limit (the same rules as limits.RateLimiter). An in-flight
    row left by a worker that died stops counting after the reservation TTL."""

    def __init__(self, path: Path, write_lock: Callable[[Path], AbstractContextManager[None]]) -> None:
        """``write_lock``: the store's writer queue (a file lock beside the database)."""
        self._connection = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._lock_path = path.with_name("gateway.lock")
        self._write_lock = write_lock

    def close(self) -> None:
        self._connection.close()

    def admit(self, user: User, tokens: int, now: float) -> SharedTicket | float:
        """A ticket, or the seconds to wait (for Retry-After)."""
        db = self._connection
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "DELETE FROM admissions WHERE user = ? AND time <= ? AND (in_flight = 0 OR time <= ?)",
                (user.name, now - WINDOW_S, now - RESERVATION_TTL_S),
            )
            rows = db.execute("SELECT time, tokens, in_flight FROM admissions WHERE user = ? ORDER BY time", (user.name,)).fetchall()
            wait = _limit_wait(user, tokens, now, rows)
            if wait is not None:
                db.execute("COMMIT")
                return wait
            ticket = SharedTicket(user.name, secrets.token_hex(8), tokens)
            db.execute("INSERT INTO admissions VALUES (?, ?, ?, ?, 1)", (ticket.id, user.name, now, float(tokens)))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return ticket

    def release(self, ticket: SharedTicket, tokens_used: int | None) -> None:
        """End an admitted request; its tokens become what it really used (when known)."""
        if ticket.released:
            return
        ticket.released = True
        tokens = float(ticket.tokens if tokens_used is None else tokens_used)
        self._connection.execute("UPDATE admissions SET in_flight = 0, tokens = ? WHERE id = ?", (tokens, ticket.id))


def _limit_wait(user: User, tokens: int, now: float, rows: list[tuple[float, float, int]]) -> float | None:
    """Seconds to wait before ``user`` may send a request of ``tokens``, given the minute's
    admissions (time, tokens, in flight) oldest first; None when it may go now."""
    recent = [(moment, used) for moment, used, _ in rows if moment > now - WINDOW_S]
    if user.concurrent_requests is not None and sum(flight for *_, flight in rows) >= user.concurrent_requests:
        return 1.0
    if user.requests_per_minute is not None and len(recent) >= user.requests_per_minute:
        return max(recent[0][0] + WINDOW_S - now, 0.001)
    if user.tokens_per_minute is not None and recent:
        total = sum(used for _, used in recent)
        if total + tokens > user.tokens_per_minute:
            freed = 0.0
            for moment, used in recent:
                freed += used
                if total - freed + tokens <= user.tokens_per_minute:
                    return max(moment + WINDOW_S - now, 0.001)
            return WINDOW_S
    return None

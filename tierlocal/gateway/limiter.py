"""One way to ask for a rate-limit ticket, whichever limiter keeps the count: this process's
sliding minute (:class:`~tierlocal.gateway.limits.RateLimiter`), or the one every replica
shares through the store (Redis), called on the store's thread. A ticket is released once,
with the tokens the request used."""

from __future__ import annotations

import time
from typing import Protocol

from .config import User
from .limits import RateLimiter, Ticket
from .store.base import SharedLimiter
from .store_worker import StoreWorker

__all__ = ["Limiter", "LocalLimiter", "SharedStoreLimiter", "limiter_for"]


class Limiter(Protocol):
    """``admit`` gives a ticket, or the seconds to wait (for Retry-After)."""

    async def admit(self, user: User, tokens: int) -> object: ...
    async def release(self, ticket: object, tokens_used: int | None) -> None: ...


class LocalLimiter:
    """This process's own count (one gateway replica)."""

    def __init__(self) -> None:
        self._limits = RateLimiter()

    async def admit(self, user: User, tokens: int) -> object:
        return self._limits.admit(user, tokens, time.monotonic())

    async def release(self, ticket: object, tokens_used: int | None) -> None:
        self._limits.release(ticket, tokens_used)  # type: ignore[arg-type]


class SharedStoreLimiter:
    """The count every replica shares, for users who have limits; the others are counted here."""

    def __init__(self, shared: SharedLimiter, worker: StoreWorker) -> None:
        self._shared, self._worker, self._local = shared, worker, LocalLimiter()

    async def admit(self, user: User, tokens: int) -> object:
        if not (user.requests_per_minute or user.tokens_per_minute or user.concurrent_requests):
            return await self._local.admit(user, tokens)
        return await self._worker.call(self._shared.admit, user, tokens, time.time())

    async def release(self, ticket: object, tokens_used: int | None) -> None:
        if isinstance(ticket, Ticket):  # the local count's
            await self._local.release(ticket, tokens_used)
        else:
            await self._worker.call(self._shared.release, ticket, tokens_used)


def limiter_for(shared: SharedLimiter | None, worker: StoreWorker) -> Limiter:
    """The shared limiter when the store offers one, else this process's."""
    return LocalLimiter() if shared is None else SharedStoreLimiter(shared, worker)

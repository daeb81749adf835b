"""The one thread the gateway calls its store on: SQLite has one writer, and a Redis call would
block the event loop too. The books, authentication, shared rate limits and the dashboard all
queue their store calls here, in the order they are made."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["StoreWorker"]

_T = TypeVar("_T")


class StoreWorker:
    """Runs store calls on one thread, awaited from the event loop."""

    def __init__(self, name: str = "gateway-store") -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, function: Callable[..., _T], *args: object) -> _T:
        """``function(*args)`` on the store's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    def close(self) -> None:
        """Finish the calls already queued, then stop the thread."""
        self._thread.shutdown(wait=True)

"""The running gateway's ``[[users]]``, read again from its config file whenever the file changes:
a user added while the gateway runs gets the limits and budget the file gives them from their
first request, a change to a user's limits applies from the next request, and a user taken out
of the file loses their key's access. Routes, prices and ``[server]`` are read once, at start: a
change to them is logged, not applied.

I/O: a ``stat`` of the config file per authenticated request (microseconds), and a read of it
when its size, modification time or inode changed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .config import GatewayConfig, User, load_config

__all__ = ["LiveUsers"]

log = logging.getLogger("tierlocal.gateway")


@dataclass(frozen=True)
class _Stamp:
    """What says a file changed: its inode (an editor's rename), size and modification time (ns)."""

    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> _Stamp | None:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return cls(info.st_ino, info.st_size, info.st_mtime_ns)


class LiveUsers:
    """Watches the file ``config`` was read from (``config.path`` None, the built-in
    configuration: nothing to watch)."""

    def __init__(self, config: GatewayConfig) -> None:
        self._users = config.users
        self._path = config.path
        self._stamp = _Stamp.of(config.path) if config.path is not None else None
        # The file's own routes, prices and [server] (the running config adds discovered routes
        # and the command line's --host/--port): a later edit of them is compared with these.
        self._static = _static_sections(load_config(config.path)) if config.path is not None else None

    def refresh(self) -> tuple[User, ...] | None:
        """The file's ``[[users]]`` if they changed since the last look (read only when the file
        did), else None. A file that no longer loads keeps the users as they were (logged once per
        change of the file)."""
        if self._path is None:
            return None
        stamp = _Stamp.of(self._path)
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            fresh = load_config(self._path)
        except UsageError as exc:
            log.error("%s changed and does not load (%s): the gateway keeps the users it had", self._path, exc)
            return None
        if _static_sections(fresh) != self._static:
            log.warning("%s: routes, prices or [server] changed; they apply when the gateway restarts ([[users]] apply now)", self._path)
        if fresh.users == self._users:
            return None
        before = {user.name for user in self._users}
        added = [user.name for user in fresh.users if user.name not in before]
        log.info("%s: [[users]] read again (%d users%s)", self._path, len(fresh.users), f"; new: {', '.join(added[:10])}" if added else "")
        self._users = fresh.users
        return fresh.users


def _static_sections(config: GatewayConfig) -> tuple[object, ...]:
    return (config.routes, config.prices, config.server)

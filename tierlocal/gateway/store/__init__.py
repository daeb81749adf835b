"""The gateway's state: keys, budget reservations and usage, in SQLite (one machine, the
default) or Redis (several replicas sharing one user base). :mod:`.base` holds what both keep
and promise; :func:`open_store` picks one from the configuration."""

from __future__ import annotations

from ... import constants
from ...errors import UsageError
from ..backends import credential
from ..config import GatewayConfig
from .base import KEY_PREFIX, KeyInfo, SharedLimiter, Store, UsageRecord, period_start
from .sqlite import SqliteStore

__all__ = ["KEY_PREFIX", "KeyInfo", "SharedLimiter", "SqliteStore", "Store", "UsageRecord", "open_store", "period_start", "store_label"]


def open_store(config: GatewayConfig, *, shared_limits: bool = False) -> Store:
    """Redis when the config names the variable holding its URL (``[server] redis_url_env``),
    else SQLite in ``state_dir`` (``shared_limits``: rate limits kept in the database too, for
    several gateway processes; Redis always shares them).

    Raises:
        UsageError: the variable is named but not set (or the redis client is missing).
    """
    name = config.server.redis_url_env
    if name is None:
        return SqliteStore(config.server.state_dir, shared_limits=shared_limits)
    from .redis import RedisStore  # the optional redis client is imported only when asked for

    url = constants.secret_from_env(name) or credential(name)
    if url is None:
        raise UsageError(
            f"{config.source}: server.redis_url_env names {name}, which is not set",
            hint=f"export {name}=redis://HOST:6379/0 (or hand it over as a systemd credential)",
        )
    return RedisStore(url)


def store_label(config: GatewayConfig) -> str:
    """Where :func:`open_store` keeps the state, in words: the SQLite state directory, or the
    variable holding the Redis URL (never the URL, which may carry a password)."""
    name = config.server.redis_url_env
    return f"Redis (URL in {name})" if name is not None else str(config.server.state_dir)

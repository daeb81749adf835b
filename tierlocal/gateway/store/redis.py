"""The gateway's state in Redis, shared by several gateway replicas serving one user base: the
same contract as the SQLite store (keys hashed, budgets that no interleaving can overrun, usage
records), with the reservation made by one Lua script — Redis runs a script alone, so the read
of the spend and holds and the new hold are one step for every replica.

Layout under ``tierlocal:gateway:``: ``keys`` (hash: key sha256 → JSON), ``holds:USER`` (sorted
set: hold id by creation time) with ``amounts:USER`` (hash: hold id → USD), ``spend:USER:PERIOD:
START`` (USD spent in that period, for day, week and month), ``usage`` (a stream: one entry per
finished request), and ``limit:USER:requests|tokens|flight`` (sorted sets: the shared sliding
minute of RedisRateLimiter).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ..config import User
from ..limits import WINDOW_S
from .base import (
    RESERVATION_TTL_S,
    SHOWN_PREFIX_CHARS,
    BookOperation,
    KeyInfo,
    SharedTicket,
    UsageRecord,
    hash_key,
    looks_like_key,
    new_key,
    period_start,
    run_one_by_one,
)

try:
    import redis
except ImportError:  # the optional extra
    redis = None  # type: ignore[assignment]

__all__ = ["RedisStore", "RedisRateLimiter", "SharedTicket"]

PREFIX = "tierlocal:gateway:"
_PERIODS = ("day", "week", "month")
#: Seconds a period's spend counter outlives the period (then Redis drops it).
_SPEND_KEEP_S = 40 * 86400

_RESERVE = """
local holds, amounts, spend, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, ttl, amount, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local expired = redis.call('ZRANGEBYSCORE', holds, '-inf', now - ttl)
if #expired > 0 then
  redis.call('ZREM', holds, unpack(expired))
  redis.call('HDEL', amounts, unpack(expired))
end
local held = 0
for _, value in ipairs(redis.call('HVALS', amounts)) do held = held + tonumber(value) end
local spent = tonumber(redis.call('GET', spend) or '0')
if spent + held + amount > budget + 1e-12 then return false end
local id = redis.call('INCR', seq)
redis.call('ZADD', holds, now, id)
redis.call('HSET', amounts, id, ARGV[3])
return id
"""


_ADMIT = """
local requests, tokens, flight = KEYS[1], KEYS[2], KEYS[3]
local now, window, id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local rpm, tpm, concurrent, wanted, flight_ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', requests, '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', tokens, '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', flight, '-inf', now - flight_ttl)
if concurrent > 0 and redis.call('ZCARD', flight) >= concurrent then return '1' end
if rpm > 0 and redis.call('ZCARD', requests) >= rpm then
  local oldest = redis.call('ZRANGE', requests, 0, 0, 'WITHSCORES')
  return tostring(math.max(tonumber(oldest[2]) + window - now, 0.001))
end
if tpm > 0 then
  local entries = redis.call('ZRANGE', tokens, 0, -1, 'WITHSCORES')
  local used = 0
  for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(.+)$')) end
  if #entries > 0 and used + wanted > tpm then
    local freed = 0
    for i = 1, #entries, 2 do
      freed = freed + tonumber(string.match(entries[i], ':(.+)$'))
      if used - freed + wanted <= tpm then return tostring(math.max(tonumber(entries[i + 1]) + window - now, 0.001)) end
    end
    return tostring(window)
  end
end
redis.call('ZADD', requests, now, id)
redis.call('ZADD', tokens, now, id .. ':' .. wanted)
redis.call('ZADD', flight, now, id)
redis.call('EXPIRE', requests, window * 2)
redis.call('EXPIRE', tokens, window * 2)
redis.call('EXPIRE', flight, flight_ttl)
return 'ok'
"""

_RELEASE = """
local tokens, flight = KEYS[1], KEYS[2]
local id, wanted, used = ARGV[1], ARGV[2], ARGV[3]
redis.call('ZREM', flight, id)
if used ~= '' then
  local score = redis.call('ZSCORE', tokens, id .. ':' .. wanted)
  if score then
    redis.call('ZREM', tokens, id .. ':' .. wanted)
    redis.call('ZADD', tokens, score, id .. ':' .. used)
  end
end
return 1
"""


class RedisRateLimiter:
    """Per-user limits over a sliding minute shared by every replica: one Lua script checks
    requests, tokens and requests in flight and admits, so replicas cannot interleave past a
    limit. An in-flight entry left by a replica that died stops counting after 15 minutes."""

    def __init__(self, client: Any) -> None:
        self._redis = client
        self._admit = client.register_script(_ADMIT)
        self._release = client.register_script(_RELEASE)

    @staticmethod
    def _keys(user: str) -> list[str]:
        return [f"{PREFIX}limit:{user}:{kind}" for kind in ("requests", "tokens", "flight")]

    def admit(self, user: User, tokens: int, now: float) -> SharedTicket | float:
        """A ticket, or the seconds to wait (for Retry-After)."""
        ticket_id = secrets.token_hex(8)
        result = self._admit(
            keys=self._keys(user.name),
            args=[
                now,
                WINDOW_S,
                ticket_id,
                user.requests_per_minute or 0,
                user.tokens_per_minute or 0,
                user.concurrent_requests or 0,
                tokens,
                RESERVATION_TTL_S,
            ],
        )
        return SharedTicket(user.name, ticket_id, tokens) if result == "ok" else float(result)

    def release(self, ticket: SharedTicket, tokens_used: int | None) -> None:
        if ticket.released:
            return
        ticket.released = True
        _requests, tokens, flight = self._keys(ticket.user)
        self._release(keys=[tokens, flight], args=[ticket.id, ticket.tokens, "" if tokens_used is None else tokens_used])


class RedisStore:
    """The store on a Redis server at ``url`` (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str) -> None:
        if redis is None:
            raise UsageError("the gateway's config asks for Redis, and the redis client is not installed", hint="pip install 'tierlocal[redis]'")
        # Any: redis-py annotates its sync and async clients at once (each reply "awaitable or
        # value", bytes or str); this is the sync client with decode_responses, so replies are str.
        self._redis: Any = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, decode_responses=True)
        self._reserve = self._redis.register_script(_RESERVE)
        self.path = "redis"

    def close(self) -> None:
        self._redis.close()

    def maintain_in_background(self) -> None:
        """Nothing: Redis keeps itself."""

    def shared_limiter(self) -> RedisRateLimiter:
        """Rate limits every replica shares."""
        return RedisRateLimiter(self._redis)

    # --- keys ---------------------------------------------------------------------------------

    def add_key(self, user: str) -> str:
        key = new_key()
        entry = {"user": user, "shown_prefix": key[:SHOWN_PREFIX_CHARS], "created": time.time(), "revoked": None}
        self._redis.hset(PREFIX + "keys", hash_key(key), json.dumps(entry))
        return key

    def _entries(self) -> dict[str, dict[str, object]]:
        return {field: json.loads(value) for field, value in self._redis.hgetall(PREFIX + "keys").items()}

    def list_keys(self) -> list[KeyInfo]:
        entries = sorted(self._entries().values(), key=lambda entry: float(entry["created"]))  # type: ignore[arg-type]
        return [
            KeyInfo(str(e["user"]), str(e["shown_prefix"]), float(e["created"]), None if e["revoked"] is None else float(e["revoked"]))  # type: ignore[arg-type]
            for e in entries
        ]

    def revoke(self, user_or_prefix: str) -> int:
        count = 0
        for field, entry in self._entries().items():
            if entry["revoked"] is None and user_or_prefix in (entry["user"], entry["shown_prefix"]):
                entry["revoked"] = time.time()
                self._redis.hset(PREFIX + "keys", field, json.dumps(entry))
                count += 1
        return count

    def authenticate(self, key: str) -> str | None:
        if not looks_like_key(key):
            return None
        value = self._redis.hget(PREFIX + "keys", hash_key(key))
        if value is None:
            return None
        entry = json.loads(value)
        return None if entry["revoked"] is not None else str(entry["user"])

    # --- budgets ------------------------------------------------------------------------------

    @staticmethod
    def _spend_key(user: str, period: str, now: float) -> str:
        return f"{PREFIX}spend:{user}:{period}:{int(period_start(period, now))}"

    def reserve(self, user: str, amount_usd: float, budget_usd: float, period: str) -> int | None:
        now = time.time()
        keys = [f"{PREFIX}holds:{user}", f"{PREFIX}amounts:{user}", self._spend_key(user, period, now), PREFIX + "hold_seq"]
        result = self._reserve(keys=keys, args=[now, RESERVATION_TTL_S, repr(amount_usd), repr(budget_usd)])
        return None if result is None else int(result)

    def spent(self, user: str, period: str) -> float:
        now = time.time()
        spent = float(self._redis.get(self._spend_key(user, period, now)) or 0.0)
        live = self._redis.zrangebyscore(f"{PREFIX}holds:{user}", now - RESERVATION_TTL_S, "+inf")
        held = sum(float(value) for value in self._redis.hmget(f"{PREFIX}amounts:{user}", live) if value is not None) if live else 0.0
        return spent + held

    def settle(self, reservation_id: int | None, record: UsageRecord) -> None:
        now = time.time()
        pipe = self._redis.pipeline(transaction=True)  # MULTI/EXEC: all of it or none
        if reservation_id is not None:
            pipe.zrem(f"{PREFIX}holds:{record.user}", reservation_id)
            pipe.hdel(f"{PREFIX}amounts:{record.user}", reservation_id)
        if record.cost_usd:
            for period in _PERIODS:
                key = self._spend_key(record.user, period, now)
                pipe.incrbyfloat(key, record.cost_usd)
                pipe.expire(key, _SPEND_KEEP_S)
        fields = {name: "" if value is None else str(value) for name, value in vars(record).items()}
        fields["time"] = repr(now)
        pipe.xadd(PREFIX + "usage", fields)
        pipe.execute()

    def run_batch(self, operations: Sequence[BookOperation]) -> list[int | float | None]:
        """Each operation in its own Redis transaction (they are atomic one by one)."""
        return run_one_by_one(self, operations)

    # --- reports ------------------------------------------------------------------------------

    def first_usage_time(self) -> float | None:
        entries = self._redis.xrange(PREFIX + "usage", count=1)
        return float(entries[0][1]["time"]) if entries else None

    def totals(self, since: float) -> dict[str, dict[str, dict[str, float | int]]]:
        result: dict[str, dict[str, dict[str, float | int]]] = {"users": {}, "models": {}, "targets": {}, "tiers": {}, "protocols": {}}
        start = f"{int(since * 1000)}-0"
        while True:
            batch = self._redis.xrange(PREFIX + "usage", min=start, count=10_000)
            for _entry_id, fields in batch:
                protocol = fields.get("protocol", "") + (f"->{fields['upstream_protocol']}" if fields.get("upstream_protocol") else "")
                names = (
                    ("users", fields["user"]),
                    ("models", fields["model"]),
                    ("targets", fields["target"]),
                    ("tiers", fields.get("tier", "")),
                    ("protocols", protocol),
                )
                for label, name in names:
                    row = result[label].setdefault(
                        name, {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
                    )
                    row["requests"] += 1
                    for column in ("prompt_tokens", "cached_tokens", "completion_tokens"):
                        row[column] += int(fields[column])
                    row["cost_usd"] += float(fields["cost_usd"])
            if len(batch) < 10_000:
                break
            start = "(" + batch[-1][0]
        for rows in result.values():
            for row in rows.values():
                row["cost_usd"] = round(float(row["cost_usd"]), 6)
        return {label: dict(sorted(rows.items())) for label, rows in result.items()}

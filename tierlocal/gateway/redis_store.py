"""The gateway's state in Redis, shared by several gateway replicas serving one user base: the
same contract as the SQLite store (keys hashed, budgets that no interleaving can overrun, usage
records), with the reservation made by one Lua script — Redis runs a script alone, so the read
of the spend and holds and the new hold are one step for every replica.

Layout under ``tierlocal:gateway:``: ``keys`` (hash: key sha256 → JSON), ``holds:USER`` (sorted
set: hold id by creation time) with ``amounts:USER`` (hash: hold id → USD), ``spend:USER:PERIOD:
START`` (USD spent in that period, for day, week and month), ``usage`` (a stream: one entry per
finished request). Rate limits stay per replica (limits.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time

from .store import KEY_PREFIX, RESERVATION_TTL_S, KeyInfo, UsageRecord, period_start

try:
    import redis
except ImportError:  # the optional extra
    redis = None  # type: ignore[assignment]

__all__ = ["RedisStore"]

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


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class RedisStore:
    """The store on a Redis server at ``url`` (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str) -> None:
        if redis is None:
            from ..errors import UsageError

            raise UsageError("the gateway's config asks for Redis, and the redis client is not installed", hint="pip install 'tierlocal[redis]'")
        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, decode_responses=True)
        self._reserve = self._redis.register_script(_RESERVE)
        self.path = "redis"

    def close(self) -> None:
        self._redis.close()

    # --- keys ---------------------------------------------------------------------------------

    def add_key(self, user: str) -> str:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        entry = {"user": user, "shown_prefix": key[:10], "created": time.time(), "revoked": None}
        self._redis.hset(PREFIX + "keys", _hash(key), json.dumps(entry))
        return key

    def _entries(self) -> dict[str, dict[str, object]]:
        return {field: json.loads(value) for field, value in self._redis.hgetall(PREFIX + "keys").items()}

    def list_keys(self) -> list[KeyInfo]:
        entries = sorted(self._entries().values(), key=lambda entry: float(entry["created"]))  # type: ignore[arg-type]
        return [KeyInfo(str(e["user"]), str(e["shown_prefix"]), float(e["created"]), None if e["revoked"] is None else float(e["revoked"])) for e in entries]  # type: ignore[arg-type]

    def revoke(self, user_or_prefix: str) -> int:
        count = 0
        for field, entry in self._entries().items():
            if entry["revoked"] is None and user_or_prefix in (entry["user"], entry["shown_prefix"]):
                entry["revoked"] = time.time()
                self._redis.hset(PREFIX + "keys", field, json.dumps(entry))
                count += 1
        return count

    def authenticate(self, key: str) -> str | None:
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        value = self._redis.hget(PREFIX + "keys", _hash(key))
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

    # --- reports ------------------------------------------------------------------------------

    def first_usage_time(self) -> float | None:
        entries = self._redis.xrange(PREFIX + "usage", count=1)
        return float(entries[0][1]["time"]) if entries else None

    def totals(self, since: float) -> dict[str, dict[str, dict[str, float | int]]]:
        result: dict[str, dict[str, dict[str, float | int]]] = {"users": {}, "models": {}}
        start = f"{int(since * 1000)}-0"
        while True:
            batch = self._redis.xrange(PREFIX + "usage", min=start, count=10_000)
            for _entry_id, fields in batch:
                for label, name in (("users", fields["user"]), ("models", fields["model"])):
                    row = result[label].setdefault(name, {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0})
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

"""The gateway's books: a budgeted request's worst case reserved before it is sent, the
reservation replaced by what the upstream's ``usage`` says it cost, one usage row per request,
and the spend, token and latency metrics that follow. The store is called on the gateway's one
store thread (store_worker.py).

Reservations and settlements are group-committed: while one batch is being written, the
requests that reach the books queue up, and the next batch writes them all in one transaction.
Each request still waits for its own batch's commit (a usage row is durable before the
response's last byte), and no request waits for a timer: under no load a batch is one request."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

from ..tiers.arithmetic import ApiPrices
from ..units import format_usd
from . import protocol
from .config import GatewayConfig, Route, Target, User
from .metrics import Metrics
from .pricing import Usage, cost_usd
from .protocol import printable
from .store import Store, UsageRecord
from .store.base import BookOperation, Reserve, Settle
from .store_worker import StoreWorker
from .wire import Exchange, Reject

__all__ = ["Ledger"]

log = logging.getLogger("tierlocal.gateway")
_T = TypeVar("_T")


class Ledger:
    """Reservations, settlement and usage rows for one gateway process."""

    def __init__(self, config: GatewayConfig, store: Store, metrics: Metrics, secrets: tuple[str, ...], worker: StoreWorker) -> None:
        self.config, self.store, self.metrics, self.secrets, self.worker = config, store, metrics, secrets, worker
        self._pending: list[tuple[BookOperation, asyncio.Future[int | float | None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def book(self, operation: BookOperation) -> int | float | None:
        """``operation``'s result, once the batch it joined is committed."""
        future: asyncio.Future[int | float | None] = asyncio.get_running_loop().create_future()
        self._pending.append((operation, future))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_batches())
        return await future

    async def _write_batches(self) -> None:
        """Write what has queued, one transaction per batch, until nothing is left."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self.worker.call(self.store.run_batch, [operation for operation, _ in batch])
                except Exception as exc:  # every request of the batch fails as it would alone
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._writer = None

    def price(self, route: Route, target: Target) -> ApiPrices | None:
        """USD per million tokens for ``target`` (by its model, else the route's)."""
        return self.config.prices.get(target.model) or self.config.prices.get(route.model)

    def redact(self, data: bytes, route: Route) -> str:
        """A body as stored: its first bytes, without keys, bearer tokens or account ids."""
        cap = route.max_stored_body_bytes
        return protocol.sanitise(data[:cap].decode("utf-8", "replace"), self.secrets, limit=cap)

    async def reserve(self, user: User, route: Route, input_bound: int, output_bound: int) -> int:
        """Hold the request's worst case (every hosted API's price at these token bounds; a
        cluster of your own (tier 1) costs by the hour, not by the request).

        Raises:
            Reject: a hosted API has no price (403), or the budget would be exceeded (429).
        """
        worst = 0.0
        for target in route.targets:
            if target.tier != 3:
                continue
            prices = self.price(route, target)
            if prices is None:
                raise Reject(
                    403,
                    f'no price for {target.model!r}, so a request by a user with a budget cannot be costed: add [prices."{target.model}"] to the '
                    "gateway's config",
                    "permission_error",
                    "price_unknown",
                    should_retry=False,
                )
            worst = max(worst, cost_usd(prices, Usage(input_bound, 0, output_bound)))
        assert user.budget_usd is not None
        reservation = await self.book(Reserve(user.name, worst, user.budget_usd, user.budget_period))
        if reservation is None:
            spent = await self.worker.call(self.store.spent, user.name, user.budget_period)
            self.metrics.requests.labels(route.model, "429").inc()
            raise Reject(
                429,
                f"budget reached for user {user.name!r}: {format_usd(spent)} of {format_usd(user.budget_usd)} this {user.budget_period} is spent "
                f"or held, and this request may cost up to {format_usd(worst)}",
                "insufficient_quota",
                "budget_exceeded",
                should_retry=False,
            )
        return int(reservation)

    async def settle(self, exchange: Exchange, reservation: int | None) -> None:
        """Replace the reservation by the request's cost, write its usage row, count it."""
        route, state = exchange.route, exchange.target
        usage = exchange.usage or Usage()
        priced = state is not None and state.target.tier == 3
        prices = self.price(route, state.target) if state is not None and priced else None
        cost = 0.0 if prices is None else cost_usd(prices, usage)
        reason = ",".join(exchange.reasons) or None
        if exchange.usage_estimated:
            reason = f"{reason or ''},usage_estimated".lstrip(",")
        latency_ms = (time.monotonic() - exchange.started) * 1000
        model = state.target.model if state is not None and priced else route.model
        record = UsageRecord(
            exchange.user.name,
            model,
            route.model,
            "" if state is None else state.label,
            exchange.status,
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            cost,
            latency_ms,
            reason,
            exchange.request_id,
            exchange.request_body,
            self.redact(b"".join(exchange.response_kept), route) if route.store_bodies else None,
            None if state is None else state.target.tier,
            exchange.dialect.name,
            exchange.upstream_protocol,
        )
        budgeted = exchange.user.budget_usd is not None
        spent = await self.book(Settle(reservation, record, exchange.user.budget_period if budgeted else None))
        if exchange.user.budget_usd is not None and spent is not None:
            self.metrics.budget_remaining.labels(exchange.user.name).set(max(exchange.user.budget_usd - spent, 0.0))
        self._count(exchange, usage, cost, latency_ms, reason)

    def _count(self, exchange: Exchange, usage: Usage, cost: float, latency_ms: float, reason: str | None) -> None:
        route, state = exchange.route, exchange.target
        self.metrics.requests.labels(route.model, str(exchange.status)).inc()
        self.metrics.latency.labels(route.model).observe(latency_ms / 1000)
        for kind, count in (("prompt", usage.prompt_tokens), ("cached", usage.cached_tokens), ("completion", usage.completion_tokens)):
            if count:
                self.metrics.tokens.labels(route.model, kind).inc(count)
        if cost:
            self.metrics.spend.labels(route.model).inc(cost)
        log.info(
            "user=%s model=%s protocol=%s target=%s status=%d attempts=%d fallback=%s prompt=%d cached=%d completion=%d cost_usd=%.6f "
            "latency_ms=%.0f%s",
            printable(exchange.user.name),
            printable(route.model),
            exchange.dialect.name if exchange.upstream_protocol is None else f"{exchange.dialect.name}->{exchange.upstream_protocol}",
            "-" if state is None else printable(state.label),
            exchange.status,
            exchange.attempts,
            reason or "-",
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            cost,
            latency_ms,
            "".join(f" adjusted={printable(note)!r}" for note in exchange.adjusted),
        )

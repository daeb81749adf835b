"""The gateway's Prometheus metrics, in a registry of its own (nothing global); with several
worker processes, each writes prometheus_client's multiprocess files and /metrics sums them.

Labels hold route ids, target URLs and user names — never keys or message text."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        """``multiprocess_dir``: where every worker's values are (prometheus_client's value
        class must already write there); None for one process."""
        self.registry = CollectorRegistry()
        self._multiprocess_dir = multiprocess_dir
        self.requests = Counter("tierlocal_gateway_requests", "Client requests by route and status", ["model", "status"], registry=self.registry)
        self.upstream = Counter(
            "tierlocal_gateway_upstream_requests", "Upstream attempts by target and outcome", ["target", "outcome"], registry=self.registry
        )
        self.fallbacks = Counter(
            "tierlocal_gateway_fallbacks", "Attempts that moved on to another target, by reason", ["model", "reason"], registry=self.registry
        )
        self.latency = Histogram(
            "tierlocal_gateway_request_seconds", "Client request duration", ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry
        )
        self.first_byte = Histogram(
            "tierlocal_gateway_upstream_first_byte_seconds",
            "Upstream time to response headers",
            ["target"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "tierlocal_gateway_tokens", "Tokens by route and kind (prompt, cached, completion)", ["model", "kind"], registry=self.registry
        )
        self.spend = Counter("tierlocal_gateway_spend_usd", "Spend in USD by route", ["model"], registry=self.registry)
        self.budget_remaining = Gauge(
            "tierlocal_gateway_budget_remaining_usd",
            "Budget left this period, by user",
            ["user"],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.in_flight = Gauge(
            "tierlocal_gateway_in_flight", "Requests being served, by target", ["target"], registry=self.registry, multiprocess_mode="livesum"
        )

    def render(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self._multiprocess_dir))
        return generate_latest(registry)

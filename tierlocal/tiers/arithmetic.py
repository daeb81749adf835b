"""Tier-1 / tier-3 arithmetic for models that do not fit one machine. Pure.

The formulas (docs/commands/plan.md; facts and prices in recipes/, each with its source and date):

- weights = parameters × bytes per weight (MXFP4 adds 1/32 byte per weight of block scales);
- GPUs just to hold the weights = ceil(weights ÷ memory per GPU) — a floor, not a target;
- classic KV per user = 2 × layers × kv_heads × head_dim × bytes per element × context;
- rental = GPUs × hours × rate, a month being 720 hours;
- break-even tokens/month = monthly cluster cost ÷ API price per token, where the blended
  price mixes output, input cache hits and input cache misses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .. import constants
from ..published import ApiPrices, Precision, PublishedConfig, weights_bytes

__all__ = [
    "HOURS_PER_MONTH",
    "Precision",
    "ApiPrices",
    "GpuOption",
    "PublishedConfig",
    "WeightsLine",
    "GpuCount",
    "RentalLine",
    "BreakEven",
    "weights_bytes",
    "weights_by_precision",
    "gpus_for_weights",
    "classic_kv_bytes_per_token",
    "kv_per_user",
    "rental_scenarios",
    "blended_usd_per_million",
    "break_even",
    "download_seconds",
]

HOURS_PER_MONTH = 720


@dataclass(frozen=True)
class GpuOption:
    """A GPU to size a cluster with: its marketed memory in bytes (decimal, as the vendor sells
    it and the guides count), and what the driver reports as usable when known."""

    name: str
    memory_bytes: int
    usable_bytes: int | None = None
    #: Peak memory bandwidth per GPU, bytes/s (None: not known).
    bandwidth_bytes_per_s: int | None = None


@dataclass(frozen=True)
class WeightsLine:
    """Weights at one precision: ``weights_bytes`` nominal, ``with_scales_bytes`` as shipped."""

    precision: str
    bytes_per_weight: float
    weights_bytes: int
    with_scales_bytes: int


@dataclass(frozen=True)
class GpuCount:
    """How many of one GPU it takes to hold ``bytes`` (a floor: no KV, no overhead), counted
    with its marketed memory; with the usable memory the driver reports, when known; and to
    hold the files as shipped (weights plus what ships beside them: block scales, unquantised
    layers, a vision encoder), when their size is published."""

    gpu: str
    memory_bytes: int
    count: int
    usable_bytes: int | None = None
    usable_count: int | None = None
    shipped_count: int | None = None


@dataclass(frozen=True)
class RentalLine:
    """One rental scenario; cost in USD per month."""

    label: str
    gpus: int
    hours_per_month: float
    usd_per_month: float


@dataclass(frozen=True)
class BreakEven:
    """Tokens per month above which renting at ``monthly_cost_usd`` beats the API."""

    monthly_cost_usd: float
    output_tokens_per_month: float
    blended_tokens_per_month: float
    blended_usd_per_million: float
    input_share: float
    cache_hit: float

    @property
    def blended_tokens_per_day(self) -> float:
        return self.blended_tokens_per_month / 30

    @property
    def output_tokens_per_day(self) -> float:
        return self.output_tokens_per_month / 30


def weights_by_precision(params: int, precisions: Sequence[Precision]) -> list[WeightsLine]:
    """The weights at every precision, nominal and with block scales."""
    return [WeightsLine(p.name, p.bytes_per_weight, weights_bytes(params, p), weights_bytes(params, p, with_scales=True)) for p in precisions]


def gpus_for_weights(n_bytes: int, gpus: Sequence[GpuOption], shipped_bytes: int | None = None) -> list[GpuCount]:
    """ceil(bytes ÷ marketed memory) per GPU type (and ÷ usable memory, where known; and
    ``shipped_bytes`` ÷ marketed memory, when given), fewest first."""
    counts = [
        GpuCount(
            gpu.name,
            gpu.memory_bytes,
            math.ceil(n_bytes / gpu.memory_bytes),
            gpu.usable_bytes,
            math.ceil(n_bytes / gpu.usable_bytes) if gpu.usable_bytes else None,
            math.ceil(shipped_bytes / gpu.memory_bytes) if shipped_bytes else None,
        )
        for gpu in gpus
    ]
    return sorted(counts, key=lambda count: (count.count, -count.memory_bytes))


def classic_kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """2 (K and V) × layers × kv_heads × head_dim × bytes per element, per token."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def kv_per_user(bytes_per_token: float, fixed_state_bytes: int = 0, contexts: Sequence[int] = constants.PLAN_KV_CONTEXTS) -> list[tuple[int, int]]:
    """(context, bytes) for one user: growing KV × context plus any fixed recurrent state."""
    return [(ctx, round(bytes_per_token * ctx) + fixed_state_bytes) for ctx in contexts]


def rental_scenarios(rate_usd_per_gpu_hour: float, own: tuple[int, float] | None = None) -> list[RentalLine]:
    """Monthly cost of the standard scenarios (1 GPU always on; 8 GPUs 4 h/day; 8 and 32
    always on) and ``own`` = (GPUs, hours per day) if given. Idle GPUs bill the same."""
    scenarios = [("1 GPU always on", 1, 24.0), ("8 GPUs 4 h/day", 8, 4.0), ("8 GPUs always on", 8, 24.0), ("32 GPUs always on", 32, 24.0)]
    if own is not None:
        scenarios.append((f"{own[0]} GPUs {own[1]:g} h/day (yours)", own[0], own[1]))
    lines = []
    for label, gpus, hours_per_day in scenarios:
        hours = HOURS_PER_MONTH * hours_per_day / 24
        lines.append(RentalLine(label, gpus, hours, gpus * hours * rate_usd_per_gpu_hour))
    return lines


def blended_usd_per_million(prices: ApiPrices, *, input_share: float, cache_hit: float) -> float:
    """USD per million tokens for a mix: ``input_share`` of tokens are input, of which
    ``cache_hit`` hit the cache; the rest are output."""
    input_price = cache_hit * prices.input_cache_hit + (1 - cache_hit) * prices.input_cache_miss
    return input_share * input_price + (1 - input_share) * prices.output


def break_even(monthly_cost_usd: float, prices: ApiPrices, *, input_share: float, cache_hit: float) -> BreakEven:
    """Tokens per month at which the API costs as much as the cluster (output-only and blended)."""
    blended = blended_usd_per_million(prices, input_share=input_share, cache_hit=cache_hit)
    return BreakEven(
        monthly_cost_usd=monthly_cost_usd,
        output_tokens_per_month=monthly_cost_usd / prices.output * 1e6,
        blended_tokens_per_month=monthly_cost_usd / blended * 1e6,
        blended_usd_per_million=blended,
        input_share=input_share,
        cache_hit=cache_hit,
    )


def download_seconds(n_bytes: int, bandwidths_bytes_per_s: Sequence[float]) -> list[tuple[float, float]]:
    """(bandwidth, seconds) to fetch ``n_bytes`` at each bandwidth."""
    return [(bandwidth, n_bytes / bandwidth) for bandwidth in bandwidths_bytes_per_s]

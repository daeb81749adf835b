"""``tierlocal plan``: assemble the tier-1 / tier-3 answer for one model from facts and
options. Pure: the CLI resolves the model and the recipes, this module only computes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .tiers import (
    ApiPrices,
    BreakEven,
    GpuCount,
    GpuOption,
    Precision,
    PublishedConfig,
    RentalLine,
    WeightsLine,
    break_even,
    classic_kv_bytes_per_token,
    download_seconds,
    gpus_for_weights,
    kv_per_user,
    parallel_layout,
    rental_scenarios,
    weights_bytes,
    weights_by_precision,
)

__all__ = ["ModelFacts", "PlanOptions", "ServingConfig", "TierPlan", "build_plan", "KV_MEASURE_PROCEDURE", "deployable_count"]

#: How to measure KV per token when the attention design is not published.
KV_MEASURE_PROCEDURE = (
    "Start the server with a small maximum context (e.g. --max-model-len 8192) and one sequence, note GPU memory "
    "after load (nvidia-smi), double the context and restart, and repeat until allocation fails; KV per token = "
    "(memory at 2N − memory at N) ÷ N. vLLM also logs the KV cache size and the maximum concurrency it allows."
)
_GPUS_PER_NODE = 8
_SERVING_KV_CONTEXT = 32_768


@dataclass(frozen=True)
class ModelFacts:
    """What is known about a model, from recipes, a GGUF header or a hub repo. Bytes, counts."""

    name: str
    display_name: str
    params: int
    active_params: int
    precision: str
    layers: int | None = None
    context_length: int | None = None
    kv_bytes_per_token: float | None = None
    fixed_state_bytes: int = 0
    kv_unknown_reason: str | None = None
    classic_example: tuple[int, int, int, float] | None = None
    shipped_bytes: int | None = None
    serving_floor_bytes: int | None = None
    disk_to_plan_bytes: int | None = None
    published_configs: tuple[PublishedConfig, ...] = ()
    guidance: dict[str, str] = field(default_factory=dict)
    vllm_flags: tuple[str, ...] = ()
    vllm_notes: dict[str, str] = field(default_factory=dict)
    sglang_flags: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanOptions:
    """The user's assumptions. Rates in USD per GPU-hour, bandwidths in bytes/s, shares 0..1."""

    gpus: tuple[GpuOption, ...]
    rate_usd_per_gpu_hour: float
    input_share: float
    cache_hit: float
    bandwidths_bytes_per_s: tuple[float, ...]
    hours_per_day: float | None = None
    tokens_per_month: float | None = None
    monthly_cost_usd: float | None = None
    api_prices: ApiPrices | None = None
    api_name: str | None = None
    model_path: str = "<path-or-repo-of-the-weights>"
    port: int = 8000
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServingConfig:
    """A cluster that holds the serving floor: ``count`` of ``gpu`` (memory in bytes)."""

    gpu: str
    memory_bytes: int
    count: int
    total_bytes: int


@dataclass(frozen=True)
class TierPlan:
    """Everything ``tierlocal plan`` prints."""

    facts: ModelFacts
    precision: Precision
    weights_bytes: int
    weights_with_scales_bytes: int
    weights_by_precision: list[WeightsLine]
    gpus_for_weights: list[GpuCount]
    serving_floor_bytes: int
    serving_floor_published: bool
    serving_configs: list[ServingConfig]
    chosen: ServingConfig | None
    kv_per_user: list[tuple[int, int]] | None
    kv_classic_example: list[tuple[int, int]] | None
    rental: list[RentalLine]
    break_even: BreakEven | None
    volume_verdict: dict[str, float | str] | None
    download: list[tuple[float, float]]
    disk_bytes: int
    launch: dict[str, list[str]]
    health: list[str]
    options: PlanOptions


def deployable_count(count: int) -> int:
    """GPUs as clusters are built: a power of two up to a node of 8, then whole nodes."""
    if count <= _GPUS_PER_NODE:
        return 1 << max(count - 1, 0).bit_length()
    return math.ceil(count / _GPUS_PER_NODE) * _GPUS_PER_NODE


def _serving_floor(facts: ModelFacts, weights: int) -> tuple[int, bool]:
    if facts.serving_floor_bytes is not None:
        return facts.serving_floor_bytes, True
    kv = round(facts.kv_bytes_per_token * _SERVING_KV_CONTEXT) + facts.fixed_state_bytes if facts.kv_bytes_per_token else 0
    return weights + kv + 2 * 1024**3, False


def _launch(facts: ModelFacts, options: PlanOptions, gpus: int) -> dict[str, list[str]]:
    nodes, tp, ep = parallel_layout(gpus, _GPUS_PER_NODE)
    vllm = ["vllm", "serve", options.model_path, "--tensor-parallel-size", str(tp)]
    if nodes > 1:
        vllm += ["--pipeline-parallel-size", str(nodes)]
    vllm += ["--enable-expert-parallel", *facts.vllm_flags, "--port", str(options.port)]
    sglang = ["python3", "-m", "sglang.launch_server", "--model-path", options.model_path, "--tp-size", str(tp), "--ep-size", str(ep)]
    if nodes > 1:
        sglang += ["--nnodes", str(nodes), "--node-rank", "<0..%d>" % (nodes - 1), "--dist-init-addr", "<head-node>:5000"]
    sglang += [*facts.sglang_flags, "--port", str(options.port)]
    return {"vllm": vllm, "sglang": sglang}


def _health(options: PlanOptions) -> list[str]:
    return [
        f"curl -sf http://127.0.0.1:{options.port}/v1/models  # answers with the model id once loaded",
        "connection refused: still loading (download + load can take tens of minutes) or the server exited: read its log",
        "'Model architectures [...] are not supported for now': the runtime is older than the model; no flag fixes it, "
        "install the nightly named on the model card",
    ]


def _volume_verdict(options: PlanOptions, even: BreakEven | None) -> dict[str, float | str] | None:
    if options.tokens_per_month is None or even is None:
        return None
    api_usd = options.tokens_per_month * even.blended_usd_per_million / 1e6
    cheaper = "api" if api_usd < even.monthly_cost_usd else "rent"
    return {"tokens_per_month": options.tokens_per_month, "api_usd_per_month": api_usd, "rent_usd_per_month": even.monthly_cost_usd, "cheaper": cheaper}


def build_plan(facts: ModelFacts, options: PlanOptions, precisions: Sequence[Precision]) -> TierPlan:
    """The tier-1/tier-3 plan for ``facts`` under ``options``.

    Raises:
        KeyError: ``facts.precision`` is not among ``precisions``.
    """
    precision = next(p for p in precisions if p.name == facts.precision)
    weights = weights_bytes(facts.params, precision)
    with_scales = weights_bytes(facts.params, precision, with_scales=True)
    floor, floor_published = _serving_floor(facts, weights)
    configs = sorted(
        (ServingConfig(gpu.name, gpu.memory_bytes, n, n * gpu.memory_bytes) for gpu in options.gpus for n in [deployable_count(math.ceil(floor / gpu.memory_bytes))]),
        key=lambda config: (config.count, -config.memory_bytes),
    )
    chosen = configs[0] if configs else None
    kv = kv_classic = None
    if facts.kv_bytes_per_token is not None:
        kv = kv_per_user(facts.kv_bytes_per_token, facts.fixed_state_bytes)
    elif facts.classic_example is not None:
        kv_classic = kv_per_user(classic_kv_bytes_per_token(*facts.classic_example))
    own = (chosen.count, options.hours_per_day) if chosen and options.hours_per_day is not None else None
    rental = rental_scenarios(options.rate_usd_per_gpu_hour, own)
    monthly = options.monthly_cost_usd
    if monthly is None and chosen is not None:
        hours = 720 * (options.hours_per_day if options.hours_per_day is not None else 24) / 24
        monthly = chosen.count * hours * options.rate_usd_per_gpu_hour
    even = None
    if options.api_prices is not None and monthly is not None:
        even = break_even(monthly, options.api_prices, input_share=options.input_share, cache_hit=options.cache_hit)
    download_bytes = facts.shipped_bytes or with_scales
    return TierPlan(
        facts=facts,
        precision=precision,
        weights_bytes=weights,
        weights_with_scales_bytes=with_scales,
        weights_by_precision=weights_by_precision(facts.params, precisions),
        gpus_for_weights=gpus_for_weights(weights, options.gpus),
        serving_floor_bytes=floor,
        serving_floor_published=floor_published,
        serving_configs=configs,
        chosen=chosen,
        kv_per_user=kv,
        kv_classic_example=kv_classic,
        rental=rental,
        break_even=even,
        volume_verdict=_volume_verdict(options, even),
        download=download_seconds(download_bytes, options.bandwidths_bytes_per_s),
        disk_bytes=facts.disk_to_plan_bytes or download_bytes,
        launch=_launch(facts, options, chosen.count) if chosen else {},
        health=_health(options),
        options=options,
    )

"""``tierlocal plan``: assemble the tier-1 / tier-3 answer for one model from facts and
options. Pure: the CLI resolves the model and the recipes, this module only computes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..errors import UsageError
from ..units import format_count, format_decimal_bytes
from .arithmetic import (
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
    rental_scenarios,
    weights_by_precision,
    weights_bytes,
)
from .launch import ENGINES, LaunchRecipe, launch_recipe_from, node_command, runnable_topology
from .throughput import ClusterShape, ClusterThroughput, PublishedThroughput, cluster_throughput

__all__ = ["ModelFacts", "PlanOptions", "ServingConfig", "TierPlan", "build_plan", "headline", "KV_MEASURE_PROCEDURE", "deployable_count"]

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
    vllm_notes: dict[str, str] = field(default_factory=dict)
    #: The engines' published launch flags (None: a model without a recipe gets plain defaults).
    launch_recipe: LaunchRecipe | None = None
    sources: tuple[str, ...] = ()
    #: Routed experts per layer and per token (None: dense or not published); engines' published decode per user.
    experts: int | None = None
    experts_per_token: int | None = None
    published_throughput: tuple[PublishedThroughput, ...] = ()


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
    #: The dated on-demand range the rate sits in (USD per GPU-hour), when known.
    rate_range_usd_per_gpu_hour: tuple[float, float] | None = None
    #: Racks sold as one system (GB300 NVL72): shown beside the clusters that clear the floor.
    racks: tuple[PublishedConfig, ...] = ()


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
    #: Why the published recipe cannot launch the chosen cluster (None: it can, or none was chosen).
    launch_refused: str | None = None
    #: What the chosen cluster gives its users at once (None: no cluster, bandwidth or cache size known).
    throughput: ClusterThroughput | None = None

    def to_json(self) -> dict[str, object]:
        """The plan as one JSON object (sizes in bytes, money in USD, time in seconds)."""
        facts, options = self.facts, self.options
        return {
            "headline": headline(self),
            **self._weights_json(),
            **self._clusters_json(),
            "guidance": facts.guidance,
            "rental": [
                {"label": r.label, "gpus": r.gpus, "hours_per_month": r.hours_per_month, "usd_per_month": r.usd_per_month} for r in self.rental
            ],
            "rate_usd_per_gpu_hour": options.rate_usd_per_gpu_hour,
            "rate_range_usd_per_gpu_hour": list(options.rate_range_usd_per_gpu_hour) if options.rate_range_usd_per_gpu_hour else None,
            "break_even": self._break_even_json(),
            "volume": self.volume_verdict,
            "download": [{"bandwidth_bytes_per_s": bandwidth, "seconds": seconds} for bandwidth, seconds in self.download],
            "disk_bytes": self.disk_bytes,
            "launch": self.launch,
            "launch_refused": self.launch_refused,
            "health": self.health,
            "throughput": None if self.throughput is None else self.throughput.to_json(),
            "sources": [*facts.sources, *options.sources],
            **self._kv_json(),
        }

    def _weights_json(self) -> dict[str, object]:
        """The model, and its weights at each precision."""
        facts = self.facts
        return {
            "model": {
                "name": facts.name,
                "params": facts.params,
                "active_params": facts.active_params,
                "precision": self.precision.name,
                "bytes_per_weight": self.precision.bytes_per_weight,
                "weights_bytes": self.weights_bytes,
                "weights_with_block_scales_bytes": self.weights_with_scales_bytes,
                "shipped_bytes": facts.shipped_bytes,
                "layers": facts.layers,
                "context_length": facts.context_length,
            },
            "weights_by_precision": [
                {
                    "precision": line.precision,
                    "bytes_per_weight": line.bytes_per_weight,
                    "weights_bytes": line.weights_bytes,
                    "with_block_scales_bytes": line.with_scales_bytes,
                }
                for line in self.weights_by_precision
            ],
        }

    def _clusters_json(self) -> dict[str, object]:
        """GPUs to hold the weights, the serving floor, and the clusters and racks that clear it."""
        floor = self.serving_floor_bytes
        return {
            "gpus_for_weights": [asdict(count) for count in self.gpus_for_weights],
            "serving_floor_bytes": floor,
            "serving_floor_published": self.serving_floor_published,
            "serving_configs": [{"gpu": c.gpu, "count": c.count, "memory_bytes": c.total_bytes} for c in self.serving_configs],
            "published_configs": [
                {"label": c.label, "gpu": c.gpu, "count": c.count, "memory_bytes": c.memory_bytes} for c in self.facts.published_configs
            ],
            "racks": [
                {"name": r.label, "gpu": r.gpu, "count": r.count, "memory_bytes": r.memory_bytes, "clears_floor": r.memory_bytes >= floor}
                for r in self.options.racks
            ],
        }

    def _kv_json(self) -> dict[str, object]:
        """The cache per user where the attention design is known; else why not, and how to measure it."""
        facts = self.facts
        if self.kv_per_user is not None:
            return {
                "kv_per_user": [{"ctx": ctx, "bytes": n} for ctx, n in self.kv_per_user],
                "kv_bytes_per_token": facts.kv_bytes_per_token,
                "fixed_state_bytes_per_user": facts.fixed_state_bytes,
            }
        payload: dict[str, object] = {
            "kv_unknown_reason": facts.kv_unknown_reason or "the attention design is not known",
            "kv_measure_procedure": KV_MEASURE_PROCEDURE,
        }
        if self.kv_classic_example is not None:
            payload["kv_classic_example"] = [{"ctx": ctx, "bytes": n} for ctx, n in self.kv_classic_example]
        return payload

    def _break_even_json(self) -> dict[str, object] | None:
        even = self.break_even
        if even is None:
            return None
        return {
            "monthly_cost_usd": even.monthly_cost_usd,
            "output_tokens_per_month": even.output_tokens_per_month,
            "blended_tokens_per_month": even.blended_tokens_per_month,
            "blended_usd_per_million": even.blended_usd_per_million,
            "output_tokens_per_day": even.output_tokens_per_day,
            "blended_tokens_per_day": even.blended_tokens_per_day,
            "input_share": even.input_share,
            "cache_hit": even.cache_hit,
            "api": self.options.api_name,
        }


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


def _launch(facts: ModelFacts, options: PlanOptions, chosen: ServingConfig, floor: int) -> tuple[dict[str, list[str]], str | None]:
    """Each engine's command on ``chosen`` (the head's, and the other nodes' when there are
    several), from the published recipe; or why the recipe cannot start it there."""
    recipe = facts.launch_recipe or launch_recipe_from(None)
    fewest = math.ceil(chosen.count / _GPUS_PER_NODE)
    per_node = chosen.count // fewest
    launch: dict[str, list[str]] = {}
    refusals: list[str] = []
    for engine in ENGINES:
        try:
            top = runnable_topology(recipe, engine, chosen.gpu, chosen.memory_bytes, fewest, per_node, "tensor", floor)
        except UsageError as refused:
            refusals.append(f"{engine}: {refused} ({refused.hint})")
            continue
        nodes = top.nodes
        launch[engine] = node_command(top, recipe, "head", model_path=options.model_path, port=options.port, head="<head-node-ip>").argv
        if nodes > 1:
            rank = "1" if nodes == 2 else f"<1..{nodes - 1}>"
            launch[f"{engine} (other nodes)"] = node_command(
                top, recipe, "worker", model_path=options.model_path, port=options.port, rank=rank, head="<head-node-ip>"
            ).argv
    return launch, "; ".join(refusals) or None


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
    return {
        "tokens_per_month": options.tokens_per_month,
        "api_usd_per_month": api_usd,
        "rent_usd_per_month": even.monthly_cost_usd,
        "cheaper": cheaper,
    }


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
        (
            ServingConfig(gpu.name, gpu.memory_bytes, n, n * gpu.memory_bytes)
            for gpu in options.gpus
            for n in [deployable_count(math.ceil(floor / gpu.memory_bytes))]
        ),
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
    launch, refused = _launch(facts, options, chosen, floor) if chosen else ({}, None)
    return TierPlan(
        facts=facts,
        precision=precision,
        weights_bytes=weights,
        weights_with_scales_bytes=with_scales,
        weights_by_precision=weights_by_precision(facts.params, precisions),
        gpus_for_weights=gpus_for_weights(weights, options.gpus, facts.shipped_bytes),
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
        launch=launch,
        health=_health(options),
        options=options,
        launch_refused=refused,
        throughput=_throughput(facts, options, chosen, weights),
    )


def _throughput(facts: ModelFacts, options: PlanOptions, chosen: ServingConfig | None, weights: int) -> ClusterThroughput | None:
    """The chosen cluster's users table, where its GPUs' bandwidth and the model's cache are known."""
    gpu = next((g for g in options.gpus if chosen and g.name == chosen.gpu), None)
    if chosen is None or gpu is None or not gpu.bandwidth_bytes_per_s or facts.kv_bytes_per_token is None:
        return None
    shape = ClusterShape(
        weights, facts.params, facts.active_params, facts.experts, facts.experts_per_token, facts.kv_bytes_per_token, facts.fixed_state_bytes
    )
    hourly = chosen.count * options.rate_usd_per_gpu_hour
    return cluster_throughput(shape, chosen.gpu, chosen.count, gpu.bandwidth_bytes_per_s, chosen.total_bytes, hourly, facts.published_throughput)


def headline(plan: TierPlan) -> str:
    """The answer in one line."""
    facts = plan.facts
    parts = [f"{facts.display_name} needs ≥ {format_decimal_bytes(plan.weights_bytes)} for weights alone"]
    if plan.gpus_for_weights:
        # The fewest-GPU options, one per memory size (B300 and MI355X hold the same).
        seen: set[int] = set()
        examples: list[str] = []
        for count in plan.gpus_for_weights:
            if count.memory_bytes not in seen and len(examples) < 4:
                seen.add(count.memory_bytes)
                examples.append(f"{count.count} × {count.gpu}")
        tier = "tier 1 (a cluster)" if plan.gpus_for_weights[0].count > 1 else "one GPU may do (tier 2)"
        parts.append(f": {tier}, ≥ {', '.join(examples)} just to hold them")
        fewest = plan.gpus_for_weights[0]
        if facts.shipped_bytes and fewest.shipped_count is not None and fewest.shipped_count != fewest.count:
            parts.append(f" ({fewest.shipped_count} × {fewest.gpu} for the {format_decimal_bytes(facts.shipped_bytes)} of files as shipped)")
    even = plan.break_even
    if even is not None:
        parts.append(
            f"; or tier 3 (the API), cheaper until {format_count(even.blended_tokens_per_month)} tokens/month "
            f"(blended; {format_count(even.output_tokens_per_month)} if all output) against ${even.monthly_cost_usd:,.0f}/month of rental"
        )
    if plan.volume_verdict is not None:
        verdict = plan.volume_verdict
        cheaper = "the API" if verdict["cheaper"] == "api" else "renting"
        parts.append(f". At {format_count(float(verdict['tokens_per_month']))} tokens/month {cheaper} is cheaper")
    return "".join(parts) + "."

"""``tierlocal plan`` output: the JSON object (a documented contract) and the human report."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from .plan import KV_MEASURE_PROCEDURE, TierPlan
from .units import format_bytes, format_count, format_decimal_bytes, format_duration

__all__ = ["plan_json", "render_plan", "headline"]


def plan_json(plan: TierPlan) -> dict[str, object]:
    """The plan as one JSON object (sizes in bytes, money in USD, time in seconds)."""
    facts, options, even = plan.facts, plan.options, plan.break_even
    payload: dict[str, object] = {
        "headline": headline(plan),
        "model": {
            "name": facts.name,
            "params": facts.params,
            "active_params": facts.active_params,
            "precision": plan.precision.name,
            "bytes_per_weight": plan.precision.bytes_per_weight,
            "weights_bytes": plan.weights_bytes,
            "weights_with_block_scales_bytes": plan.weights_with_scales_bytes,
            "shipped_bytes": facts.shipped_bytes,
            "layers": facts.layers,
            "context_length": facts.context_length,
        },
        "weights_by_precision": [
            {"precision": line.precision, "bytes_per_weight": line.bytes_per_weight, "weights_bytes": line.weights_bytes, "with_block_scales_bytes": line.with_scales_bytes}
            for line in plan.weights_by_precision
        ],
        "gpus_for_weights": [{"gpu": c.gpu, "memory_bytes": c.memory_bytes, "count": c.count} for c in plan.gpus_for_weights],
        "serving_floor_bytes": plan.serving_floor_bytes,
        "serving_floor_published": plan.serving_floor_published,
        "serving_configs": [{"gpu": c.gpu, "count": c.count, "memory_bytes": c.total_bytes} for c in plan.serving_configs],
        "published_configs": [{"label": c.label, "gpu": c.gpu, "count": c.count, "memory_bytes": c.memory_bytes} for c in facts.published_configs],
        "guidance": facts.guidance,
        "rental": [{"label": r.label, "gpus": r.gpus, "hours_per_month": r.hours_per_month, "usd_per_month": r.usd_per_month} for r in plan.rental],
        "rate_usd_per_gpu_hour": options.rate_usd_per_gpu_hour,
        "break_even": None
        if even is None
        else {
            "monthly_cost_usd": even.monthly_cost_usd,
            "output_tokens_per_month": even.output_tokens_per_month,
            "blended_tokens_per_month": even.blended_tokens_per_month,
            "blended_usd_per_million": even.blended_usd_per_million,
            "output_tokens_per_day": even.output_tokens_per_day,
            "blended_tokens_per_day": even.blended_tokens_per_day,
            "input_share": even.input_share,
            "cache_hit": even.cache_hit,
            "api": options.api_name,
        },
        "volume": plan.volume_verdict,
        "download": [{"bandwidth_bytes_per_s": bandwidth, "seconds": seconds} for bandwidth, seconds in plan.download],
        "disk_bytes": plan.disk_bytes,
        "launch": plan.launch,
        "health": plan.health,
        "sources": [*facts.sources, *options.sources],
    }
    if plan.kv_per_user is not None:
        payload["kv_per_user"] = [{"ctx": ctx, "bytes": n} for ctx, n in plan.kv_per_user]
    else:
        payload["kv_unknown_reason"] = facts.kv_unknown_reason or "the attention design is not known"
        payload["kv_measure_procedure"] = KV_MEASURE_PROCEDURE
        if plan.kv_classic_example is not None:
            payload["kv_classic_example"] = [{"ctx": ctx, "bytes": n} for ctx, n in plan.kv_classic_example]
    return payload


def _tokens(count: float) -> str:
    return format_count(count)


def headline(plan: TierPlan) -> str:
    """The answer in one line."""
    facts = plan.facts
    parts = [f"{facts.display_name} needs ≥ {format_decimal_bytes(plan.weights_bytes)} for weights alone"]
    if plan.gpus_for_weights:
        # The fewest-GPU options, one per memory size (B300 and MI355X hold the same).
        seen: set[int] = set()
        examples = []
        for count in plan.gpus_for_weights:
            if count.memory_bytes not in seen and len(examples) < 4:
                seen.add(count.memory_bytes)
                examples.append(f"{count.count} × {count.gpu}")
        tier = "tier 1 (a cluster)" if plan.gpus_for_weights[0].count > 1 else "one GPU may do (tier 2)"
        parts.append(f": {tier}, ≥ {', '.join(examples)} just to hold them")
    even = plan.break_even
    if even is not None:
        parts.append(
            f"; or tier 3 (the API), cheaper until {_tokens(even.blended_tokens_per_month)} tokens/month "
            f"(blended; {_tokens(even.output_tokens_per_month)} if all output) against ${even.monthly_cost_usd:,.0f}/month of rental"
        )
    if plan.volume_verdict is not None:
        verdict = plan.volume_verdict
        cheaper = "the API" if verdict["cheaper"] == "api" else "renting"
        parts.append(f". At {_tokens(float(verdict['tokens_per_month']))} tokens/month {cheaper} is cheaper")
    return "".join(parts) + "."


def _table(*columns: str) -> Table:
    table = Table()
    for column in columns:
        table.add_column(column)
    return table


def render_plan(plan: TierPlan, *, show_sources: bool) -> None:
    """The human report, in the order the questions come."""
    console = Console(highlight=False, width=None if Console().is_terminal else 120)
    facts, options = plan.facts, plan.options
    console.print(f"[bold]{headline(plan)}[/bold]")
    console.print(
        f"{facts.display_name}: {format_count(facts.params)} parameters, {format_count(facts.active_params)} active per token; "
        f"shipped as {plan.precision.name}" + (f" ({format_decimal_bytes(facts.shipped_bytes)})" if facts.shipped_bytes else "")
    )

    weights = _table("precision", "bytes/weight", "weights", "with block scales")
    for line in plan.weights_by_precision:
        scales = format_decimal_bytes(line.with_scales_bytes) if line.with_scales_bytes != line.weights_bytes else "-"
        weights.add_row(line.precision, f"{line.bytes_per_weight:g}", format_decimal_bytes(line.weights_bytes), scales)
    console.print("1. Weights by precision (decimal units)")
    console.print(weights)

    counts = _table("GPU", "memory", "GPUs to hold the weights (a floor, not a target)")
    for count in plan.gpus_for_weights:
        counts.add_row(count.gpu, format_bytes(count.memory_bytes), str(count.count))
    console.print(f"2. GPUs just to hold {format_decimal_bytes(plan.weights_bytes)} of {plan.precision.name} weights")
    console.print(counts)
    floor_kind = "published" if plan.serving_floor_published else "weights + KV at 32k for one user + 2 GiB overhead"
    console.print(f"   Serving floor {format_decimal_bytes(plan.serving_floor_bytes)} ({floor_kind}); clusters that clear it:")
    configs = _table("GPU", "count", "memory")
    for config in plan.serving_configs:
        configs.add_row(config.gpu, str(config.count), f"{format_decimal_bytes(config.total_bytes)} ({format_bytes(config.total_bytes)})")
    console.print(configs)
    for published in facts.published_configs:
        console.print(f"   published: {published.label} ({format_decimal_bytes(published.memory_bytes)})")
    for key, text in facts.guidance.items():
        console.print(f"   guidance ({key}): {text}")

    console.print("3. KV cache per concurrent user")
    if plan.kv_per_user is not None:
        console.print("   " + ", ".join(f"{ctx:,} tokens: {format_decimal_bytes(n)}" for ctx, n in plan.kv_per_user))
    else:
        console.print(f"   Not computed: {facts.kv_unknown_reason or 'the attention design is not known'}.")
        if plan.kv_classic_example is not None and facts.classic_example is not None:
            layers, kv_heads, head_dim, _ = facts.classic_example
            example = ", ".join(f"{ctx:,}: {format_decimal_bytes(n)}" for ctx, n in plan.kv_classic_example)
            console.print(f"   For comparison only, the classic formula for {layers} layers × {kv_heads} KV heads × {head_dim}: {example}.")
        console.print(f"   Measure it: {KV_MEASURE_PROCEDURE}")

    rental = _table("scenario", "GPUs", "hours/month", "USD/month")
    for line in plan.rental:
        rental.add_row(line.label, str(line.gpus), f"{line.hours_per_month:g}", f"${line.usd_per_month:,.0f}")
    console.print(f"4. Rental at ${options.rate_usd_per_gpu_hour:g} per GPU-hour (a month is 720 h; idle GPUs bill the same)")
    console.print(rental)

    even = plan.break_even
    console.print("5. Break-even against the hosted API")
    if even is None:
        console.print("   No API prices for this model in recipes/apis.toml.")
    else:
        console.print(
            f"   Cluster ${even.monthly_cost_usd:,.0f}/month vs {options.api_name}: output-only {_tokens(even.output_tokens_per_month)} "
            f"tokens/month ({_tokens(even.output_tokens_per_day)}/day); blended at ${even.blended_usd_per_million:.2f}/M "
            f"({even.input_share:.0%} input, {even.cache_hit:.0%} of it cached) {_tokens(even.blended_tokens_per_month)} "
            f"tokens/month ({_tokens(even.blended_tokens_per_day)}/day). Below that, the API is cheaper."
        )
        if plan.volume_verdict is not None:
            verdict = plan.volume_verdict
            console.print(
                f"   At {_tokens(float(verdict['tokens_per_month']))} tokens/month: API ${float(verdict['api_usd_per_month']):,.0f} vs "
                f"rent ${float(verdict['rent_usd_per_month']):,.0f} → {'the API' if verdict['cheaper'] == 'api' else 'renting'} is cheaper."
            )

    download = ", ".join(f"{format_decimal_bytes(bw)}/s: {format_duration(seconds)}" for bw, seconds in plan.download)
    console.print(f"6. Download: {download}; plan {format_decimal_bytes(plan.disk_bytes)} of fast disk on a volume that outlives the instance.")

    if plan.launch and plan.chosen is not None:
        console.print(f"7. Tier-1 launch on {plan.chosen.count} × {plan.chosen.gpu}:")
        for engine, argv in plan.launch.items():
            console.print(f"   {engine}: {shlex.join(argv)}")
        for key, text in facts.vllm_notes.items():
            console.print(f"   vLLM {key.replace('_', ' ')}: {text}")
        console.print("   Before traffic: " + "; ".join(plan.health))
    if show_sources:
        console.print("Sources:")
        for source in (*facts.sources, *options.sources):
            console.print(f"   {source}")

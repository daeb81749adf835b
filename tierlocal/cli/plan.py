"""``tierlocal plan``: resolve the model and the recipes, build the tier-1 / tier-3 plan, print
the report (or its ``--json``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from .. import constants
from ..catalog import ApiEntry, GpuSpec, RentalDefaults, load_apis, load_precisions, load_racks, load_rental_defaults
from ..errors import UsageError
from ..tiers.arithmetic import PublishedConfig
from ..tiers.facts import gpu_options, resolve_model_facts
from ..tiers.launch import ENGINES, LAYOUTS, shell_line
from ..tiers.plan import KV_MEASURE_PROCEDURE, ModelFacts, PlanOptions, TierPlan, build_plan, headline
from ..units import format_bytes, format_count, format_decimal_bytes, format_duration, format_marketed_bytes, parse_bandwidth, parse_count
from .common import console, print_json
from .launch_spec import EMITS, EmitOptions, emit_spec

__all__ = ["plan", "render_plan"]


class _PrecisionChoice(click.Choice):
    """The precisions in recipes/precisions.toml, read when help or parsing needs them rather
    than when the module is imported."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(precision.name for precision in load_precisions())

    @choices.setter
    def choices(self, _value: object) -> None:
        """click.Choice sets its choices in __init__; these come from recipes/ instead."""


def _shares(input_share: float | None, output_share: float | None) -> float:
    if input_share is not None and output_share is not None and abs(input_share + output_share - 1) > 1e-9:
        raise UsageError("--input-share and --output-share must add up to 1", hint="give one of them; the other is the rest")
    if input_share is not None:
        return input_share
    if output_share is not None:
        return 1 - output_share
    return constants.DEFAULT_INPUT_SHARE


def _sources(rental: RentalDefaults, rate: float | None, specs: list[GpuSpec], api: ApiEntry | None) -> list[str]:
    """Where each figure of the plan comes from, with its date (``plan --sources``)."""
    sources = [f"rental: {rental.source} ({rental.date})" if rate is None else f"rental: --rate {rate:g} USD/GPU-h (yours)"]
    sources += [
        f"{spec.name}: {format_marketed_bytes(spec.marketed_bytes or spec.memory_bytes)} (marketed), recipes/gpus.toml ({spec.spec_date})"
        for spec in specs
    ]
    sources.append("bytes per weight: recipes/precisions.toml (OCP MX v1.0 for MXFP4, OCP OFP8 for fp8, 2023)")
    if api is not None:
        sources.append(f"API prices: {api.source} ({api.prices_date})")
    return sources


@click.command()
@click.argument("model")
@click.option("--params", help="Total parameters, e.g. 2.8T (overrides what MODEL says).")
@click.option("--active", help="Active parameters per token, e.g. 104B.")
@click.option("--precision", type=_PrecisionChoice(), help="Weight precision to size for (default: the shipped one).")
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME|SIZE",
    help="GPU to size with: a name from recipes/gpus.toml or a size (96GB). Repeatable. Default: the datacenter GPUs.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0, min_open=True),
    help="USD per GPU-hour (default: the guides' $2.50, in the dated $2-5 range of recipes/gpus.toml).",
)
@click.option(
    "--hours-per-day", type=click.FloatRange(0, 24, min_open=True), help="Hours a day the cluster runs (adds your own scenario; default always on)."
)
@click.option("--input-share", type=click.FloatRange(0, 1), help=f"Share of tokens that are input (default {constants.DEFAULT_INPUT_SHARE}).")
@click.option("--output-share", type=click.FloatRange(0, 1), help="Share of tokens that are output.")
@click.option(
    "--cache-hit",
    type=click.FloatRange(0, 1),
    default=constants.DEFAULT_CACHE_HIT,
    show_default=True,
    help="Share of input tokens that hit the API's cache.",
)
@click.option("--tokens-per-month", help="Your volume, e.g. 2B: gives the verdict for it.")
@click.option(
    "--monthly-cost", type=click.FloatRange(0, min_open=True), help="Cluster cost per month in USD for the break-even (e.g. a provider's quote)."
)
@click.option("--bandwidth", "bandwidths", multiple=True, help="Download bandwidth, e.g. 1GB/s or 10Gbit/s. Repeatable.")
@click.option("--model-path", default="<path-or-repo-of-the-weights>", show_default=True, help="Weights path or repo for the launch commands.")
@click.option("--sources", "show_sources", is_flag=True, help="List the dated sources of every fact used.")
@click.option(
    "--emit", type=click.Choice(EMITS), help="Write the cluster's launch spec instead of the report: a SkyPilot task or a Kubernetes LeaderWorkerSet."
)
@click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True, help="The engine --emit starts.")
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default="tensor",
    show_default=True,
    help="--emit: tensor (and pipeline) parallel, or data + expert parallel.",
)
@click.option("--nodes", type=click.IntRange(1, 64), help="--emit: nodes of the GPU (default: the fewest that serve the model).")
@click.option("--gpus-per-node", type=click.IntRange(1, 16), default=8, show_default=True, help="--emit: GPUs in each node.")
@click.option("--volume", help="--emit: the bucket (SkyPilot) or PersistentVolumeClaim (Kubernetes) that keeps the weights.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report (with --emit: the spec as JSON).")
def plan(
    model: str,
    params: str | None,
    active: str | None,
    precision: str | None,
    gpus: tuple[str, ...],
    rate: float | None,
    hours_per_day: float | None,
    input_share: float | None,
    output_share: float | None,
    cache_hit: float,
    tokens_per_month: str | None,
    monthly_cost: float | None,
    bandwidths: tuple[str, ...],
    model_path: str,
    show_sources: bool,
    as_json: bool,
    **emit_args: Any,
) -> None:
    """Size a model that does not fit one machine: GPUs (tier 1), cost, and when the hosted
    API (tier 3) is cheaper.

    MODEL is a name from recipes (kimi-k3, llama-3.3-70b, ...), a GGUF source as for
    `inspect`, or hf://OWNER/REPO of a safetensors repo (metadata requests only).

    \b
    Examples:
      tierlocal plan kimi-k3
      tierlocal plan kimi-k3 --gpu H200 --rate 3.5 --tokens-per-month 2B
      tierlocal plan hf://OWNER/REPO --precision fp8 --json
      tierlocal plan kimi-k3 --emit skypilot --gpu H200 > k3.sky.yaml
      tierlocal plan kimi-k3 --emit lws --engine sglang --gpu H100 | kubectl apply -f -
    """
    facts = _facts(model, params, active, precision)
    (gpu_options_, specs), rental = gpu_options(gpus), load_rental_defaults()
    api = next((entry for entry in load_apis() if entry.model == facts.name), None)
    options = PlanOptions(
        gpus=gpu_options_,
        rate_usd_per_gpu_hour=rate if rate is not None else rental.default,
        rate_range_usd_per_gpu_hour=(rental.low, rental.high),
        racks=tuple(PublishedConfig(rack.name, rack.gpu, rack.count, rack.memory_bytes) for rack in load_racks() if not gpus),
        input_share=_shares(input_share, output_share),
        cache_hit=cache_hit,
        bandwidths_bytes_per_s=tuple(parse_bandwidth(text) for text in (bandwidths or constants.DEFAULT_DOWNLOAD_BANDWIDTHS)),
        hours_per_day=hours_per_day,
        tokens_per_month=float(parse_count(tokens_per_month)) if tokens_per_month else None,
        monthly_cost_usd=monthly_cost,
        api_prices=api.prices if api else None,
        api_name=f"{api.name} {api.model_id}" if api else None,
        model_path=model_path,
        sources=tuple(_sources(rental, rate, specs, api)),
    )
    result = build_plan(facts, options, load_precisions())
    if emit_args["emit"] is not None:  # --emit, --engine, --layout, --nodes, --gpus-per-node, --volume
        emit_spec(result, EmitOptions(**emit_args), as_json=as_json)
    elif as_json:
        print_json(result.to_json())
    else:
        render_plan(result, show_sources=show_sources)


def _facts(model: str, params: str | None, active: str | None, precision: str | None) -> ModelFacts:
    """What is known about MODEL, with the parameter counts and precision the user gave."""
    facts = resolve_model_facts(model)
    overrides: dict[str, object] = {}
    if params is not None:
        overrides["params"] = parse_count(params)
    if active is not None:
        overrides["active_params"] = parse_count(active)
    if precision is not None:
        overrides["precision"] = precision
    if overrides:
        facts = replace(facts, **overrides)  # type: ignore[arg-type]
    if facts.active_params > facts.params:
        raise UsageError(f"active parameters ({facts.active_params:,}) exceed total ({facts.params:,})", hint="check --active and --params")
    return facts


def _table(*columns: str) -> Table:
    table = Table()
    for column in columns:
        table.add_column(column)
    return table


def render_plan(plan: TierPlan, *, show_sources: bool) -> None:
    """The human report, in the order the questions come."""
    out = console()
    facts = plan.facts
    out.print(f"[bold]{headline(plan)}[/bold]")
    out.print(
        f"{facts.display_name}: {format_count(facts.params)} parameters, {format_count(facts.active_params)} active per token; "
        f"shipped as {plan.precision.name}" + (f" ({format_decimal_bytes(facts.shipped_bytes)})" if facts.shipped_bytes else "")
    )
    _print_weights(out, plan)
    _print_kv(out, plan)
    _print_costs(out, plan)
    download = ", ".join(f"{format_decimal_bytes(bw)}/s: {format_duration(seconds)}" for bw, seconds in plan.download)
    out.print(f"6. Download: {download}; plan {format_decimal_bytes(plan.disk_bytes)} of fast disk on a volume that outlives the instance.")
    if plan.launch and plan.chosen is not None:
        out.print(f"7. Tier-1 launch on {plan.chosen.count} × {plan.chosen.gpu}:")
        for engine, argv in plan.launch.items():
            out.print(f"   {engine}: {shell_line(argv)}", soft_wrap=True, markup=False, highlight=False)
        for key, text in facts.vllm_notes.items():
            out.print(f"   vLLM {key.replace('_', ' ')}: {text}", markup=False)
        out.print(
            f"   As a launch spec for every node: tierlocal plan {facts.name} --emit skypilot|lws [--engine sglang] [--gpu NAME --nodes N]",
            markup=False,
        )
        if plan.launch_refused:
            out.print(f"   Not launched as planned: {plan.launch_refused}", markup=False)
        out.print("   Before traffic: " + "; ".join(plan.health))
    elif plan.launch_refused:
        out.print(f"7. Tier-1 launch: {plan.launch_refused}", markup=False)
    if show_sources:
        out.print("Sources:")
        for source in (*facts.sources, *plan.options.sources):
            out.print(f"   {source}")


def _print_weights(out: Console, plan: TierPlan) -> None:
    """1. weights by precision; 2. GPUs to hold them, the serving floor and the clusters that clear it."""
    weights = _table("precision", "bytes/weight", "weights", "with block scales")
    for line in plan.weights_by_precision:
        scales = format_decimal_bytes(line.with_scales_bytes) if line.with_scales_bytes != line.weights_bytes else "-"
        weights.add_row(line.precision, f"{line.bytes_per_weight:g}", format_decimal_bytes(line.weights_bytes), scales)
    out.print("1. Weights by precision (decimal units)")
    out.print(weights)
    shipped = plan.facts.shipped_bytes
    shipped_header = [f"files as shipped ({format_decimal_bytes(shipped)})"] if shipped else []
    counts = _table("GPU", "memory", "weights (the guides' floor)", *shipped_header, "usable (driver)", "weights by usable")
    for count in plan.gpus_for_weights:
        usable = format_bytes(count.usable_bytes) if count.usable_bytes else "-"
        differs = str(count.usable_count) if count.usable_count is not None and count.usable_count != count.count else ""
        shipped_cell = [str(count.shipped_count)] if shipped else []
        counts.add_row(count.gpu, format_marketed_bytes(count.memory_bytes), str(count.count), *shipped_cell, usable, differs)
    out.print(f"2. GPUs just to hold {format_decimal_bytes(plan.weights_bytes)} of {plan.precision.name} weights (a floor, not a target)")
    out.print(counts)
    out.print(
        "   Counted as the guides count: bytes ÷ the card's marketed memory (decimal GB), rounded up"
        + (", for the weights alone and for the files as shipped" if shipped else "")
        + ". usable: what the driver reports (GiB), where a reading is on record; its count is shown where it differs."
    )
    floor_kind = "published" if plan.serving_floor_published else "weights + KV at 32k for one user + 2 GiB overhead"
    out.print(f"   Serving floor {format_decimal_bytes(plan.serving_floor_bytes)} ({floor_kind}); clusters that clear it:")
    configs = _table("GPU", "count", "memory")
    for config in plan.serving_configs:
        configs.add_row(config.gpu, str(config.count), f"{format_decimal_bytes(config.total_bytes)} ({format_bytes(config.total_bytes)})")
    out.print(configs)
    for rack in plan.options.racks:
        verdict = "clears it" if rack.memory_bytes >= plan.serving_floor_bytes else "does not clear it"
        out.print(f"   rack: {rack.label}, {rack.count} × {rack.gpu}, {format_decimal_bytes(rack.memory_bytes)} ({verdict})")
    for published in plan.facts.published_configs:
        out.print(f"   published: {published.label} ({format_decimal_bytes(published.memory_bytes)})")
    for key, text in plan.facts.guidance.items():
        out.print(f"   guidance ({key}): {text}")


def _print_kv(out: Console, plan: TierPlan) -> None:
    """3. KV cache per concurrent user, or why it is not computed and how to measure it."""
    facts = plan.facts
    out.print("3. KV cache per concurrent user")
    if plan.kv_per_user is not None:
        out.print("   " + ", ".join(f"{ctx:,} tokens: {format_decimal_bytes(n)}" for ctx, n in plan.kv_per_user))
        if facts.fixed_state_bytes and facts.kv_bytes_per_token is not None:
            out.print(
                f"   = {format_decimal_bytes(round(facts.kv_bytes_per_token))} per token of context (attention layers) + "
                f"{format_decimal_bytes(facts.fixed_state_bytes)} of recurrent state per user, whatever the context (linear-attention layers)."
            )
        return
    out.print(f"   Not computed: {facts.kv_unknown_reason or 'the attention design is not known'}.")
    if plan.kv_classic_example is not None and facts.classic_example is not None:
        layers, kv_heads, head_dim, _ = facts.classic_example
        example = ", ".join(f"{ctx:,}: {format_decimal_bytes(n)}" for ctx, n in plan.kv_classic_example)
        out.print(f"   For comparison only, the classic formula for {layers} layers × {kv_heads} KV heads × {head_dim}: {example}.")
    out.print(f"   Measure it: {KV_MEASURE_PROCEDURE}")


def _print_costs(out: Console, plan: TierPlan) -> None:
    """4. rental scenarios; 5. break-even against the hosted API, and the verdict for a volume."""
    options = plan.options
    rental = _table("scenario", "GPUs", "hours/month", "USD/month")
    for line in plan.rental:
        rental.add_row(line.label, str(line.gpus), f"{line.hours_per_month:g}", f"${line.usd_per_month:,.0f}")
    span = options.rate_range_usd_per_gpu_hour
    on_demand = f"on demand ${span[0]:g}–{span[1]:g} in 2026; " if span else ""
    out.print(f"4. Rental at ${options.rate_usd_per_gpu_hour:.2f} per GPU-hour ({on_demand}a month is 720 h; idle GPUs bill the same)")
    out.print(rental)
    even = plan.break_even
    out.print("5. Break-even against the hosted API")
    if even is None:
        out.print("   No API prices for this model in recipes/apis.toml.")
        return
    out.print(
        f"   Cluster ${even.monthly_cost_usd:,.0f}/month vs {options.api_name}: output-only {format_count(even.output_tokens_per_month)} "
        f"tokens/month ({format_count(even.output_tokens_per_day)}/day); blended at ${even.blended_usd_per_million:.2f}/M "
        f"({even.input_share:.0%} input, {even.cache_hit:.0%} of it cached) {format_count(even.blended_tokens_per_month)} "
        f"tokens/month ({format_count(even.blended_tokens_per_day)}/day). Below that, the API is cheaper."
    )
    _print_throughput(out, plan)
    if plan.volume_verdict is not None:
        verdict = plan.volume_verdict
        out.print(
            f"   At {format_count(float(verdict['tokens_per_month']))} tokens/month: API ${float(verdict['api_usd_per_month']):,.0f} vs "
            f"rent ${float(verdict['rent_usd_per_month']):,.0f} → {'the API' if verdict['cheaper'] == 'api' else 'renting'} is cheaper."
        )


def _print_throughput(out: Console, plan: TierPlan) -> None:
    """The chosen cluster's users at once, and how many it takes busy to make the break-even volume."""
    throughput, even = plan.throughput, plan.break_even
    if throughput is None:
        return
    anchor = throughput.anchor
    kept = f"each step at least {anchor.engine}'s published one-user step on {anchor.gpus} GPUs" if anchor else "bandwidth only (a bound)"
    out.print(
        f"   Users at once on {throughput.gpus} × {throughput.gpu} ({throughput.max_users or '?'} caches of 4k tokens fit; {kept}; "
        "decode after the first token):"
    )
    table = _table("users", "each, tok/s", "all, tok/s", "USD per M output", "basis")
    for row in throughput.rows:
        usd = "-" if row.usd_per_million_output_tokens is None else f"${row.usd_per_million_output_tokens:,.2f}"
        table.add_row(str(row.users), f"{row.per_user_decode_tokens_per_s:,.1f}", f"{row.aggregate_decode_tokens_per_s:,.0f}", usd, row.basis)
    out.print(table)
    hours_per_day = plan.options.hours_per_day if plan.options.hours_per_day is not None else 24.0
    if even is None or hours_per_day <= 0:
        return
    needed = even.output_tokens_per_month / (720 * 3600 * hours_per_day / 24)  # tokens/s over the hours it runs
    busy = next((row for row in throughput.rows if row.aggregate_decode_tokens_per_s >= needed), None)
    out.print(
        f"   The output-only break-even is {needed:,.0f} tok/s while the cluster runs: "
        + (f"{busy.users} users decoding at once make it." if busy else "more than the users above make: the API stays cheaper.")
    )

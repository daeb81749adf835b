"""The ``tierlocal plan`` command: resolve the model and the recipes, build the plan, print it."""

from __future__ import annotations

import click

from ._plan_output import plan_json, render_plan
from ._render import print_json
from .catalog import GpuSpec, find_gpu, load_apis, load_gpus, load_precisions, load_rental_defaults
from .errors import UsageError
from .hardware import parse_gpu_override
from .plan import PlanOptions, build_plan
from .plan_sources import resolve_model_facts
from .tiers import GpuOption
from .units import parse_bandwidth, parse_count

__all__ = ["plan"]

_DEFAULT_BANDWIDTHS = ("125MB/s", "1GB/s", "10GB/s")
_DEFAULT_INPUT_SHARE = 0.75
_DEFAULT_CACHE_HIT = 0.5


def gpu_options(values: tuple[str, ...]) -> tuple[tuple[GpuOption, ...], list[GpuSpec]]:
    if values:
        devices = parse_gpu_override(values)
        unique = {device.name.split(" #")[0]: device.total_bytes for device in devices}
        named = [spec for name in unique if (spec := find_gpu(name)) is not None]
        return tuple(GpuOption(name, memory) for name, memory in unique.items()), named
    specs = [spec for spec in load_gpus() if spec.datacenter]
    return tuple(GpuOption(spec.name, spec.memory_bytes) for spec in specs), specs


def _shares(input_share: float | None, output_share: float | None) -> float:
    if input_share is not None and output_share is not None and abs(input_share + output_share - 1) > 1e-9:
        raise UsageError("--input-share and --output-share must add up to 1", hint="give one of them; the other is the rest")
    if input_share is not None:
        return input_share
    if output_share is not None:
        return 1 - output_share
    return _DEFAULT_INPUT_SHARE


@click.command()
@click.argument("model")
@click.option("--params", help="Total parameters, e.g. 2.8T (overrides what MODEL says).")
@click.option("--active", help="Active parameters per token, e.g. 104B.")
@click.option("--precision", type=click.Choice([p.name for p in load_precisions()]), help="Weight precision to size for (default: the shipped one).")
@click.option("--gpu", "gpus", multiple=True, metavar="NAME|SIZE", help="GPU to size with: a name from recipes/gpus.toml or a size (96GB). Repeatable. Default: the datacenter GPUs.")
@click.option("--rate", type=click.FloatRange(0, min_open=True), help="USD per GPU-hour (default: the low end of the dated range in recipes/gpus.toml).")
@click.option("--hours-per-day", type=click.FloatRange(0, 24, min_open=True), help="Hours a day the cluster runs (adds your own scenario; default always on).")
@click.option("--input-share", type=click.FloatRange(0, 1), help=f"Share of tokens that are input (default {_DEFAULT_INPUT_SHARE}).")
@click.option("--output-share", type=click.FloatRange(0, 1), help="Share of tokens that are output.")
@click.option("--cache-hit", type=click.FloatRange(0, 1), default=_DEFAULT_CACHE_HIT, show_default=True, help="Share of input tokens that hit the API's cache.")
@click.option("--tokens-per-month", help="Your volume, e.g. 2B: gives the verdict for it.")
@click.option("--monthly-cost", type=click.FloatRange(0, min_open=True), help="Cluster cost per month in USD for the break-even (e.g. a provider's quote).")
@click.option("--bandwidth", "bandwidths", multiple=True, help="Download bandwidth, e.g. 1GB/s or 10Gbit/s. Repeatable.")
@click.option("--model-path", default="<path-or-repo-of-the-weights>", show_default=True, help="Weights path or repo for the launch commands.")
@click.option("--sources", "show_sources", is_flag=True, help="List the dated sources of every fact used.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
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
    """
    facts = resolve_model_facts(model)
    overrides: dict[str, object] = {}
    if params is not None:
        overrides["params"] = parse_count(params)
    if active is not None:
        overrides["active_params"] = parse_count(active)
    if precision is not None:
        overrides["precision"] = precision
    if overrides:
        facts = facts.__class__(**{**facts.__dict__, **overrides})
    if facts.active_params > facts.params:
        raise UsageError(f"active parameters ({facts.active_params:,}) exceed total ({facts.params:,})", hint="check --active and --params")
    gpu_options_, specs = gpu_options(gpus)
    rental = load_rental_defaults()
    api = next((entry for entry in load_apis() if entry.model == facts.name), None)
    sources = [f"rental: {rental.source} ({rental.date})" if rate is None else f"rental: --rate {rate:g} USD/GPU-h (yours)"]
    sources += [f"{spec.name}: {spec.memory_bytes / 1024**3:g} GiB, recipes/gpus.toml ({spec.spec_date})" for spec in specs]
    sources.append("bytes per weight: recipes/precisions.toml (shared/MISSION.md, 2026-08)")
    if api is not None:
        sources.append(f"API prices: {api.source} ({api.prices_date})")
    options = PlanOptions(
        gpus=gpu_options_,
        rate_usd_per_gpu_hour=rate if rate is not None else rental.low,
        input_share=_shares(input_share, output_share),
        cache_hit=cache_hit,
        bandwidths_bytes_per_s=tuple(parse_bandwidth(text) for text in (bandwidths or _DEFAULT_BANDWIDTHS)),
        hours_per_day=hours_per_day,
        tokens_per_month=float(parse_count(tokens_per_month)) if tokens_per_month else None,
        monthly_cost_usd=monthly_cost,
        api_prices=api.prices if api else None,
        api_name=f"{api.name} {api.model_id}" if api else None,
        model_path=model_path,
        sources=tuple(sources),
    )
    result = build_plan(facts, options, load_precisions())
    if as_json:
        print_json(plan_json(result))
    else:
        render_plan(result, show_sources=show_sources)

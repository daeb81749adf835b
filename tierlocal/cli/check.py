"""``tierlocal check``: the catalog recommendation for this machine (no SOURCE), or the
per-device plan for one model (SOURCE), as tables or ``--json``."""

from __future__ import annotations

from dataclasses import replace

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import constants
from ..catalog import ModelEntry, find_model, load_host_defaults, load_models
from ..errors import UsageError
from ..fit.estimate import RunEstimate, RunRequest
from ..fit.host_memory import PROMPT_CACHE_DEFAULT_BYTES
from ..fit.memory import ContextParams
from ..gpu_figures import machine_gpu_speed
from ..hardware.types import Hardware
from ..measure.calibration_cache import calibration_key, load_calibration
from ..plan.machine import machine_for
from ..plan.recommend import PREFERENCES, PURPOSES
from ..plan.source import SourceCheck, check_source, parse_ctx, parse_parallel
from ..recommendation import catalog_recommendation, engine_version
from ..serve.bench import bench_device, bench_key, bench_path, measured_speed
from ..units import format_bytes
from .common import console, gpu_option, json_option, machine, ngl_option, planning_options, print_json, ram_options, read_projector
from .recommend_view import render_catalog_recommendation

__all__ = ["check", "render_source_check"]


@click.command()
@click.argument("source", required=False)
@gpu_option
@click.option(
    "--ctx",
    show_default=f"{constants.DEFAULT_CTX}, or the model's trained context if shorter",
    help="Context tokens per slot (llama-server's -c is that × --parallel), or 'max' with SOURCE.",
)
@click.option(
    "--parallel",
    default="1",
    show_default=True,
    help="Slots, each with its own KV cache; with SOURCE also 'auto' (llama-server's 4 unified) or 'max'.",
)
@ngl_option
@planning_options
@click.option(
    "--mmproj",
    "mmproj",
    metavar="FILE|URL",
    default=None,
    help="A multimodal projector (mmproj GGUF, header only) loaded beside SOURCE: its weights and compute buffer are planned on the device "
    "llama-server puts it on.",
)
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=constants.DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode speed, tokens/s, for the catalog recommendation (the best estimate: measured, calibrated or from published "
    "GPU results; else the bandwidth bound).",
)
@click.option(
    "--for",
    "purpose",
    type=click.Choice(PURPOSES),
    default="chat",
    show_default=True,
    help="What the catalog recommendation is for: the task whose published benchmarks score the models (docs/how-it-works/quality.md); "
    "long-context also plans 32k tokens and keeps models trained for 128k+.",
)
@click.option(
    "--prefer",
    type=click.Choice(list(PREFERENCES)),
    default="balanced",
    show_default=True,
    help="How the catalog recommendation weighs quality against speed: quality (speed only breaks ties), balanced (2 score points per doubling of "
    "tok/s), speed (8).",
)
@click.option("--all", "show_all", is_flag=True, help="List every catalog entry, not only the nearest ones.")
@ram_options
@json_option
def check(
    source: str | None,
    gpus: tuple[str, ...],
    ctx: str | None,
    parallel: str,
    ngl: int | None,
    n_cpu_moe: int | None,
    cache_type_k: str,
    cache_type_v: str,
    flash_attn: str,
    ubatch: int,
    mmproj: str | None,
    min_speed: float,
    purpose: str,
    prefer: str,
    show_all: bool,
    ram: str | None,
    ram_bandwidth: str | None,
    as_json: bool,
) -> None:
    """What fits this machine (or the one --gpu describes), and how to run it.

    Without SOURCE (or with a catalog name): plan every entry of the built-in catalog
    (recipes/models.toml, each quantisation's header kept in recipes/headers/) with the same
    estimator as a file, offline, and rank them: the best with its per-device plan, every
    other with why it lost; and say plainly which frontier models can never fit one machine.

    With SOURCE (a GGUF path, URL or hf:// file — header only — or a catalog name): the
    per-device estimate of weights, KV cache, compute and output buffers, the largest -ngl
    that fits (or the one you give), --ctx max / --parallel max solved, the llama-server
    command line and the Ollama settings.

    \b
    Examples:
      tierlocal check
      tierlocal check --gpu "2xRTX 3090" --ram 64GiB
      tierlocal check --ram 16GiB --for long-context
      tierlocal check --gpu 12GiB --for code --prefer speed
      tierlocal check qwen3-30b-a3b --gpu 24GiB
      tierlocal check --gpu 24GiB --ctx 32768
      tierlocal check ./model.gguf --ctx max --json
      tierlocal check ./gemma-3-4b-it-Q4_K_M.gguf --mmproj ./mmproj-model-f16.gguf
      tierlocal check kimi-k3
    """
    hardware = machine(gpus, ram, ram_bandwidth)
    named = find_model(source) if source is not None else []  # a catalog name: its quantisations
    if mmproj and (source is None or named):
        raise UsageError("--mmproj plans a projector beside one model", hint="give the model as SOURCE (a GGUF path, URL or hf:// file)")
    request = _request(ngl, n_cpu_moe, cache_type_k, cache_type_v, flash_attn, ubatch, mmproj)
    if source is not None and not named:
        result = _check_one_source(source, hardware, ctx, parallel, request)
        print_json(result.to_json()) if as_json else render_source_check(result)
        return
    _check_catalog(named, hardware, ctx, parallel, request, min_speed=min_speed, purpose=purpose, prefer=prefer, show_all=show_all, as_json=as_json)


def _request(
    ngl: int | None, n_cpu_moe: int | None, cache_type_k: str, cache_type_v: str, flash_attn: str, ubatch: int, mmproj: str | None
) -> RunRequest:
    """What the planning options ask of llama-server (the projector's header read from ``mmproj``)."""
    return RunRequest(
        ngl=ngl,
        n_cpu_moe=n_cpu_moe,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=flash_attn != "off",
        n_ubatch=ubatch,
        projector=read_projector(mmproj) if mmproj else None,
    )


def _check_catalog(
    named: list[ModelEntry],
    hardware: Hardware,
    ctx: str | None,
    parallel: str,
    request: RunRequest,
    *,
    min_speed: float,
    purpose: str,
    prefer: str,
    show_all: bool,
    as_json: bool,
) -> None:
    """The catalog recommendation, ranked: of every entry, or of a catalog name's quantisations (``named``)."""
    entries = named or list(load_models())
    if (ctx is not None and not ctx.isdigit()) or not parallel.isdigit():
        raise UsageError("the catalog recommendation takes numbers for --ctx and --parallel", hint="'max' and 'auto' need a GGUF SOURCE")
    tokens = parse_ctx(ctx) if ctx is not None else constants.LONG_CONTEXT_CTX if purpose == "long-context" else constants.DEFAULT_CTX
    assert tokens is not None  # 'max' is refused above
    recommendation = catalog_recommendation(
        entries,
        hardware,
        ctx=tokens,
        parallel=int(parallel),
        min_tokens_per_s=min_speed,
        purpose=purpose,
        request=request,
        prefer=prefer,
        ctx_up_to_training=ctx is None,
    )
    # The best entry's plan; for a catalog name nothing of which fits, its closest entry's (why).
    shown = recommendation.best or (recommendation.candidates[0] if named and recommendation.candidates else None)
    if as_json:
        payload = recommendation.to_json()
        payload["plan"] = shown.plan.to_json() if shown and shown.plan else None
        print_json(payload)
    else:
        render_catalog_recommendation(recommendation, show_all=show_all, render_plan=render_source_check, closest=shown)


def _check_one_source(source: str, hardware: Hardware, ctx: str | None, parallel: str, request: RunRequest) -> SourceCheck:
    from ..fetch.sources import read_headers  # the hub's client loads only when a file is read (~0.15 s)

    if "/" not in source and not source.endswith(".gguf"):
        hint = "see recipes/models.toml, or give a path, URL or hf://OWNER/REPO/FILE.gguf"
        raise UsageError(f"{source!r} is neither a catalog model nor a GGUF path", hint=hint)
    machine_ = machine_for(hardware, load_host_defaults())
    version = engine_version()
    # This CPU's calibration prices the host only when the host is this machine (no --ram).
    host_speed = load_calibration(calibration_key(version)) if version and not hardware.ram_overridden else None
    result = check_source(
        source,
        read_headers(source),
        machine_,
        ctx=parse_ctx(ctx) if ctx is not None else constants.DEFAULT_CTX,
        parallel=parse_parallel(parallel),
        request=request,
        host_speed=host_speed,
        gpu_speed=machine_gpu_speed(machine_),
        host_is_here=not hardware.ram_overridden,
        up_to_training=ctx is None,
    )
    return replace(result, measured=_measured(source, result, version))


def _measured(source: str, result: SourceCheck, version: str | None) -> dict[str, object] | None:
    """What `tierlocal bench` recorded for this model file, the llama-server found here and the
    planned device (None: nothing, or no binary to name the build)."""
    if result.estimate is None or not bench_path().is_file():
        return None
    return measured_speed(bench_key(source, version, bench_device(result.to_json()))) if version else None


def _slots_text(params: ContextParams) -> str:
    """How the context is shared: ``2 slot(s) × 4,096 each``, or one cache for every slot."""
    if params.kv_unified:
        return f"{params.n_seq_max} slot(s) sharing one KV cache"
    if params.n_seq_max > 1:
        return f"{params.n_seq_max} slot(s) × {params.n_ctx_seq:,} each"
    return "1 slot(s)"


def render_source_check(check: SourceCheck) -> None:
    """One table per device, the verdict and the command line."""
    out = console()
    estimate = check.estimate
    if estimate is None:
        out.print(f"[bold]{check.source}[/bold]: does not fit — {check.reason}.")
        return
    params = estimate.params
    out.print(
        f"[bold]{check.source}[/bold] ({check.architecture}): {params.n_ctx_padded:,} tokens of context, {_slots_text(params)}, "
        f"{estimate.layers_offloaded}/{estimate.layers_total} layers on the GPU"
        + (f", experts of the first {estimate.request.n_cpu_moe} blocks on the CPU" if estimate.request.n_cpu_moe else "")
    )
    out.print(_device_table(estimate))
    _render_projector(out, estimate)
    verdict = "fits" if estimate.fits else f"does not fit: {check.reason}"
    out.print(f"Verdict: {verdict}; {_speed_line(check)}.")
    if check.unverified_note:
        out.print(f"[bold yellow]Unverified[/bold yellow]: {escape(check.unverified_note)}.")
    if check.context_note:
        out.print(f"[bold yellow]Beyond training[/bold yellow]: {escape(check.context_note)}.")
    spilled = estimate.layers_total - estimate.layers_offloaded
    all_on_gpu = check.speed.all_on_gpu_tokens_per_s if check.speed else None
    if spilled and estimate.layers_offloaded and estimate.est_decode_tokens_per_s and all_on_gpu:
        out.print(
            f"[bold]{spilled} layers run from system RAM[/bold]: by memory bandwidth alone ≤ ~{estimate.est_decode_tokens_per_s:,.1f} tok/s, "
            f"against ≤ ~{all_on_gpu:,.0f} with every layer on the GPU."
        )
    _render_measured(out, check)
    if check.suggestion:
        hint = check.suggestion
        out.print(
            f"Suggestion: -ctk q8_0 -ctv q8_0 -fa on gives {hint.layers_offloaded}/{estimate.layers_total} layers on the GPU "
            f"at {hint.ctx:,} tokens{'' if hint.fits else ' (still does not fit)'}."
        )
    _render_host_memory(out, check)
    template = check.template
    out.print(f"Chat template: {template.note}.")
    if template.warning:
        out.print(f"[bold yellow]warning[/bold yellow]: {template.warning}")
    out.print("Command: " + " ".join(check.command))
    if check.ollama is not None:
        ollama = check.ollama
        env = " ".join(f"{k}={v}" for k, v in ollama.env.items())
        note = f" ({ollama.note})" if ollama.note else ""
        out.print(f"Ollama: num_gpu {ollama.num_gpu}, num_ctx {ollama.num_ctx}; {env}{note}")


def _device_table(estimate: RunEstimate) -> Table:
    """Per device: each part of the memory, what it needs in all and what is free."""
    table = Table()
    projector = estimate.projector
    columns = ("device", "weights", "KV cache", "compute", "output", "overhead", *(("projector",) if projector else ()), "needed", "free")
    for column in columns:
        table.add_column(column, justify="left" if column == "device" else "right")
    for device in estimate.devices:
        sizes = (
            device.weights_bytes,
            device.kv_bytes,
            device.compute_bytes,
            device.output_bytes,
            device.overhead_bytes,
            *((device.projector_bytes,) if projector else ()),
            device.total_needed_bytes,
            device.free_bytes,
        )
        table.add_row(device.name, *(format_bytes(v) for v in sizes))
    return table


def _render_projector(out: Console, estimate: RunEstimate) -> None:
    """Where the multimodal projector goes and what it takes there."""
    projector = estimate.projector
    if projector is None or estimate.request.projector is None:
        return
    where = "the GPU" if projector.on_gpu else "system RAM"
    out.print(
        f"Projector ({escape(estimate.request.projector.projector_type)}, {projector.n_patches:,} patches per image) in {where}: "
        f"{format_bytes(projector.weights_bytes)} weights + {format_bytes(projector.compute_bytes)} compute"
        + (f" + {format_bytes(projector.host_compute_bytes)} compute on the CPU" if projector.host_compute_bytes else "")
        + "".join(f"; {escape(note)}" for note in projector.notes)
        + "."
    )


def _speed_line(check: SourceCheck) -> str:
    """The best estimate there is, with what it rests on, and the bandwidth bound beside it as
    a ceiling; or the bound alone, marked as one."""
    fitted = check.speed.estimate if check.speed else None
    bound = check.headline.bound_decode_tokens_per_s
    estimate = check.estimate
    host_works = estimate is not None and (estimate.layers_offloaded < estimate.layers_total or bool(estimate.request.n_cpu_moe))
    calibrate = "`tierlocal hw --calibrate` once times this CPU" if check.host_is_here and host_works else ""
    if fitted is None or fitted.decode_tokens_per_s is None:
        if not bound:
            return "speed unknown (name the GPU with --gpu for published figures)"
        parts = [f"decode ≤ ~{bound:,.1f} tok/s (memory bandwidth alone: a ceiling, not an estimate)"]
        parts += [fitted.reason] if fitted is not None and fitted.reason else []
        return "; ".join(parts + ([calibrate + " for decode, prefill and first-token estimates"] if calibrate else []))
    parts = [f"decode ~{fitted.decode_tokens_per_s:,.1f} tok/s at {fitted.depth} tokens of context ({fitted.basis})"]
    if fitted.prefill_tokens_per_s is None:
        parts.append(fitted.reason or "prefill not estimated")
    else:
        ttft = ", ".join(f"{seconds:,.2f} s for {prompt}" for prompt, seconds in fitted.first_token_s)
        parts.append(f"prefill ~{fitted.prefill_tokens_per_s:,.0f} tok/s, first token in {ttft} prompt tokens")
    guessed = f"; {', '.join(fitted.uncalibrated_types)} priced at the nearest measured type" if fitted.uncalibrated_types else ""
    working = {device: text for device, text in fitted.sources.items() if fitted.decode_s.get(device) or device != "host"}
    parts.append("figures: " + escape("; ".join(f"{device}: {text}" for device, text in working.items()) + guessed))
    if bound:
        parts.append(f"memory bandwidth alone allows ≤ ~{bound:,.1f} tok/s")
    if calibrate and fitted.sources.get("host", "").startswith("bound"):
        parts.append(calibrate)
    return "; ".join(parts)


def _render_measured(out: Console, check: SourceCheck) -> None:
    """What `tierlocal bench` recorded for this model, engine build and device, if anything."""
    if check.measured:
        measured = check.measured
        out.print(
            f"[bold]Measured[/bold] by tierlocal bench ({measured['time']}) with this engine build on this device: decode "
            f"{measured['decode_tokens_per_s']} tok/s, prefill {measured['prefill_tokens_per_s']} tok/s — trust these over the estimate."
        )


def _render_host_memory(out: Console, check: SourceCheck) -> None:
    """System RAM as the kernel counts it, per load mode."""
    if not check.host_memory:
        return
    table = Table(
        title=f"system RAM as the kernel counts it (repacking for: {', '.join(check.cpu_features) or 'no CPU feature'})", title_justify="left"
    )
    for column in ("--load-mode", "mapped (page cache)", "anonymous", "of which repacked", "at load", "in use"):
        table.add_column(column, justify="left" if column == "--load-mode" else "right")
    for memory in check.host_memory:
        sizes = (memory.mapped_bytes, memory.anonymous_bytes, memory.repack_bytes, memory.peak_bytes, memory.in_use_bytes)
        table.add_row(memory.load_mode, *(format_bytes(size) for size in sizes))
    out.print(table)
    out.print(
        "In use adds the compute buffer as prompts fill it; llama-server's prompt cache may add up to "
        f"{format_bytes(check.host_memory[0].grows_by_bytes)}"
        + (
            " (--cache-ram: the RAM the plan leaves, below the 8 GiB default)."
            if check.host_memory[0].grows_by_bytes < PROMPT_CACHE_DEFAULT_BYTES
            else " (--cache-ram)."
        )
    )

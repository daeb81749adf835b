"""How ``check SOURCE`` (and the catalog recommendation's shown plan) reads on a terminal: one
table per device, the verdict with the speed and what it rests on, the command line, the host
memory as the kernel counts it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..fit.estimate import RunEstimate
from ..fit.host_memory import PROMPT_CACHE_DEFAULT_BYTES
from ..fit.memory import ContextParams
from ..plan.source import SourceCheck
from ..units import format_bytes
from .common import console
from .users_view import render_users

__all__ = ["render_source_check"]


def _slots_text(params: ContextParams) -> str:
    """How the context is shared: ``2 slot(s) × 4,096 each``, or one cache for every slot."""
    if params.kv_unified:
        return f"{params.n_seq_max} slot(s) sharing one KV cache"
    if params.n_seq_max > 1:
        return f"{params.n_seq_max} slot(s) × {params.n_ctx_seq:,} each"
    return "1 slot(s)"


def render_source_check(check: SourceCheck, *, min_speed: float | None = None) -> None:
    """One table per device, the verdict, the users table and the command line (``min_speed``:
    the per-user floor the users asked for are judged by)."""
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
    render_users(out, check.users, asked=check.users_asked, min_speed=min_speed if check.users_asked else None)
    if check.users_note:
        out.print(f"[bold yellow]Batching[/bold yellow]: {escape(check.users_note)}.")
    if check.slots_note:
        out.print(f"[bold]Slots[/bold]: {escape(check.slots_note)}.")
    _render_cost(out, check)
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
            device.output_bytes + device.output_grows_by_bytes,
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
    calibrate = (check.calibration_note or "`tierlocal hw --calibrate` once times this CPU") if check.host_is_here and host_works else ""
    if fitted is None or fitted.decode_tokens_per_s is None:
        if not bound:
            return "speed unknown (name the GPU with --gpu for published figures)"
        parts = [f"decode ≤ ~{bound:,.1f} tok/s (memory bandwidth alone: a ceiling, not an estimate)"]
        parts += [fitted.reason] if fitted is not None and fitted.reason else []
        advice = check.calibration_note or calibrate + " for decode, prefill and first-token estimates"
        return "; ".join(parts + ([advice] if calibrate else []))
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
    if calibrate and fitted.sources.get("host", "").startswith(("bound", "derived")):
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


def _render_cost(out: Console, check: SourceCheck) -> None:
    """What a local output token costs at the machine's price, against the API's when given."""
    cost = check.cost
    if cost is None:
        return
    per = dict(cost.per_million)
    at = per.get(cost.users)
    one = f" (${per[1]:,.2f} with one)" if 1 in per and cost.users != 1 else ""
    line = (
        f"Cost: at ${cost.usd_per_hour:,.2f}/hour ({escape(cost.basis)}), a million output tokens costs "
        f"${at:,.2f} with {cost.users} user(s) at once{one}; kept busy, {cost.capacity_tokens_per_day / 1e6:,.1f}M tokens a day"
        if at is not None
        else f"Cost: at ${cost.usd_per_hour:,.2f}/hour ({escape(cost.basis)})"
    )
    if cost.api_usd_per_million and cost.break_even_tokens_per_day:
        even = cost.break_even_tokens_per_day / 1e6
        line += f"; the API at ${cost.api_usd_per_million:,.2f} per million costs as much at {even:,.1f}M tokens a day: " + (
            "more than this machine gives its users, so the API is cheaper" if cost.cheaper == "api" else "above that, this machine is cheaper"
        )
    out.print(line + ".")

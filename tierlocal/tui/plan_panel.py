"""The selected entry's plan, as the What-fits screen shows it beside the table: why it won or
lost, each device's bar (weights / KV / compute / free), the speed, the llama-server command
line and the host-memory table — the same figures ``tierlocal check NAME`` prints. Every name
from the catalog goes in as plain text (rich ``Text``), never as markup."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..fit.estimate import DeviceUsage
from ..fit.host_memory import HostMemory
from ..units import format_bytes, format_count
from .rows import FitsRow, device_bar

__all__ = ["plan_renderable", "BAR_STYLES", "STATUS_STYLES"]

#: Each bar part's colour: the 16 ANSI colours, so 256-colour and 8-colour terminals show them.
BAR_STYLES = {"weights": "blue", "KV": "magenta", "compute": "yellow", "free": "green"}
#: Each status's colour, in the table and the plan.
STATUS_STYLES = {"best": "bold green", "fits": "green", "tight": "yellow", "too slow": "yellow", "no room": "red"}


def plan_renderable(row: FitsRow, *, width: int = 40) -> RenderableType:
    """The plan of ``row`` (a row of a recommendation's table), ``width`` cells for each bar."""
    candidate = row.candidate
    entry = candidate.entry
    head = Text.assemble(
        (f"{entry.family} {entry.quant}", "bold"),
        f"  {format_count(candidate.params)} parameters, {candidate.bits_per_weight:.2f} bits/weight, {format_bytes(row.file_bytes)}\n",
        (row.status, STATUS_STYLES.get(row.status, "")),
        f" — {candidate.reason}",
    )
    # The answer first (what it is, how fast, how to run it), then where its memory goes.
    parts: list[RenderableType] = [head, Text(_speed_text(row))]
    if candidate.note:
        parts.append(Text(f"Note: {candidate.note}", style="yellow"))
    plan = candidate.plan
    if plan is not None and plan.command:
        parts.append(Text.assemble(("Command: ", "bold"), " ".join(plan.command)))
    estimate = plan.estimate if plan else None
    if estimate is not None:
        params = estimate.params
        parts.append(
            Text(
                f"{params.n_ctx_seq:,} tokens × {params.n_seq_max} slot(s), {estimate.layers_offloaded}/{estimate.layers_total} layers on the GPU"
                + (f", experts of {estimate.request.n_cpu_moe} blocks on the CPU" if estimate.request.n_cpu_moe else "")
            )
        )
        parts.extend(_device_lines(device, width) for device in estimate.devices)
    elif candidate.fallback is not None:
        parts.append(
            Text(
                f"rule of thumb (no header in the catalog): {format_bytes(candidate.fallback.weights_bytes)} weights, "
                + (f"{format_bytes(candidate.fallback.kv_bytes)} KV" if candidate.fallback.kv_bytes is not None else "KV not known")
            )
        )
    if plan is not None and plan.host_memory:
        parts.append(_host_memory_table(plan.host_memory))
    parts.append(Text("space: page the plan", style="dim"))
    return Group(*parts)


def _device_lines(device: DeviceUsage, width: int) -> Text:
    """``name  needed / free`` then the bar, then its legend with sizes."""
    text = Text(f"{device.name}: {format_bytes(device.total_needed_bytes)} of {format_bytes(device.free_bytes)} free\n")
    bar = device_bar(device, width)
    for part in bar:
        text.append("█" * part.cells if part.label != "free" else "░" * part.cells, style=BAR_STYLES[part.label])
    text.append("\n")
    for index, part in enumerate(bar):
        text.append("■ ", style=BAR_STYLES[part.label])
        text.append(f"{part.label} {format_bytes(part.size_bytes)}" + ("  " if index < len(bar) - 1 else ""))
    return text


def _speed_text(row: FitsRow) -> str:
    candidate = row.candidate
    if row.decode_tokens_per_s is None:
        return "Speed: unknown (name the GPU with --gpu for published figures)"
    bound = " (memory-bandwidth ceiling)" if row.speed_basis == "bound" else f" ({row.speed_basis})"
    prefill = candidate.plan.headline.prefill_tokens_per_s if candidate.plan else None
    return f"Speed: decode ~{row.decode_tokens_per_s:,.1f} tok/s{bound}" + (f", prefill ~{prefill:,.0f} tok/s" if prefill else "")


def _host_memory_table(host_memory: tuple[HostMemory, ...]) -> Table:
    table = Table(title="system RAM as the kernel counts it", title_justify="left", box=None, pad_edge=False)
    for column in ("--load-mode", "mapped", "anonymous", "repacked", "at load", "in use"):
        table.add_column(column, justify="left" if column == "--load-mode" else "right")
    for memory in host_memory:
        sizes = (memory.mapped_bytes, memory.anonymous_bytes, memory.repack_bytes, memory.peak_bytes, memory.in_use_bytes)
        table.add_row(memory.load_mode, *(format_bytes(size) for size in sizes))
    return table

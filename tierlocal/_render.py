"""Human output for the CLI: rich tables on stdout. JSON output does not come through here."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from .fit import CatalogFit, Recommendation
from .gguf.summary import ModelSummary
from .hardware import Hardware
from .units import format_bytes, format_count, format_decimal_bytes

__all__ = ["print_json", "render_summary", "render_hardware", "render_recommendation"]


_PIPE_WIDTH = 120


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=_PIPE_WIDTH)
    return console


def print_json(payload: object) -> None:
    """Print one JSON document on stdout (stable key order as built)."""
    print(json.dumps(payload, indent=2, ensure_ascii=False))


def _heads(value: int | list[int] | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        distinct = sorted(set(value))
        return f"per layer: {', '.join(map(str, distinct))}" if len(distinct) > 1 else str(distinct[0])
    return str(value)


def render_summary(summary: ModelSummary) -> None:
    """What ``tierlocal inspect`` shows."""
    console = _console()
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    rows = [
        ("source", "\n".join(summary.sources)),
        ("architecture", summary.architecture),
        ("name", summary.name or "-"),
        ("parameters", f"{format_count(summary.params)} ({summary.params:,})"),
        ("layers", str(summary.layers or "-")),
        ("embedding", str(summary.embedding_length or "-")),
        ("heads / KV heads", f"{_heads(summary.head_count)} / {_heads(summary.head_count_kv)}"),
        ("context (trained)", f"{summary.context_length:,}" if summary.context_length else "-"),
        ("vocabulary", f"{summary.vocab_size:,}" if summary.vocab_size else "-"),
        ("file type", summary.file_type or "-"),
        ("tensors", f"{summary.tensor_count:,} ({format_bytes(summary.tensor_bytes)})"),
        ("header", format_bytes(summary.header_bytes)),
        ("file size", f"{format_bytes(summary.file_bytes)} ({summary.file_bytes:,} bytes)"),
        ("GGUF version", str(summary.gguf_version)),
    ]
    if summary.expert_count:
        rows.insert(7, ("experts (used)", f"{summary.expert_count} ({summary.expert_used_count or '-'})"))
    for key, value in rows:
        facts.add_row(key, value)
    console.print(facts)
    mix = Table(title="quantisation mix (binary units)", title_justify="left")
    for column in ("type", "tensors", "bytes", "share"):
        mix.add_column(column, justify="left" if column == "type" else "right")
    for share in summary.quant_mix:
        mix.add_row(share.ggml_type, str(share.tensors), format_bytes(share.n_bytes), f"{share.n_bytes / max(summary.tensor_bytes, 1):.1%}")
    console.print(mix)


def render_hardware(hardware: Hardware) -> None:
    """What ``tierlocal hw`` shows."""
    console = _console()
    gpus = Table(title="accelerators" + (" (from --gpu)" if hardware.overridden else ""), title_justify="left")
    for column in ("device", "backend", "total", "free", "bandwidth", "found by"):
        gpus.add_column(column)
    for gpu in hardware.gpus:
        bandwidth = f"{gpu.bandwidth_bytes_per_s / 1e9:.0f} GB/s" if gpu.bandwidth_bytes_per_s else "-"
        gpus.add_row(gpu.name, gpu.backend, format_bytes(gpu.total_bytes), format_bytes(gpu.free_bytes), bandwidth, gpu.source)
    if hardware.gpus:
        console.print(gpus)
    else:
        console.print("accelerators: none (models run from system RAM on the CPU)")
    console.print(
        f"system RAM: {format_bytes(hardware.ram_total_bytes)} total, {format_bytes(hardware.ram_available_bytes)} available"
    )
    console.print(f"CPU: {hardware.cpu_cores} cores, {hardware.cpu_threads} threads")
    disk = format_bytes(hardware.disk_free_bytes) if hardware.disk_free_bytes is not None else "unknown"
    console.print(f"disk free for models ({hardware.disk_path}): {disk}")
    if not hardware.overridden:
        probes = Table(title="probes", title_justify="left")
        for column in ("probe", "result", "detail"):
            probes.add_column(column, overflow="fold")
        for probe in hardware.probes:
            probes.add_row(probe.name, probe.status, probe.detail)
        console.print(probes)


def _fit_row(role: str, fit: CatalogFit) -> list[str]:
    entry = fit.entry
    kv = format_bytes(fit.kv_bytes) if fit.kv_bytes is not None else "unknown"
    needed = format_bytes(fit.total_needed_bytes) if fit.total_needed_bytes is not None else "unknown"
    return [
        role,
        entry.family,
        entry.quant,
        format_bytes(fit.weights_bytes) + ("" if entry.file_bytes_measured else " ≈"),
        kv,
        format_bytes(fit.overhead_bytes),
        needed,
        "yes" if fit.fits else "no",
        f"{fit.est_decode_tokens_per_s:,.0f}" if fit.est_decode_tokens_per_s is not None else "-",
    ]


def render_recommendation(recommendation: Recommendation, hardware: Hardware) -> None:
    """What ``tierlocal check`` shows: the arithmetic behind the recommendation."""
    console = _console()
    budget = recommendation.budget
    if budget.bandwidth_bytes_per_s is None:
        speed = "bandwidth unknown (no speed estimate)"
    else:
        speed = f"{budget.bandwidth_bytes_per_s / 1e9:.0f} GB/s" + (" (assumed, not measured)" if budget.bandwidth_assumed else "")
    where = "from --gpu" if hardware.overridden else "detected"
    console.print(f"[bold]Machine[/bold] ({where}): {budget.device}, {format_bytes(budget.memory_bytes)} free, {speed}")
    rows: Sequence[tuple[str, CatalogFit | None]] = (
        ("best", recommendation.best),
        ("smaller", recommendation.smaller),
        ("larger", recommendation.larger),
    )
    fits = [(role, fit) for role, fit in rows if fit is not None]
    if fits:
        first = fits[0][1]
        assert first is not None
        console.print(
            f"At {first.ctx:,} tokens of context × {first.parallel} slot(s): needed = weights + KV cache + overhead, "
            f"leaving {format_bytes(first.margin_bytes)} free."
        )
        table = Table()
        for column in ("", "model", "quant", "weights", "KV cache", "overhead", "needed", "fits", "~tok/s"):
            table.add_column(column, justify="right" if column in ("weights", "KV cache", "overhead", "needed", "~tok/s") else "left")
        for role, fit in fits:
            assert fit is not None
            table.add_row(*_fit_row(role, fit))
        console.print(table)
    best = recommendation.best
    if best is None:
        console.print(
            f"[bold]Verdict:[/bold] no catalog model fits {format_bytes(budget.memory_bytes)} at this context and "
            f"decodes ≥ {recommendation.min_tokens_per_s:g} tok/s; lower --ctx or --min-speed, or use tier 3 (a hosted API)."
        )
    else:
        entry = best.entry
        ollama = f"; Ollama tag {entry.ollama}" if entry.ollama else ""
        speed = (
            f"~{best.est_decode_tokens_per_s:,.0f} tok/s upper bound from memory bandwidth"
            if best.est_decode_tokens_per_s is not None
            else "speed unknown without the GPU's bandwidth (name the GPU with --gpu)"
        )
        console.print(
            f"[bold]Verdict:[/bold] {entry.family} at {entry.quant} ({format_count(entry.params)} parameters, "
            f"{entry.bits_per_weight:.2f} bits/weight){ollama}: needs {format_bytes(best.total_needed_bytes or 0)} of "
            f"{format_bytes(budget.memory_bytes)}, {speed}."
        )
    console.print("≈ file size from parameters × bits/weight (llama.cpp's measured averages); tok/s = bandwidth ÷ active weight bytes.")
    for verdict in recommendation.frontier:
        entry = verdict.entry
        console.print(
            f"[bold]{entry.family}[/bold]: not tier 2 — never fits one machine. Memory floor {format_decimal_bytes(verdict.floor_bytes)} "
            f"of weights alone ({format_count(entry.params)} parameters at {entry.quant}); ≥ {verdict.gpus_for_floor} × {verdict.largest_gpu} "
            f"({format_bytes(verdict.largest_gpu_bytes)} each) just to hold them. Rent a cluster (tier 1) or use the hosted API "
            f"(tier 3): `tierlocal plan {entry.family}` sizes both."
        )

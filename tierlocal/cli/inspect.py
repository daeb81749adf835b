"""``tierlocal inspect`` (what a GGUF header says) and ``tierlocal hw`` (what this machine has)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table

from ..engines.llama_server import find_llama_server, read_engine_flags
from ..errors import TierlocalError, UsageError
from ..fetch.sources import read_headers
from ..fit.device_speed import DeviceSpeed
from ..gguf import ModelSummary, summarize
from ..hardware.types import Hardware
from ..measure.calibration_cache import calibration_key, load_calibration, save_calibration
from ..units import format_bytes, format_count
from .common import console, gpu_option, json_option, machine, print_json

__all__ = ["inspect", "hw"]


@click.command()
@click.argument("source")
@json_option
def inspect(source: str, as_json: bool) -> None:
    """Show what a GGUF header says, reading the header only.

    SOURCE is a local path, an http(s):// URL (read with Range requests), or
    hf://OWNER/REPO/FILE.gguf[@REVISION] (honours HF_ENDPOINT and HF_TOKEN).
    Split models (NAME-00001-of-00003.gguf) are read as one: every shard's header.

    \b
    Examples:
      tierlocal inspect ./gemma-3-270m-q4_k_m.gguf
      tierlocal inspect hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q8_0.gguf --json
    """
    summary = summarize(read_headers(source))
    if as_json:
        print_json(summary.to_json())
    else:
        render_summary(summary)


@click.command()
@gpu_option
@click.option("--calibrate", is_flag=True, help="Time the engine on probe models (a few minutes, once) and keep this CPU's speed figures for check.")
@click.option(
    "--quick",
    is_flag=True,
    help="With --calibrate: one round of one timed run per probe instead of two rounds of two (about a third of the time, noisier).",
)
@json_option
def hw(gpus: tuple[str, ...], calibrate: bool, quick: bool, as_json: bool) -> None:
    """Show this machine's GPUs, RAM, free disk and cores (or what --gpu describes).

    GPUs are found through NVML (NVIDIA), sysfs (AMD), unified memory (Apple) and
    `llama-server --list-devices` when a llama-server binary is found
    (TIERLOCAL_LLAMA_SERVER, PATH, or tierlocal's engine directory).

    With --calibrate: load probe models (sparse GGUFs, nothing downloaded) in that llama-server
    on the CPU, time prompt processing and generation, and fit this CPU's effective figures
    (per weight type, fixed costs, attention), filed under the CPU and the engine build.
    `tierlocal check SOURCE` then estimates decode, prefill and time to first token with them.
    """
    if quick and not calibrate:
        raise UsageError("--quick shortens --calibrate", hint="give both: tierlocal hw --calibrate --quick")
    if calibrate:
        _calibrate(as_json, quick=quick)
        return
    hardware = machine(gpus)
    if as_json:
        print_json(hardware.to_json())
    else:
        render_hardware(hardware)
        if not gpus:
            _render_calibration_status()


def _render_calibration_status() -> None:
    """Whether check's speed estimate has this CPU's measured figures."""
    binary = find_llama_server()
    if binary is None:
        return
    try:
        speed = load_calibration(calibration_key(read_engine_flags(binary).version))
    except TierlocalError:
        return
    if speed is None:
        console().print("Speed calibration: none for this CPU and engine build — `tierlocal hw --calibrate` (a few minutes, once).")
    else:
        console().print(f"Speed calibration: {speed.note}.")


def _calibrate(as_json: bool, *, quick: bool) -> None:
    # the probe writer needs the gguf package (and numpy): imported when probes run, not with `hw`
    from ..measure.calibrate import calibrate_cpu, memory_read_bytes_per_s, remove_stale_scratch, require_engine

    binary = require_engine(find_llama_server())
    version = read_engine_flags(binary).version
    key = calibration_key(version)
    say = (lambda line: click.echo(line, err=True)) if as_json else console().print
    for stale in remove_stale_scratch():
        say(f"removed {stale}, left by a calibration that did not finish")
    say(f"calibrating {key['cpu']} ({key['cores']} cores) with {binary} — a few minutes; nothing is downloaded")
    bandwidth = memory_read_bytes_per_s()
    speed, raw = calibrate_cpu(binary, version, say=say, repeats=1, rounds=1) if quick else calibrate_cpu(binary, version, say=say)
    speed = _with_batch_figures(binary, speed, say)
    path = save_calibration(key, speed, raw, memory_bytes_per_s=bandwidth)
    if as_json:
        print_json({"key": key, "file": str(path), "memory_read_bytes_per_s": round(bandwidth), "speed": speed.to_json()})
        return
    render_calibration(speed, bandwidth)
    console().print(f"Saved to {path}; `tierlocal check SOURCE` uses it for this CPU and engine build.")


def _with_batch_figures(binary: Path, speed: DeviceSpeed, say: Callable[[str], None]) -> DeviceSpeed:
    """``speed`` with this CPU's further-row share and per-row cost of a decode batch timed
    (:mod:`tierlocal.measure.calibrate_batch`; the row share first: the per-row probe's step reads it)."""
    import platform

    from ..fit.host_memory import repack_rules
    from ..hardware.detect import cpu_features
    from ..measure.calibrate_batch import measure_row_share, measure_sequence_row_s

    arch = platform.machine().lower()
    repacked = frozenset(repack_rules(arch, cpu_features()))
    speed = replace(speed, batch_row_share=measure_row_share(binary, speed, arch, repacked, say=say))
    return replace(speed, sequence_row_s=measure_sequence_row_s(binary, speed, arch, repacked, say=say))


def render_calibration(speed: DeviceSpeed, memory_bytes_per_s: float) -> None:
    """The fitted figures: per weight type, then the fixed costs."""
    out = console()
    table = Table(title=f"this CPU with llama.cpp ({speed.note})", title_justify="left")
    for column in ("weight type", "decode (weights streamed)", "prefill (mat-mul)"):
        table.add_column(column, justify="left" if column == "weight type" else "right")
    for name in sorted(set(speed.decode_bytes_per_s) | set(speed.prefill_flops_per_s)):
        decode, prefill = speed.decode_bytes_per_s.get(name), speed.prefill_flops_per_s.get(name)
        table.add_row(name, f"{decode / 1e9:,.1f} GB/s" if decode else "-", f"{prefill / 1e9:,.0f} GFLOP/s" if prefill else "-")
    out.print(table)
    out.print(
        f"Attention {speed.attention_flops_per_s / 1e9:,.0f} GFLOP/s; per decoded token {speed.token_overhead_s * 1e3:.2f} ms "
        f"+ {speed.layer_overhead_s * 1e6:.1f} µs per layer + {speed.vocab_overhead_s * 1e8:.2f} ms per 100k vocabulary entries "
        "+ a cost per matrix row (by type); "
        f"one thread reads RAM at {memory_bytes_per_s / 1e9:,.1f} GB/s."
    )
    if speed.batch_row_share is not None:
        out.print(f"In a decode batch, each further sequence's row-by-row mat-vecs cost {speed.batch_row_share:.2f} of one sequence's.")
    if speed.sequence_row_s:
        out.print(
            f"Each further sequence of a decode batch pays {speed.sequence_row_s * 1e9:.1f} ns per matrix row of a batched type beyond its FLOPs."
        )


def _heads(value: int | list[int] | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        distinct = sorted(set(value))
        return f"per layer: {', '.join(map(str, distinct))}" if len(distinct) > 1 else str(distinct[0])
    return str(value)


def render_summary(summary: ModelSummary) -> None:
    """What ``tierlocal inspect`` shows."""
    out = console()
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
        ("chat template", summary.chat_template.describe()),
    ]
    if summary.expert_count:
        rows.insert(7, ("experts (used)", f"{summary.expert_count} ({summary.expert_used_count or '-'})"))
    for key, value in rows:
        facts.add_row(key, value)
    out.print(facts)
    mix = Table(title="quantisation mix (binary units)", title_justify="left")
    for column in ("type", "tensors", "bytes", "share"):
        mix.add_column(column, justify="left" if column == "type" else "right")
    for share in summary.quant_mix:
        mix.add_row(share.ggml_type, str(share.tensors), format_bytes(share.n_bytes), f"{share.n_bytes / max(summary.tensor_bytes, 1):.1%}")
    out.print(mix)


def render_hardware(hardware: Hardware) -> None:
    """What ``tierlocal hw`` shows."""
    out = console()
    gpus = Table(title="accelerators" + (" (from --gpu)" if hardware.overridden else ""), title_justify="left")
    for column in ("device", "backend", "total", "free", "bandwidth", "found by"):
        gpus.add_column(column)
    for gpu in hardware.gpus:
        bandwidth = f"{gpu.bandwidth_bytes_per_s / 1e9:.0f} GB/s" if gpu.bandwidth_bytes_per_s else "-"
        gpus.add_row(gpu.name, gpu.backend, format_bytes(gpu.total_bytes), format_bytes(gpu.free_bytes), bandwidth, gpu.source)
    if hardware.gpus:
        out.print(gpus)
    else:
        out.print("accelerators: none (models run from system RAM on the CPU)")
    out.print(f"system RAM: {format_bytes(hardware.ram_total_bytes)} total, {format_bytes(hardware.ram_available_bytes)} available")
    out.print(f"CPU: {hardware.cpu_cores} cores, {hardware.cpu_threads} threads")
    disk = format_bytes(hardware.disk_free_bytes) if hardware.disk_free_bytes is not None else "unknown"
    out.print(f"disk free for models ({hardware.disk_path}): {disk}")
    if not hardware.overridden:
        probes = Table(title="probes", title_justify="left")
        for column in ("probe", "result", "detail"):
            probes.add_column(column, overflow="fold")
        for probe in hardware.probes:
            probes.add_row(probe.name, probe.status, probe.detail)
        out.print(probes)

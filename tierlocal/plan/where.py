"""A planned entry in words: where its layers run, and how it must be loaded to fit. Pure."""

from __future__ import annotations

from ..units import format_bytes
from .source import SourceCheck

__all__ = ["where_text", "load_note"]


def where_text(check: SourceCheck) -> str:
    """Where the plan puts the model: ``GPU``, ``2 GPUs``, ``CPU``, ``GPU 30/33, rest in RAM``,
    ``GPU, experts of 12 blocks in RAM``; ``-`` without an estimate."""
    estimate = check.estimate
    if estimate is None:
        return "-"
    if check.host_only or estimate.layers_offloaded == 0:
        return "CPU"
    gpu = f"{len(estimate.tensor_split)} GPUs" if estimate.tensor_split else "GPU"
    if estimate.request.n_cpu_moe:
        return f"{gpu}, experts of {estimate.request.n_cpu_moe} blocks in RAM"
    if estimate.layers_offloaded < estimate.layers_total:
        return f"{gpu} {estimate.layers_offloaded}/{estimate.layers_total}, rest in RAM"
    return gpu


def load_note(check: SourceCheck) -> str:
    """``--load-mode none`` when mmap's peak (the mapped file beside the CPU's repacked copy of
    its weights) would not fit the RAM available, while loading without mmap would."""
    modes = {memory.load_mode: memory for memory in check.host_memory}
    estimate = check.estimate
    if estimate is None or "mmap" not in modes or "none" not in modes:
        return ""
    free = estimate.devices[-1].free_bytes
    if modes["mmap"].peak_bytes <= free or modes["none"].peak_bytes > free:
        return ""
    return (
        f"load it with --load-mode none (`tierlocal serve {check.source.split(':')[0]} -- --load-mode none`): with mmap the file stays mapped "
        f"beside its repacked copy, {format_bytes(modes['mmap'].peak_bytes)} at load against {format_bytes(free)}; without, "
        f"{format_bytes(modes['none'].peak_bytes)}"
    )

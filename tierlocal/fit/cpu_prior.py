"""A CPU priced before it is calibrated: from published llama-bench runs of CPUs of its
instruction-set class (recipes/cpu_speed.toml), by its core count. Pure.

The published runs say two things (bench/cpu_prior.py prints them beside this machine's engine):

- **Decode** reads the weights at a rate per thread until the memory bus saturates: a thread of
  an AMD server with AVX-512 streams ~13 GB/s of Q4_K_M weights (AVX2 ~10, an Intel cloud
  server's ~7), and past a share of the measured bandwidth (~0.85) more threads add nothing. So
  decode streams ``min(threads × per-thread rate, saturation share × bandwidth)`` bytes per second.
- **Prefill** is compute: its FLOP/s grow with the threads almost exactly (a thread of an AMD
  server with AVX-512: 70 GFLOP/s at 2, 4, 8 and 16 threads; AVX2 ~50; Intel's AVX-512 ~150).

Per-thread rates are the medians of the rows of the CPU's vendor and instruction set (decode:
runs of at most :data:`SMALL_THREADS` threads that did not saturate the bus); a CPU of a class
without rows (Arm, whose published runs used a generic build) gets none, and keeps the bandwidth
bound. The figures carry no fixed costs
per token or layer: for a small model they read fast (its overheads dominate), for the models
that decide a VPS's pick (billions of parameters) the bytes and FLOPs do. A mixture's expert
matrices run prefill at :data:`EXPERT_PREFILL_FACTOR` of the dense rate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..published import CpuBenchRow
from .device_speed import DeviceSpeed

__all__ = ["CpuRates", "cpu_isa_class", "cpu_rates", "cpu_prior", "SMALL_THREADS", "SATURATED_SHARE", "EXPERT_PREFILL_FACTOR"]

#: Decode's per-thread rate is taken from runs of at most this many threads (VPS sizes).
SMALL_THREADS = 4
#: A run whose decode read more than this share of the measured bandwidth counts as saturated.
SATURATED_SHARE = 0.7
#: Prefill's rate on a mixture's expert matrices against dense ones. The published runs are all
#: of dense models; fitted 2026-12-05 to two sparse MoE shapes in this repository's CPU build
#: (`python -m bench.speed_accuracy --prior`: DeepSeek-V2-Lite and Qwen3-30B-A3B's prefill read
#: 1.91× and 1.81× fast without it; zero weights route every token to the same experts, so
#: real routing is slower still).
EXPERT_PREFILL_FACTOR = 0.5


@dataclass(frozen=True)
class CpuRates:
    """One class's figures from its published rows: decode bytes/s and prefill FLOP/s per
    thread, the share of the bandwidth decode reaches saturated, the class (``intel-avx512``), how
    many rows and their dates."""

    name: str
    decode_bytes_per_s_per_thread: float
    prefill_flops_per_s_per_thread: float
    saturation_share: float
    rows: int
    dates: tuple[str, str]


def cpu_isa_class(cpu_arch: str, cpu_features: Sequence[str]) -> str | None:
    """The instruction set a CPU is priced by (None: no published rows for it: Arm, or an x86
    without AVX2)."""
    if cpu_arch not in ("x86_64", "amd64", ""):
        return None
    if "avx512f" in cpu_features:
        return "avx512"
    return "avx2" if "avx2" in cpu_features else None


def _unsaturated(row: CpuBenchRow) -> bool:
    return row.threads <= SMALL_THREADS and row.decode_bytes_per_s <= SATURATED_SHARE * row.bandwidth_bytes_per_s


def cpu_rates(rows: Sequence[CpuBenchRow], vendor: str, isa: str) -> CpuRates | None:
    """The median per-thread rates of the ``use = "fit"`` rows of ``vendor`` and ``isa`` (another
    vendor's of ``isa`` when its own are too few); the saturated share of every row that reached
    it. None: no rows of ``isa`` at all."""
    fitted = [row for row in rows if row.use == "fit"]
    mine = [row for row in fitted if row.isa == isa and row.vendor == vendor]
    name = f"{vendor}-{isa}"
    if sum(map(_unsaturated, mine)) < 2:
        mine, name = [row for row in fitted if row.isa == isa], isa
    unsaturated = [row for row in mine if _unsaturated(row)]
    saturated = [row for row in fitted if row.decode_bytes_per_s > SATURATED_SHARE * row.bandwidth_bytes_per_s]
    if len(unsaturated) < 2 or not saturated:
        return None
    return CpuRates(
        name,
        statistics.median(row.decode_bytes_per_s / row.threads for row in unsaturated),
        statistics.median(row.prefill_flops_per_s / row.threads for row in mine),
        statistics.median(row.decode_bytes_per_s / row.bandwidth_bytes_per_s for row in saturated),
        len(mine),
        (min(row.date for row in mine), max(row.date for row in mine)),
    )


def cpu_prior(rates: CpuRates, threads: int, bandwidth_bytes_per_s: float) -> DeviceSpeed:
    """This CPU's figures from ``rates`` at ``threads`` (llama-server's default: the physical
    cores), decode capped at the saturation share of ``bandwidth_bytes_per_s`` (source
    ``derived``)."""
    per_thread = rates.decode_bytes_per_s_per_thread * threads
    cap = rates.saturation_share * bandwidth_bytes_per_s
    decode = min(per_thread, cap)
    prefill = rates.prefill_flops_per_s_per_thread * threads
    limit = (
        f"{threads} thread(s) × {rates.decode_bytes_per_s_per_thread / 1e9:.1f} GB/s"
        if per_thread <= cap
        else f"{rates.saturation_share:.2f} of the {bandwidth_bytes_per_s / 1e9:.0f} GB/s of memory bandwidth planned"
    )
    note = (
        f"not calibrated: priced from {rates.rows} published llama-bench runs of {rates.name} CPUs ({rates.dates[0]}–{rates.dates[1]}, "
        f"recipes/cpu_speed.toml): decode {decode / 1e9:.1f} GB/s ({limit}), prefill {prefill / 1e9:.0f} GFLOP/s "
        f"({threads} × {rates.prefill_flops_per_s_per_thread / 1e9:.0f})"
    )
    return DeviceSpeed(
        device="host CPU",
        source="derived",
        note=note,
        decode_bytes_per_s={"*": decode},
        prefill_flops_per_s={"*": prefill, "x:*": prefill * EXPERT_PREFILL_FACTOR},
        attention_flops_per_s=prefill,
    )

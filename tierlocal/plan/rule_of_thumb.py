"""Which catalog model fits a machine: the tier-2 rule of thumb (docs/commands/check.md). Pure.

    needed = weights + KV cache (bytes/token × ctx × parallel) + runtime overhead
    fits   = needed + margin ≤ memory of the device that holds the model

The device is the largest GPU, or system RAM on a machine without one. Decode speed is
bounded by memory bandwidth ÷ bytes of active weights read per token. The catalog
recommendation plans every entry with a compact header by the header-exact estimator
(:mod:`.recommend`); this rule, labelled so, is for an entry without one. The memory budget
and the frontier models' never-fits verdicts are this module's too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..catalog import GpuSpec, HostDefaults, ModelEntry
from ..hardware.types import Hardware
from .single_machine import SingleMachinePlan

__all__ = ["Budget", "CatalogFit", "FrontierVerdict", "memory_budget", "fit_entry", "frontier_verdict"]


@dataclass(frozen=True)
class Budget:
    """The memory a model must fit in (bytes) and how fast it is read (bytes/s; None: unknown,
    as for a ``--gpu 24GiB`` override)."""

    device: str
    backend: str
    memory_bytes: int
    bandwidth_bytes_per_s: int | None
    bandwidth_assumed: bool

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "backend": self.backend,
            "memory_bytes": self.memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_assumed": self.bandwidth_assumed,
        }


@dataclass(frozen=True)
class CatalogFit:
    """One catalog entry against one budget. Sizes in bytes, speed in tokens/s."""

    entry: ModelEntry
    ctx: int
    parallel: int
    weights_bytes: int
    kv_bytes: int | None
    overhead_bytes: int
    margin_bytes: int
    total_needed_bytes: int | None
    budget: Budget
    fits: bool
    est_decode_tokens_per_s: float | None

    def to_json(self) -> dict[str, object]:
        entry = self.entry
        return {
            "model": entry.family,
            "params": entry.params,
            "active_params": entry.active_params,
            "quant": entry.quant,
            "bits_per_weight": entry.bits_per_weight,
            "file_bytes": entry.file_bytes,
            "file_bytes_measured": entry.file_bytes_measured,
            "ctx": self.ctx,
            "parallel": self.parallel,
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "overhead_bytes": self.overhead_bytes,
            "margin_bytes": self.margin_bytes,
            "total_needed_bytes": self.total_needed_bytes,
            "fits": self.fits,
            "est_decode_tokens_per_s": None if self.est_decode_tokens_per_s is None else round(self.est_decode_tokens_per_s, 1),
            "ollama_tag": entry.ollama,
            "gguf_repo": entry.gguf_repo,
            "pull": f"hf://{entry.gguf_repo} --quant {entry.quant}" if entry.gguf_repo else None,
        }


@dataclass(frozen=True)
class FrontierVerdict:
    """A model that can never fit one machine: its memory floor (bytes) and GPUs needed for it."""

    entry: ModelEntry
    fits: bool
    floor_bytes: int
    largest_gpu: str
    largest_gpu_bytes: int
    gpus_for_floor: int
    #: The published GGUFs with the experts in RAM on this machine (None: none published).
    single_machine: SingleMachinePlan | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "single_machine": None if self.single_machine is None else self.single_machine.to_json(),
            "model": self.entry.family,
            "fits": self.fits,
            "floor_bytes": self.floor_bytes,
            "params": self.entry.params,
            "active_params": self.entry.active_params,
            "largest_gpu": self.largest_gpu,
            "gpus_for_floor": self.gpus_for_floor,
            "facts_date": self.entry.facts_date,
        }


class Recommendation:
    """The best fit, a smaller/faster and a larger/slower alternative, and frontier verdicts,
    for ``hardware``."""

    budget: Budget
    best: CatalogFit | None
    smaller: CatalogFit | None
    larger: CatalogFit | None
    frontier: tuple[FrontierVerdict, ...]
    min_tokens_per_s: float
    hardware: Hardware

    def to_json(self) -> dict[str, object]:
        """The documented ``check --json`` object (no SOURCE)."""
        return {
            "method": "rule-of-thumb",
            "hardware": self.hardware.to_json(),
            "budget": self.budget.to_json(),
            "min_tokens_per_s": self.min_tokens_per_s,
            "recommendation": self.best.to_json() if self.best else None,
            "alternatives": [
                {"role": role, **fit.to_json()} for role, fit in (("smaller", self.smaller), ("larger", self.larger)) if fit is not None
            ],
            "frontier": [verdict.to_json() for verdict in self.frontier],
        }


def memory_budget(hardware: Hardware, host: HostDefaults) -> Budget:
    """The largest GPU, or system RAM (available, with the assumed bandwidth) when there is none."""
    if hardware.gpus:
        gpu = max(hardware.gpus, key=lambda device: device.free_bytes)
        return Budget(
            device=gpu.name,
            backend=gpu.backend,
            memory_bytes=gpu.free_bytes,
            bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s,
            bandwidth_assumed=False,
        )
    return Budget(
        device="system RAM (no GPU)",
        backend="cpu",
        memory_bytes=hardware.ram_available_bytes,
        bandwidth_bytes_per_s=host.assumed_ram_bandwidth_bytes_per_s,
        bandwidth_assumed=True,
    )


def fit_entry(entry: ModelEntry, budget: Budget, host: HostDefaults, *, ctx: int, parallel: int, up_to_training: bool = False) -> CatalogFit:
    """The rule-of-thumb memory need of ``entry`` at ``ctx`` tokens × ``parallel`` slots (with
    ``up_to_training``: at most the context the model was trained on)."""
    if up_to_training and entry.context_length:
        ctx = min(ctx, entry.context_length)
    kv_bytes = None
    if entry.kv_bytes_per_token is not None:
        kv_bytes = entry.kv_bytes_per_token * ctx * parallel + entry.fixed_state_bytes * parallel
    total = None if kv_bytes is None else entry.file_bytes + kv_bytes + host.runtime_overhead_bytes
    fits = total is not None and total + host.fit_margin_bytes <= budget.memory_bytes
    active_weight_bytes = entry.active_params * entry.bits_per_weight / 8
    bandwidth = budget.bandwidth_bytes_per_s
    return CatalogFit(
        entry=entry,
        ctx=ctx,
        parallel=parallel,
        weights_bytes=entry.file_bytes,
        kv_bytes=kv_bytes,
        overhead_bytes=host.runtime_overhead_bytes,
        margin_bytes=host.fit_margin_bytes,
        total_needed_bytes=total,
        budget=budget,
        fits=fits,
        est_decode_tokens_per_s=bandwidth / active_weight_bytes if bandwidth else None,
    )


def frontier_verdict(entry: ModelEntry, gpus: Sequence[GpuSpec]) -> FrontierVerdict:
    """How far ``entry`` is from one machine: the weights floor against the largest GPU we know."""
    largest = max(gpus, key=lambda gpu: gpu.marketed_bytes or gpu.memory_bytes)
    marketed = largest.marketed_bytes or largest.memory_bytes  # counted as `tierlocal plan` counts: the vendor's decimal GB
    return FrontierVerdict(
        entry=entry,
        fits=False,
        floor_bytes=entry.floor_bytes,
        largest_gpu=largest.name,
        largest_gpu_bytes=marketed,
        gpus_for_floor=math.ceil(entry.floor_bytes / marketed),
    )

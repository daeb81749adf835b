"""The catalog recommendation for a machine, assembled: the catalog's entries and their compact
headers (recipes/), this CPU's calibration (when the llama-server found here was calibrated)
and the GPU's published speed, handed to the pure ranking in :mod:`tierlocal.plan.recommend`.

``check`` (no SOURCE, or a catalog name), ``pull`` (no SOURCE) and ``serve NAME`` all take
their answer from :func:`catalog_recommendation`, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from .catalog import ModelEntry, find_frontier, load_entry_headers, load_gpus, load_host_defaults, load_quality
from .engines.llama_server import find_llama_server, read_engine_flags
from .errors import TierlocalError
from .fit.estimate import RunRequest
from .fit.recurrent import frontier_per_user_memory
from .gpu_figures import machine_gpu_speed
from .hardware.types import Hardware
from .measure.calibration_cache import calibration_key, load_calibration
from .plan.quality import ModelQuality, fit_quality
from .plan.recommend import CatalogRecommendation, recommend_catalog
from .plan.single_machine import SingleMachinePlan, single_machine_plan
from .plan.source import machine_for

__all__ = ["catalog_recommendation", "catalog_quality", "engine_version"]


@cache
def catalog_quality() -> dict[str, dict[str, ModelQuality]]:
    """Every catalog model's score per task, fitted from recipes/quality.toml's figures
    (:func:`tierlocal.plan.quality.fit_quality`).

    Raises:
        CatalogError: recipes/quality.toml is unreadable or malformed.
    """
    facts = load_quality()
    return fit_quality(facts.figures, facts.benchmark_tasks)


def engine_version() -> str | None:
    """The version of the llama-server found here (None: none found, or it does not run)."""
    binary = find_llama_server()
    try:
        return read_engine_flags(binary).version if binary is not None else None
    except TierlocalError:
        return None


def catalog_recommendation(
    entries: Sequence[ModelEntry],
    hardware: Hardware,
    *,
    ctx: int,
    parallel: int,
    min_tokens_per_s: float,
    purpose: str = "chat",
    request: RunRequest | None = None,
    prefer: str = "balanced",
) -> CatalogRecommendation:
    """Plan and rank ``entries`` on ``hardware`` at ``ctx`` tokens per slot × ``parallel`` slots.

    This CPU's calibration prices the host's part only when the host is this machine (no
    ``--ram``): another machine's CPU was never timed here.

    Raises:
        CatalogError: a catalog header is unreadable.
    """
    host = load_host_defaults()
    machine = machine_for(hardware, host)
    version = engine_version() if not hardware.ram_overridden else None
    host_speed = load_calibration(calibration_key(version)) if version else None
    headers = {entry.key: found for entry in entries if (found := load_entry_headers(entry)) is not None}
    request = request or RunRequest()
    recommendation = recommend_catalog(
        entries, headers, hardware, machine, host, load_gpus(), ctx=ctx, parallel=parallel, min_tokens_per_s=min_tokens_per_s, purpose=purpose,
        request=replace(request, parallel=parallel), host_speed=host_speed, gpu_speed=machine_gpu_speed(machine),
        quality=catalog_quality(), quant_losses=load_quality().quant_losses, prefer=prefer,
    )  # fmt: skip
    frontier = tuple(replace(verdict, single_machine=_single_machine(verdict.entry.family, hardware, ctx)) for verdict in recommendation.frontier)
    return replace(recommendation, frontier=frontier)


def _single_machine(name: str, hardware: Hardware, ctx: int) -> SingleMachinePlan | None:
    """The frontier model's published GGUFs on ``hardware`` (None: recipes name none)."""
    model = find_frontier(name)
    if model is None or not model.single_machine:
        return None
    kv_per_token, state = frontier_per_user_memory(model.attention_dims, model.attention_layers)
    gpus = [gpu for gpu in hardware.gpus if not gpu.unified_pool_bytes]
    bandwidths = [gpu.bandwidth_bytes_per_s for gpu in gpus if gpu.bandwidth_bytes_per_s]
    unified = next((gpu for gpu in hardware.gpus if gpu.unified_pool_bytes), None)
    ram_bandwidth = (
        hardware.ram_bandwidth_bytes_per_s or (unified.bandwidth_bytes_per_s if unified else None) or load_host_defaults().assumed_ram_bandwidth_bytes_per_s
    )
    return single_machine_plan(
        model.single_machine, params=model.params, kv_bytes=round((kv_per_token or 0) * ctx) + state, ctx=ctx,
        gpu_bytes_here=sum(gpu.free_bytes for gpu in gpus), ram_bytes_here=hardware.ram_available_bytes + (unified.free_bytes if unified else 0),
        ram_bandwidth_bytes_per_s=ram_bandwidth, gpu_bandwidth_bytes_per_s=min(bandwidths) if bandwidths else None,
    )  # fmt: skip

"""The catalog recommendation for a machine, assembled: the catalog's entries and their compact
headers (recipes/), this CPU's calibration (when the llama-server found here was calibrated)
and the GPU's published speed, handed to the pure ranking in :mod:`tierlocal.plan.recommend`.

``check`` (no SOURCE, or a catalog name), ``pull`` (no SOURCE) and ``serve NAME`` all take
their answer from :func:`catalog_recommendation`, so they cannot disagree.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, replace
from functools import cache
from typing import Any, TypeVar, cast

from .cache_file import cached
from .catalog import ModelEntry, find_frontier, load_answer_lengths, load_gpus, load_host_defaults, load_licences, load_quality
from .engines.llama_server import find_llama_server, read_engine_flags
from .errors import TierlocalError
from .fit.estimate import RunRequest
from .fit.recurrent import frontier_per_user_memory
from .hardware.types import Hardware
from .inputs_here import plan_inputs
from .measure.calibration_cache import unused_calibration
from .plan.candidates import CatalogRecommendation
from .plan.machine import machine_for
from .plan.quality import ModelQuality, fit_quality
from .plan.recommend import recommend_catalog
from .plan.single_machine import SingleMachinePlan, single_machine_plan
from .planning_cache import CatalogModel, catalog_models
from .published import QualityFigure, QuantLoss

__all__ = ["catalog_recommendation", "catalog_quality", "engine_version"]

_F = TypeVar("_F", bound=Callable[..., Any])


#: Every catalog model's score per task (model → task → score), and the measured loss of each
#: quantisation type (upper-case type → loss).
_Quality = tuple[dict[str, dict[str, ModelQuality]], dict[str, QuantLoss]]


def catalog_quality() -> dict[str, dict[str, ModelQuality]]:
    """Every catalog model's score per task, fitted from recipes/quality.toml's figures
    (:func:`tierlocal.plan.quality.fit_quality`).

    Raises:
        CatalogError: recipes/quality.toml is unreadable or malformed.
    """
    return _quality()[0]


@cache
def _quality() -> _Quality:
    """The scores and quantisation losses, from the planning cache (the fit reads 632 figures)."""
    return cached("quality", _fit_quality, _quality_plain, _quality_from_plain)


def _fit_quality() -> _Quality:
    facts = load_quality()
    return fit_quality(facts.figures, facts.benchmark_tasks), dict(facts.quant_losses)


def _quality_plain(quality: _Quality) -> tuple[Any, Any]:
    scores, losses = quality
    plain_scores = {
        model: {task: (*astuple(score)[:6], tuple(astuple(figure) for figure in score.figures)) for task, score in tasks.items()}
        for model, tasks in scores.items()
    }
    return plain_scores, {quant: astuple(loss) for quant, loss in losses.items()}


def _quality_from_plain(plain: tuple[Any, Any]) -> _Quality:
    scores, losses = plain
    restored = {model: {task: _score_from_plain(values) for task, values in tasks.items()} for model, tasks in scores.items()}
    return restored, {quant: QuantLoss(*values) for quant, values in losses.items()}


def _score_from_plain(values: tuple[Any, ...]) -> ModelQuality:
    model, task, score, basis, reported, columns, figures = values
    return ModelQuality(model, task, score, basis, reported, columns, tuple(QualityFigure(*figure) for figure in figures))


def engine_version() -> str | None:
    """The version of the llama-server found here (None: none found, or it does not run)."""
    binary = find_llama_server()
    try:
        return read_engine_flags(binary).version if binary is not None else None
    except TierlocalError:
        return None


def _cycle_collection_paused(function: _F) -> _F:
    """``function`` run with Python's cycle collector paused. Planning the catalog makes some
    300,000 short-lived tuples and records that hold no reference cycles (reference counting
    frees them); each collection they trigger would walk the restored catalog again: 7% of a
    warm ``check``'s instructions (callgrind). Collection resumes as it was afterwards."""

    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.freeze()  # what the planning keeps is left out of later collections too (reference counting still frees it)
            if enabled:
                gc.enable()

    return cast(_F, paused)


@_cycle_collection_paused
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
    ctx_up_to_training: bool = False,
    licence: str = "any",
    users: int | None = None,
    thinking: str = "auto",
    models: Mapping[str, CatalogModel] | None = None,
) -> CatalogRecommendation:
    """Plan and rank ``entries`` on ``hardware`` at ``ctx`` tokens per slot × ``parallel`` slots
    (at most each model's trained context with ``ctx_up_to_training``: no --ctx given), of the
    licences ``licence`` allows (``any``, ``commercial``, ``open``); with ``users``, judged by each
    user's decode speed when that many use a model at once; ``thinking`` (``auto``, ``on``,
    ``off``): the modes of each model that are candidates; ``models``: spec and summary by key
    where not from the catalog's headers (a Hub repository's). This CPU's calibration prices the
    host's part only when the host is this machine (no ``--ram``).

    Raises:
        CatalogError: a catalog header is unreadable.
    """
    host = load_host_defaults()
    machine = machine_for(hardware, host)
    version = engine_version() if not hardware.ram_overridden else None
    where = plan_inputs(machine, version, host_is_here=not hardware.ram_overridden)
    # The cached digests serve devices that bind every tensor; a binding limit plans from the headers.
    models = models if models is not None else catalog_models(entries, from_digests=machine.max_tensor_bytes is None)
    request = request or RunRequest()
    scores, losses = _quality()
    recommendation = recommend_catalog(
        entries,
        models,
        hardware,
        where,
        host,
        load_gpus(),
        ctx=ctx,
        parallel=parallel,
        min_tokens_per_s=min_tokens_per_s,
        purpose=purpose,
        request=replace(request, parallel=parallel),
        quality=scores,
        quant_losses=_losses_by_file_type(losses, entries, models),
        prefer=prefer,
        ctx_up_to_training=ctx_up_to_training,
        licences=load_licences(),
        licence=licence,
        users=users,
        answer_lengths=load_answer_lengths(),
        thinking=thinking,
    )
    frontier = tuple(replace(verdict, single_machine=_single_machine(verdict.entry.family, hardware, ctx)) for verdict in recommendation.frontier)
    unused = unused_calibration(version) if not hardware.ram_overridden else None
    return replace(recommendation, frontier=frontier, notes=recommendation.notes + ((unused,) if unused else ()))


def _losses_by_file_type(losses: dict[str, QuantLoss], entries: Sequence[ModelEntry], models: Mapping[str, CatalogModel]) -> dict[str, QuantLoss]:
    """``losses`` and, for a file whose label is no measured quantisation (unsloth's
    ``UD-Q4_K_XL``, an imatrix ``i1-Q4_K_M``), the loss of the type its header names
    (``general.file_type``: what llama-quantize was asked for)."""
    extra = {}
    for entry in entries:
        summary = models[entry.key][1] if entry.key in models else None
        file_type = (summary.file_type or "").upper() if summary else ""
        if entry.quant.upper() not in losses and file_type in losses:
            extra[entry.quant.upper()] = losses[file_type]
    return {**losses, **extra} if extra else losses


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
        hardware.ram_bandwidth_bytes_per_s
        or (unified.bandwidth_bytes_per_s if unified else None)
        or load_host_defaults().assumed_ram_bandwidth_bytes_per_s
    )
    return single_machine_plan(
        model.single_machine,
        params=model.params,
        kv_bytes=round((kv_per_token or 0) * ctx) + state,
        ctx=ctx,
        gpu_bytes_here=sum(gpu.free_bytes for gpu in gpus),
        ram_bytes_here=hardware.ram_available_bytes + (unified.free_bytes if unified else 0),
        ram_bandwidth_bytes_per_s=ram_bandwidth,
        gpu_bandwidth_bytes_per_s=min(bandwidths) if bandwidths else None,
    )

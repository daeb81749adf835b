"""The speed figures of a named or described GPU: the model of :mod:`tierlocal.fit.gpu_speed`
fitted once to the published rows of recipes/gpu_speed.toml, looked up by the name a GPU is
detected or given as."""

from __future__ import annotations

import statistics
from dataclasses import astuple, replace
from functools import cache
from typing import Any

from .cache_file import cached
from .catalog import (
    find_gpu,
    gpu_cards,
    gpu_named_in,
    load_batch_shares,
    load_expert_batch_reads,
    load_expert_grouped_from,
    load_expert_tile_tokens,
    load_gpus,
    load_overhead_layer_share,
    load_published_rows,
)
from .fit.device_speed import DeviceSpeed
from .fit.estimate import Machine
from .fit.gpu_speed import CardFit, CardInfo, card_device_speed, card_fit, fit_cards, half_prefill_factor

__all__ = ["gpu_fits", "gpu_speed_for", "machine_gpu_speed", "typical_gpu_speed"]

GIB = 1024**3


@cache
def gpu_fits() -> tuple[dict[str, CardFit], float]:
    """The speed model fitted to the published rows (:func:`tierlocal.fit.gpu_speed.fit_cards`),
    kept in the planning cache (the fit is a least-squares solve over every row)."""
    return cached("gpu_fits", lambda: fit_cards(load_published_rows(), gpu_cards(), load_overhead_layer_share()), _fits_plain, _fits_from_plain)


def _fits_plain(fitted: tuple[dict[str, CardFit], float]) -> tuple[Any, float]:
    fits, kappa = fitted
    return {gpu: astuple(fit) for gpu, fit in fits.items()}, kappa


def _fits_from_plain(plain: tuple[Any, float]) -> tuple[dict[str, CardFit], float]:
    fits, kappa = plain
    return {gpu: CardFit(*values) for gpu, values in fits.items()}, float(kappa)


@cache
def _half_prefill() -> float:
    """λ of :func:`tierlocal.fit.gpu_speed.half_prefill_factor` on the published rows."""
    return half_prefill_factor(load_published_rows())


def _card_for(name: str) -> str | None:
    """The card of recipes/gpus.toml (one with a bandwidth) a device name means: an exact name
    or alias, else the one named inside it (:func:`tierlocal.catalog.gpu_named_in`)."""
    spec = find_gpu(name) or gpu_named_in(name)
    return spec.name if spec is not None and spec.name in gpu_cards() else None


def gpu_speed_for(name: str | None, bandwidth_bytes_per_s: int | None, fitted: tuple[dict[str, CardFit], float] | None = None) -> DeviceSpeed | None:
    """A GPU's speed figures from the model fitted to published llama.cpp results (``fitted``,
    default :func:`gpu_fits`): its own rows (``published``), else its group's on its datasheet
    (``derived``); a GPU not in recipes/gpus.toml with a known bandwidth gets every fitted card's
    median. None: no name and no bandwidth."""
    fits, kappa = fitted or gpu_fits()
    cards = gpu_cards()
    card = _card_for(name) if name else None
    if card is None:
        if not bandwidth_bytes_per_s or not fits:
            return None
        info = CardInfo(name or "GPU", bandwidth_bytes_per_s, None, "", "")
        fit = card_fit(info.name, fits, {**cards, info.name: info})
    else:
        info = cards[card]
        fit = card_fit(card, fits, cards)
    return _with_batch_share(card_device_speed(fit, info, kappa, _half_prefill()), info.backend) if fit is not None else None


def _with_batch_share(speed: DeviceSpeed, backend: str) -> DeviceSpeed:
    """``speed`` with its backend's fitted batch FLOP share (recipes/batched_bench.toml; a
    backend without one takes the median of those fitted), the experts' reads per prompt batch, and
    from how many tokens its expert kernel reads an expert once for them all, in tiles of how many."""
    shares = load_batch_shares()
    share = shares.get(backend.lower()) or (statistics.median(shares.values()) if shares else 1.0)
    grouped = load_expert_grouped_from().get(backend.lower(), 1)
    tile = load_expert_tile_tokens().get(backend.lower(), 0)
    return replace(speed, batch_flops_share=share, expert_batch_reads=load_expert_batch_reads(), expert_grouped_from=grouped, expert_tile_tokens=tile)


def typical_gpu_speed(memory_bytes: int) -> DeviceSpeed | None:
    """Figures for a GPU known by its memory alone (``--gpu 12GiB``): the median datasheet
    bandwidth of the cards of recipes/gpus.toml with that much memory (within 10%), with
    every fitted card's median efficiency (``derived``, and the note says it is assumed);
    None when no card is that size."""
    fits, kappa = gpu_fits()
    same = sorted(spec.bandwidth_bytes_per_s for spec in load_gpus() if abs(spec.memory_bytes - memory_bytes) <= 0.1 * memory_bytes)
    if not same or not fits:
        return None
    name = f"a typical {memory_bytes / GIB:.0f} GiB GPU"
    info = CardInfo(name, int(statistics.median(same)), None, "", "")
    fit = card_fit(name, fits, {**gpu_cards(), name: info})
    if fit is None:
        return None
    note = (
        f"assumed: {info.bandwidth_bytes_per_s / 1e9:,.0f} GB/s, the median of the {len(same)} cards of that size in recipes/gpus.toml (name "
        f"the GPU with --gpu for its own); {fit.note}"
    )
    return _with_batch_share(card_device_speed(replace(fit, note=note), info, kappa, _half_prefill()), info.backend)


def machine_gpu_speed(machine: Machine) -> DeviceSpeed | None:
    """The speed figures of a planned machine's GPU: :func:`gpu_speed_for` its name and
    bandwidth, or for a GPU given as a size only, :func:`typical_gpu_speed` (per device)."""
    if machine.gpu_name is None:
        return None
    speed = gpu_speed_for(machine.gpu_name, machine.gpu_bandwidth)
    if speed is None and machine.gpu_backend == "override" and machine.gpu_total_bytes:
        speed = typical_gpu_speed(machine.gpu_total_bytes // max(len(machine.gpu_devices), 1))
    return speed

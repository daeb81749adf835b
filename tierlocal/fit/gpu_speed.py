"""A GPU's llama.cpp speed, fitted to published llama-bench results (recipes/gpu_speed.toml).
Pure.

Decode, one generated token: the weights it reads (every matrix of a dense model, the active
experts' share of a mixture, the token embedding only as one row) at an effective bandwidth —
the card's datasheet bandwidth × an efficiency η, F16/BF16 bytes counted κ times — plus an
overhead ``c`` (kernel launches, sampling, the host round trip), which is what bounds a small
model on a fast card:

    seconds per token = bytes × κ_type ÷ (η × bandwidth) + c × (1 − s + s × layers ÷ 32)

η is fitted per card and ``c`` per backend (CUDA, ROCm, Metal, …), together, by least squares
on the relative error of every decode row (one card's rows rarely span two model sizes, its
backend's do); κ is one figure for all cards, the one that leaves the least residual. ``s``, the
share of the overhead paid per layer (kernels are launched per layer; the round trip and the
sampling once per token), is given (recipes/gpu_speed.toml [fit]): these rows cannot tell it,
each card's being of one depth but for the 7B/8B ones, and the batched-decode rows of
recipes/batched_bench.toml, of 24–48 layers on one card, choose it
(``python -m bench.concurrency_published --layer-shares``). A card faster than its bandwidth
allows after its backend's overhead (a newer build) keeps its datasheet bandwidth and the
overhead its own rows leave.

Prefill, one prompt token of a 512-token batch: 2 × the parameters it multiplies (FLOPs) at the
card's effective rate, the median of its quantised rows; F16/BF16 weights at λ times that rate
(λ: the median ratio of a card's half-precision to quantised prefill of the same model shape over
the fit rows — the engine multiplies half-precision weights with its float GEMM and quantised
ones with its quantised kernels, which run slower per FLOP). A card without rows takes its group's medians
(the same architecture generation, else the same backend, else all cards) applied to its own
datasheet: η × its bandwidth, and its prefill rate per FP16 TFLOP (or per GB/s where no FP16
figure is published). ``basis`` says which: ``published`` (rows for this card) or ``derived``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..published import HALF_TYPES, CardInfo, ModelShape, PublishedRow
from .device_speed import DeviceSpeed

__all__ = [
    "ModelShape",
    "PublishedRow",
    "CardInfo",
    "CardFit",
    "fit_cards",
    "card_fit",
    "card_device_speed",
    "half_prefill_factor",
    "overhead_scale",
    "REFERENCE_LAYERS",
    "HALF_TYPES",
]


@dataclass(frozen=True)
class CardFit:
    """A card's fitted figures: decode efficiency η (of its bandwidth), overhead per token (s),
    prefill FLOP/s (None: no figure), what they rest on (``published`` or ``derived``) and how,
    and overhead per layer (s)."""

    gpu: str
    efficiency: float
    token_overhead_s: float
    prefill_flops_per_s: float | None
    basis: str
    note: str
    layer_overhead_s: float


#: The layer count a row of unstated depth is taken to have, and the one a backend's overhead is
#: quoted at: its whole overhead per token for a model of this many layers.
REFERENCE_LAYERS = 32


def overhead_scale(shape: ModelShape, layer_share: float) -> float:
    """A row's overhead ÷ its backend's at :data:`REFERENCE_LAYERS` layers, ``layer_share`` of it
    per layer and the rest per token."""
    layers = shape.n_layer or REFERENCE_LAYERS
    return 1.0 - layer_share + layer_share * layers / REFERENCE_LAYERS


def _joint_fit(
    rows: Sequence[PublishedRow], cards: Mapping[str, CardInfo], kappa: float, layer_share: float = 0.0
) -> tuple[dict[str, float], dict[str, float], float]:
    """Seconds per byte for each card and the per-token overhead (s) of each backend at
    :data:`REFERENCE_LAYERS` layers, ``layer_share`` of it per layer, fitted together to every
    decode row (least squares on the relative error of t = bytes·x + c·scale, the overhead shared
    by a backend's cards: one card's rows rarely span two sizes, its backend's do); and the fit's
    squared residual."""
    import numpy as np

    gpus = sorted({row.gpu for row in rows})
    backends = sorted({cards[gpu].backend for gpu in gpus})
    design = np.zeros((len(rows), len(gpus) + len(backends)))
    for i, row in enumerate(rows):
        seconds = 1.0 / row.tokens_per_s
        read = row.read_bytes * (kappa if row.half else 1.0)
        design[i, gpus.index(row.gpu)] = read / seconds / 1e12
        design[i, len(gpus) + backends.index(cards[row.gpu].backend)] = overhead_scale(row.shape, layer_share) / seconds / 1e3
    target = np.ones(len(rows))
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = float(np.sum((design @ solution - target) ** 2))
    per_byte = {gpu: float(solution[i]) / 1e12 for i, gpu in enumerate(gpus)}
    overhead = {backend: max(float(solution[len(gpus) + i]) / 1e3, 0.0) for i, backend in enumerate(backends)}
    return per_byte, overhead, residual


#: κ values tried (half-precision rate ÷ quantised rate); the one whose fit leaves the least residual.
KAPPA_GRID = tuple(round(0.5 + 0.01 * step, 2) for step in range(101))


def fit_cards(rows: Sequence[PublishedRow], cards: Mapping[str, CardInfo], layer_share: float = 0.0) -> tuple[dict[str, CardFit], float]:
    """Every card with ``use = "fit"`` rows fitted, ``layer_share`` of each backend's overhead
    per layer (:func:`overhead_scale`); and κ. Cards ``cards`` does not know are left out (their
    bandwidth is needed for η); so is a card whose fit is not physical."""
    decode = [row for row in rows if row.use == "fit" and row.test.startswith("tg") and row.gpu in cards]
    prefill = [row for row in rows if row.use == "fit" and row.test.startswith("pp") and row.gpu in cards]
    if not decode:
        return {}, 1.0
    kappa = min(KAPPA_GRID, key=lambda k: _joint_fit(decode, cards, k, layer_share)[2]) if any(row.half for row in decode) else 1.0
    per_byte, overheads, _ = _joint_fit(decode, cards, kappa, layer_share)
    fits = {}
    for gpu, seconds_per_byte in per_byte.items():
        if seconds_per_byte <= 0:
            continue
        backend, bandwidth = cards[gpu].backend, cards[gpu].bandwidth_bytes_per_s
        card_rows = [row for row in decode if row.gpu == gpu]
        rates = [row.flops * row.tokens_per_s for row in prefill if row.gpu == gpu and not row.half]
        shown = ", ".join(sorted({f"{row.model} {row.test}" for row in card_rows}))
        efficiency, overhead = 1.0 / (seconds_per_byte * bandwidth), overheads[backend]
        note = f"fitted to {shown}; overhead the {backend} cards' {overhead * 1e3:.2f} ms at 32 layers"
        if efficiency > 1.0:
            # Faster than its bandwidth allows after the backend's overhead (a newer build with
            # less of it): the datasheet rate, and the overhead its own rows leave.
            efficiency = 1.0
            overhead = max(
                statistics.median(
                    (1.0 / row.tokens_per_s - row.read_bytes * (kappa if row.half else 1.0) / bandwidth) / overhead_scale(row.shape, layer_share)
                    for row in card_rows
                ),
                0.0,
            )
            note = f"fitted to {shown}: its datasheet bandwidth and the overhead its rows leave, {overhead * 1e3:.2f} ms at 32 layers"
        token, layer = overhead * (1.0 - layer_share), overhead * layer_share / REFERENCE_LAYERS
        fits[gpu] = CardFit(gpu, efficiency, token, statistics.median(rates) if rates else None, "published", note, layer)
    return fits, kappa


def half_prefill_factor(rows: Sequence[PublishedRow]) -> float:
    """λ: a card's prefill rate on half-precision weights ÷ on quantised ones, the median over the
    ``use = "fit"`` prefill rows of the cards with both for one model shape (the quantised rows'
    median against each half-precision row); 1.0 without such a pair."""
    prefill = [row for row in rows if row.use == "fit" and row.test.startswith("pp")]
    ratios = []
    for half in (row for row in prefill if row.half):
        quantised = [row.tokens_per_s for row in prefill if not row.half and row.gpu == half.gpu and row.shape.name == half.shape.name]
        if quantised:
            ratios.append(half.tokens_per_s / statistics.median(quantised))
    return statistics.median(ratios) if ratios else 1.0


def card_fit(name: str, fits: Mapping[str, CardFit], cards: Mapping[str, CardInfo]) -> CardFit | None:
    """``name``'s own fit, else one derived from its group's fitted cards; None when ``cards``
    does not know it."""
    if name in fits:
        return fits[name]
    card = cards.get(name)
    if card is None or not fits:
        return None
    for label, same in (
        ("architecture", lambda other: other.architecture == card.architecture),
        ("backend", lambda other: other.backend == card.backend),
    ):
        group = [fit for fit in fits.values() if fit.gpu in cards and same(cards[fit.gpu]) and cards[fit.gpu].architecture]
        if group:
            return _derived(card, group, cards, f"the {getattr(card, label)} cards' median ({', '.join(sorted(fit.gpu for fit in group))})")
    return _derived(card, list(fits.values()), cards, f"every fitted card's median ({len(fits)} cards)")


def _derived(card: CardInfo, group: Sequence[CardFit], cards: Mapping[str, CardInfo], how: str) -> CardFit:
    efficiency = statistics.median(fit.efficiency for fit in group)
    overhead = statistics.median(fit.token_overhead_s for fit in group)
    layer_overhead = statistics.median(fit.layer_overhead_s for fit in group)
    prefill = None
    with_flops = [fit.prefill_flops_per_s / info.fp16_flops for fit in group if fit.prefill_flops_per_s and (info := cards[fit.gpu]).fp16_flops]
    if card.fp16_flops and with_flops:
        prefill = statistics.median(with_flops) * card.fp16_flops
    else:
        per_bandwidth = [fit.prefill_flops_per_s / cards[fit.gpu].bandwidth_bytes_per_s for fit in group if fit.prefill_flops_per_s]
        prefill = statistics.median(per_bandwidth) * card.bandwidth_bytes_per_s if per_bandwidth else None
    return CardFit(card.name, efficiency, overhead, prefill, "derived", f"datasheet × {how}", layer_overhead)


def card_device_speed(fit: CardFit, card: CardInfo, kappa: float, half_prefill: float = 1.0) -> DeviceSpeed:
    """The fit as the speed model prices it: one decode rate for quantised weights, κ lower for
    half-precision ones, the overhead per token and per layer, and the prefill rate (``half_prefill`` = λ
    times it for half-precision weights)."""
    rate = fit.efficiency * card.bandwidth_bytes_per_s
    decode = {"*": rate, **dict.fromkeys(HALF_TYPES, rate / kappa)}
    flops = fit.prefill_flops_per_s
    prefill = {"*": flops, **dict.fromkeys(HALF_TYPES, flops * half_prefill)} if flops else {}
    return DeviceSpeed(
        device=card.name,
        source=fit.basis,
        note=fit.note,
        decode_bytes_per_s=decode,
        prefill_flops_per_s=prefill,
        attention_flops_per_s=fit.prefill_flops_per_s or 0.0,
        token_overhead_s=fit.token_overhead_s,
        layer_overhead_s=fit.layer_overhead_s,
    )

"""The catalog recommendation on the header-exact estimator. Pure.

Every catalog entry with a compact header (recipes/headers/) is planned exactly as ``check
FILE`` plans the file (:func:`~tierlocal.plan.source.check_source`: largest ``-ngl`` that fits,
MoE experts to RAM when that is faster, the CPU alone when the GPU is too small). An entry
without a header gets the tier-2 rule of thumb (plan/rule_of_thumb.py), labelled so.

Each planned entry then gets a status:

- ``no room``: it does not fit the machine, even partly in RAM;
- ``too slow``: it fits but decodes below ``min_tokens_per_s`` (the best speed there is: the
  estimate from published GPU results and this CPU's calibration, else the memory-bandwidth
  bound; not judged when unknown);
- ``tight``: it fits, but leaves less than ``tight_fraction`` (5%) of a device's free memory
  (beyond the GPU margin the plan already keeps);
- ``not for PURPOSE``: ``--for long-context`` and a trained context under 128k tokens;
- ``fits``: eligible.

The best eligible entry weighs quality against speed: each file's score for the task
(:mod:`.quality`: the model's published figures made comparable, less its quantisation's
measured loss) plus :data:`PREFERENCES` points per doubling of its decode speed (``quality``:
speed only breaks ties; ``balanced``, the default; ``speed``). The pick maximises that, so no
other eligible entry is both at least as good and at least as fast. Entries without a score
(no published figures) rank after those with one, among themselves by size, dense-equivalent
(a mixture of experts counts √(total × active) parameters), then precision (bits per weight,
counted up to Q6_K's: :data:`PRECISION_CAP_BITS`), then speed, then the newer release. Tight
entries are taken only when nothing else fits. Every other row says why it lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..catalog import GpuSpec, HostDefaults, ModelEntry
from ..engines.prompt_formats import TemplateChoice
from ..fit.device_speed import DeviceSpeed
from ..fit.estimate import Machine, RunRequest
from ..gguf import GGUFHeader
from ..hardware.types import Hardware
from ..published import QuantLoss
from ..units import format_bytes
from .quality import EntryQuality, ModelQuality, entry_quality
from .rule_of_thumb import Budget, CatalogFit, FrontierVerdict, fit_entry, frontier_verdict, memory_budget
from .source import SourceCheck, check_source
from .where import load_note, where_text

__all__ = [
    "Candidate",
    "CatalogRecommendation",
    "PURPOSES",
    "PREFERENCES",
    "PRECISION_CAP_BITS",
    "LONG_CONTEXT_TOKENS",
    "recommend_catalog",
    "dense_equivalent_params",
]

PURPOSES = ("chat", "code", "reasoning", "long-context")
#: Score points one doubling of decode speed is worth, per ``--prefer``: a choice, not a
#: measurement (``balanced``: a Q4_K_M that loses ~1.5 points to its Q8_0 and runs ~1.8x as
#: fast is preferred to it).
PREFERENCES = {"quality": 0.0, "balanced": 2.0, "speed": 8.0}
#: Precision counts up to Q6_K's bits per weight (its files carry 6.5–6.6): a choice, not a
#: measurement — above it the gain is small beside size and speed, so a faster Q6_K beats a
#: slower Q8_0 of one model.
PRECISION_CAP_BITS = 6.5
#: The trained context a model needs for ``--for long-context`` (tokens).
LONG_CONTEXT_TOKENS = 131_072
#: A catalog header keeps no template text: the published file's own is what serve will use.
_PUBLISHED_TEMPLATE = TemplateChoice("header", note="the published file's own chat template (serve checks it once the file is here)")
#: Status names, best first in the table.
_ORDER = {"best": 0, "fits": 1, "tight": 2, "too slow": 3, "not for long-context": 4, "no room": 5}


@dataclass(frozen=True)
class Candidate:
    """One catalog entry planned on the machine.

    ``plan`` is the estimator's (None for an entry without a header: ``fallback`` then holds
    the rule of thumb). Sizes in bytes, speed in tokens/s."""

    entry: ModelEntry
    plan: SourceCheck | None
    fallback: CatalogFit | None
    status: str
    reason: str
    decode_tokens_per_s: float | None
    speed_basis: str
    needed_bytes: int | None
    free_bytes: int
    where: str
    params: int
    bits_per_weight: float
    #: What to run it with, when the default would not do (``--load-mode none``), and why.
    note: str = ""
    #: The whole run: every device's need added up (``needed_bytes`` is the busiest device's).
    needed_total_bytes: int | None = None
    #: This file's quality score for the task (None: the model has no published figures).
    quality: EntryQuality | None = None

    @property
    def size_params(self) -> float:
        """Parameters, dense-equivalent (:func:`dense_equivalent_params`)."""
        return dense_equivalent_params(self.params, self.entry.active_params if self.entry.active_params < self.entry.params else self.params)

    def to_json(self) -> dict[str, object]:
        """The rule-of-thumb recommendation's fields (kept), and the estimator's."""
        entry = self.entry
        plan = self.plan.to_json() if self.plan else None
        estimate = self.plan.estimate if self.plan else None
        devices = estimate.devices if estimate else ()
        return {
            "model": entry.family,
            "series": entry.series,
            "architecture": entry.architecture,
            "params": self.params,
            "active_params": entry.active_params,
            "dense_equivalent_params": round(self.size_params),
            "quant": entry.quant,
            "bits_per_weight": round(self.bits_per_weight, 3),
            "file_bytes": self.plan.file_bytes if self.plan else entry.file_bytes,
            "file_bytes_measured": self.plan is not None or entry.file_bytes_measured,
            "ctx": estimate.params.n_ctx_seq if estimate else (self.fallback.ctx if self.fallback else None),
            "parallel": estimate.params.n_seq_max if estimate else (self.fallback.parallel if self.fallback else None),
            "weights_bytes": sum(d.weights_bytes for d in devices) if devices else (self.fallback.weights_bytes if self.fallback else None),
            "kv_bytes": sum(d.kv_bytes for d in devices) if devices else (self.fallback.kv_bytes if self.fallback else None),
            "total_needed_bytes": self.needed_bytes,
            "needed_all_devices_bytes": self.needed_total_bytes,
            "free_bytes": self.free_bytes,
            "fits": self.status in ("best", "fits", "tight", "too slow"),
            "status": self.status,
            "reason": self.reason,
            "where": self.where,
            "est_decode_tokens_per_s": None if self.decode_tokens_per_s is None else round(self.decode_tokens_per_s, 2),
            "speed_basis": self.speed_basis,
            "est_prefill_tokens_per_s": _rounded(self.plan.headline.prefill_tokens_per_s) if self.plan else None,
            "bound_decode_tokens_per_s": _rounded(self.plan.headline.bound_decode_tokens_per_s) if self.plan else _rounded(self.decode_tokens_per_s),
            "quality": self.quality.to_json() if self.quality else None,
            "method": "estimator" if self.plan else "rule-of-thumb",
            "ollama_tag": entry.ollama,
            "gguf_repo": entry.gguf_repo,
            "pull": f"hf://{entry.gguf_repo} --quant {entry.quant}" if entry.gguf_repo else None,
            "note": self.note or None,
            "facts_date": entry.facts_date,
            "source": entry.source,
            "plan": plan,
        }


@dataclass(frozen=True)
class CatalogRecommendation:
    """Every catalog entry planned and ranked for one machine, best first."""

    hardware: Hardware
    budget: Budget
    ctx: int
    parallel: int
    min_tokens_per_s: float
    purpose: str
    candidates: tuple[Candidate, ...]
    frontier: tuple[FrontierVerdict, ...]
    notes: tuple[str, ...] = ()
    prefer: str = "balanced"

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.status == "best"), None)

    @property
    def smaller(self) -> Candidate | None:
        """The largest eligible entry smaller than the best (a faster alternative)."""
        best = self.best
        return next((c for c in self.candidates if best and c.status in ("fits", "tight") and c.size_params < best.size_params), None)

    @property
    def larger(self) -> Candidate | None:
        """The smallest entry larger than the best, with why it lost."""
        best = self.best
        larger = [c for c in self.candidates if best is None or c.size_params > best.size_params]
        return min(larger, key=lambda c: (c.size_params, -c.bits_per_weight)) if larger else None

    def to_json(self) -> dict[str, object]:
        """The documented ``check --json`` object (no SOURCE): today's fields, plus every
        candidate with its status and reason, and the best one's per-device plan."""
        best = self.best
        return {
            "method": "estimator",
            "hardware": self.hardware.to_json(),
            "budget": self.budget.to_json(),
            "ctx": self.ctx,
            "parallel": self.parallel,
            "purpose": self.purpose,
            "prefer": self.prefer,
            "min_tokens_per_s": self.min_tokens_per_s,
            "recommendation": best.to_json() if best else None,
            "alternatives": [{"role": role, **c.to_json()} for role, c in (("smaller", self.smaller), ("larger", self.larger)) if c is not None],
            "candidates": [{**c.to_json(), "plan": None} for c in self.candidates],
            "frontier": [verdict.to_json() for verdict in self.frontier],
            "notes": list(self.notes),
        }


def dense_equivalent_params(total: int, active: int) -> float:
    """A mixture of experts sized as a dense model: √(total × active) parameters (the common
    rule of thumb for what such a model knows); a dense model's own count."""
    return math.sqrt(total * active) if 0 < active < total else float(total)


def recommend_catalog(
    entries: Sequence[ModelEntry],
    headers: Mapping[str, Sequence[GGUFHeader]],
    hardware: Hardware,
    machine: Machine,
    host: HostDefaults,
    gpus: Sequence[GpuSpec],
    *,
    ctx: int,
    parallel: int,
    min_tokens_per_s: float,
    purpose: str = "chat",
    request: RunRequest | None = None,
    host_speed: DeviceSpeed | None = None,
    gpu_speed: DeviceSpeed | None = None,
    tight_fraction: float = 0.05,
    quality: Mapping[str, Mapping[str, ModelQuality]] | None = None,
    quant_losses: Mapping[str, QuantLoss] | None = None,
    prefer: str = "balanced",
) -> CatalogRecommendation:
    """Plan every entry (``headers`` by entry key; an entry without is planned by the rule of
    thumb) at ``ctx`` tokens per slot × ``parallel`` slots, and rank them (module docstring) by
    ``quality`` (model → task → score) less ``quant_losses`` (by upper-case type), weighed
    against speed as ``prefer`` (:data:`PREFERENCES`) says."""
    request = request or RunRequest()
    budget = memory_budget(hardware, host)
    planned = []
    for entry in entries:
        if entry.frontier:
            continue
        if entry.key in headers:
            check = check_source(
                entry.key, list(headers[entry.key]), machine, ctx=ctx, parallel=parallel, request=request,
                host_speed=host_speed, gpu_speed=gpu_speed, model_path=f"<{entry.family}-{entry.quant}.gguf after tierlocal pull>",
                template=_PUBLISHED_TEMPLATE, host_is_here=not hardware.ram_overridden,
            )  # fmt: skip
            candidate = _from_plan(entry, check, min_tokens_per_s, purpose, tight_fraction)
        else:
            candidate = _from_rule(entry, fit_entry(entry, budget, host, ctx=ctx, parallel=parallel), min_tokens_per_s, purpose)
        scores = (quality or {}).get(entry.family, {})
        planned.append(replace(candidate, quality=entry_quality(scores.get(purpose), entry.quant, quant_losses or {})))
    ranked = _rank(planned, PREFERENCES[prefer], purpose)
    frontier = tuple(frontier_verdict(entry, gpus) for entry in entries if entry.frontier)
    return CatalogRecommendation(hardware, budget, ctx, parallel, min_tokens_per_s, purpose, ranked, frontier, _quality_notes(ranked, purpose), prefer)


def _quality_notes(ranked: Sequence[Candidate], purpose: str) -> tuple[str, ...]:
    """What the scores rest on, where it matters to the reader."""
    notes = []
    unscored = sorted({c.entry.family for c in ranked if c.quality is None})
    if unscored:
        notes.append(f"no published quality figures for {', '.join(unscored)}: ranked after the scored entries, by size then precision")
    general = sorted({c.entry.family for c in ranked if c.quality is not None and c.quality.model.basis == "general"})
    if general:
        notes.append(f"no {purpose} figures for {', '.join(general)}: scored from all of their published figures")
    unmeasured = sorted({c.entry.quant for c in ranked if c.quality is not None and c.quality.unmeasured})
    if unmeasured:
        notes.append(f"no measured quantisation loss for {', '.join(unmeasured)}: scored as lossless")
    return tuple(notes)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _speed(check: SourceCheck) -> tuple[float | None, str]:
    """The decode tokens/s a row is judged by and its basis (:class:`HeadlineSpeed`)."""
    headline = check.headline
    return headline.decode_tokens_per_s, headline.basis


def _from_plan(entry: ModelEntry, check: SourceCheck, min_speed: float, purpose: str, tight_fraction: float) -> Candidate:
    estimate = check.estimate
    speed, basis = _speed(check)
    devices = estimate.devices if estimate else ()
    limiting = max(devices, key=lambda d: d.total_needed_bytes / max(d.free_bytes, 1)) if devices else None
    needed = limiting.total_needed_bytes if limiting else None
    free = limiting.free_bytes if limiting else 0
    bits = check.file_bytes * 8 / max(check.params, 1)
    status, reason = _status(entry, estimate is not None and estimate.fits, speed, min_speed, purpose)
    if status == "fits" and limiting is not None and free - limiting.total_needed_bytes < tight_fraction * free:
        status, reason = "tight", f"tight: leaves {format_bytes(max(free - limiting.total_needed_bytes, 0))} of {format_bytes(free)} on {limiting.name}"
    if status == "no room" and limiting is not None:
        reason = f"no room: needs {format_bytes(limiting.total_needed_bytes)} on {limiting.name}, {format_bytes(free)} free"
    elif status == "no room":
        reason = f"no room: {check.reason}"
    note = load_note(check)
    if note:  # the printed command loads it the way it fits
        check = replace(check, command=[*check.command, "--load-mode", "none"])
    total = sum(d.total_needed_bytes for d in devices) if devices else None
    return Candidate(entry, check, None, status, reason, speed, basis, needed, free, where_text(check), check.params, bits, note, total)


def _from_rule(entry: ModelEntry, fit: CatalogFit, min_speed: float, purpose: str) -> Candidate:
    status, reason = _status(entry, fit.fits, fit.est_decode_tokens_per_s, min_speed, purpose)
    reason = f"{reason} (rule of thumb: no header for this entry)"
    basis = "bound" if fit.est_decode_tokens_per_s else "unknown"
    return Candidate(
        entry, None, fit, status, reason, fit.est_decode_tokens_per_s, basis, fit.total_needed_bytes, fit.budget.memory_bytes, fit.budget.device,
        entry.params, entry.bits_per_weight,
    )  # fmt: skip


def _status(entry: ModelEntry, fits: bool, speed: float | None, min_speed: float, purpose: str) -> tuple[str, str]:
    if purpose == "long-context" and entry.context_length < LONG_CONTEXT_TOKENS:
        return "not for long-context", f"trained for {entry.context_length:,} tokens (long-context asks {LONG_CONTEXT_TOKENS:,})"
    if not fits:
        return "no room", "no room"
    if speed is not None and speed < min_speed:
        return "too slow", f"too slow: ~{speed:,.1f} tok/s, under --min-speed {min_speed:g}"
    return "fits", "fits"


def _released(entry: ModelEntry) -> float:
    """``facts_date`` ("YYYY-MM" or "YYYY-MM-DD") as months since year 0; 0 when unreadable."""
    year, _, rest = entry.facts_date.partition("-")
    month = rest.partition("-")[0]
    return int(year) * 12 + int(month) - 1 if year.isdigit() and month.isdigit() else 0.0


def _size_key(candidate: Candidate) -> tuple[float, float, float, float]:
    """The fallback order for entries without a score: size, precision, speed, release."""
    return (candidate.size_params, min(candidate.bits_per_weight, PRECISION_CAP_BITS), _known_speed(candidate), _released(candidate.entry))


def _known_speed(candidate: Candidate) -> float:
    speed = candidate.decode_tokens_per_s
    if speed is None:  # unknown: the GPU's bandwidth was not given; whole on the GPU is the fastest way
        return math.inf if candidate.where in ("GPU",) or candidate.where.endswith(" GPUs") else 0.0
    return speed


def _utility(quality: EntryQuality, speed: float | None, points_per_doubling: float) -> float:
    """Score plus the speed's worth (:data:`PREFERENCES`); no speed term when the speed is
    unknown or zero."""
    return quality.score + (points_per_doubling * math.log2(speed) if speed and points_per_doubling else 0.0)


def _rank_key(candidate: Candidate, points_per_doubling: float) -> tuple[float, ...]:
    if candidate.quality is None:
        return (0.0, 0.0, 0.0, *_size_key(candidate))
    return (1.0, _utility(candidate.quality, candidate.decode_tokens_per_s, points_per_doubling), _known_speed(candidate), *_size_key(candidate))


def _rank(candidates: list[Candidate], points_per_doubling: float, purpose: str) -> tuple[Candidate, ...]:
    """Best first (module docstring); the winner's status becomes ``best`` and its reason says why."""
    eligible = [c for c in candidates if c.status == "fits"] or [c for c in candidates if c.status == "tight"]
    ordered = sorted(candidates, key=lambda c: (_ORDER[c.status], tuple(-v for v in _rank_key(c, points_per_doubling))))
    if not eligible:
        return tuple(ordered)
    winner = max(eligible, key=lambda c: _rank_key(c, points_per_doubling))
    if winner.quality is None:
        why = "largest model that fits (no published quality figures)" + (", highest precision" if winner.bits_per_weight > 6 else "")
    elif points_per_doubling == 0:
        why = f"the highest {purpose} score that fits ({winner.quality.score:.1f})"
    else:
        why = f"the {purpose} score ({winner.quality.score:.1f}) and speed that weigh most"
    if winner.status == "tight":
        why += f" — {winner.reason}; nothing fits with room to spare"
    best = replace(winner, status="best", reason=why)
    return (best, *(replace(c, reason=_lost_to(c, winner)) if c.status == "fits" else c for c in ordered if c is not winner))


def _lost_to(candidate: Candidate, winner: Candidate) -> str:
    """Why an eligible entry lost, in one phrase: its score and speed beside the winner's."""
    if candidate.quality is None or winner.quality is None:
        if winner.quality is not None:
            return "fits; no published quality figures"
        if candidate.size_params < winner.size_params:
            return "fits; smaller"
        if min(candidate.bits_per_weight, PRECISION_CAP_BITS) < min(winner.bits_per_weight, PRECISION_CAP_BITS):
            return "fits; lower precision"
        return "fits; slower" if _known_speed(candidate) < _known_speed(winner) else "fits; an older release of the same size"
    points = winner.quality.score - candidate.quality.score
    score = f"{points:.1f} points lower" if points >= 0.05 else f"{-points:.1f} points higher" if points <= -0.05 else "the same score"
    ours, theirs = candidate.decode_tokens_per_s, winner.decode_tokens_per_s
    if not ours or not theirs:
        return f"fits; {score}"
    ratio = ours / theirs
    speed = f"{ratio:.1f}× faster" if ratio >= 1.05 else f"{1 / ratio:.1f}× slower" if ratio <= 1 / 1.05 else "as fast"
    return f"fits; {score}, {speed}"

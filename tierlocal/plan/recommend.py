"""The catalog recommendation on the header-exact estimator. Pure.

Every catalog entry with a compact header (recipes/headers/) is planned exactly as ``check
FILE`` plans the file (:func:`~tierlocal.plan.source.check_model` on the spec of its header:
largest ``-ngl`` that fits, MoE experts to RAM when that is faster, the CPU alone when the GPU
is too small); only the plans that are shown get their times to first token and the q8_0
cache suggestion. An entry without a header gets the tier-2 rule of thumb
(plan/rule_of_thumb.py), labelled so.

Each planned entry then gets a status:

- ``no room``: it does not fit the machine, even partly in RAM;
- ``too slow``: it fits but decodes below ``min_tokens_per_s`` (the best speed there is: the
  estimate from published GPU results and this CPU's calibration, else the memory-bandwidth
  bound; not judged when unknown, nor for an embedding model, which reads and never decodes);
- ``tight``: it fits, but leaves less than ``tight_fraction`` (5%) of a device's free memory
  (beyond the GPU margin the plan already keeps);
- ``not for PURPOSE``: ``--for long-context`` and a trained context under 128k tokens;
- ``licence``: ``--licence commercial`` and a non-commercial licence, or ``--licence open`` and
  one with use-based terms (recipes/licences.toml; a licence it does not know counts as neither);
- ``fits``: eligible.

A score that rests on fewer than :data:`~tierlocal.plan.quality.MIN_EVIDENCE` benchmarks of the
model's own is thin: such an entry is the pick only when no better-attested one fits.

A purpose ranks the entries of its role: ``embeddings`` the embedding models (recipes/models.toml
``role``), every other purpose the generation models; an embedding model's speed is its prompt
(prefill) tokens/s.

The best eligible entry weighs quality against time: each file's score for the task
(:mod:`.quality`: the model's published figures made comparable, less its quantisation's
measured loss; a model with both modes is a candidate per mode, :mod:`.modes`) less
:data:`PREFERENCES` points per doubling of the wait for a typical answer beyond
:data:`PATIENCE_S` (:mod:`.answer_time`: the prompt, a thinking mode's trace and the answer at
the plan's speeds; ``quality``: time only breaks ties; ``balanced``, the default; ``speed``). The
pick maximises that, so no other eligible entry is both at least as good and at least as quick. Entries without a score
(no published figures) rank after those with one, among themselves by size, dense-equivalent
(a mixture of experts counts √(total × active) parameters), then precision (bits per weight,
counted up to Q6_K's: :data:`PRECISION_CAP_BITS`), then speed, then the newer release. Tight
entries are taken only when nothing else fits. Every other row says why it lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from ..catalog import GpuSpec, HostDefaults, ModelEntry
from ..engines.prompt_formats import TemplateChoice
from ..fit.estimate import RunRequest
from ..fit.model import ModelSpec
from ..gguf import ModelSummary
from ..hardware.types import Hardware
from ..published import AnswerLengths, LicenceTerms, QuantLoss
from ..units import format_bytes
from .candidates import Candidate, CatalogRecommendation
from .inputs import PlanAsk, PlanInputs
from .modes import EMBEDDING_PURPOSES, THINKING, candidates_by_mode, mode_command, mode_notes
from .quality import EntryQuality, ModelQuality
from .rule_of_thumb import CatalogFit, fit_entry, frontier_verdict, memory_budget
from .source import SourceCheck, check_model
from .where import load_note, where_text

__all__ = [
    "PURPOSES",
    "EMBEDDING_PURPOSES",
    "role_for",
    "PREFERENCES",
    "PRECISION_CAP_BITS",
    "LONG_CONTEXT_TOKENS",
    "LICENCE_FILTERS",
    "THINKING",
    "PATIENCE_S",
    "ANSWER_SCALE_TOKENS",
    "wait_seconds",
    "recommend_catalog",
]

PURPOSES = ("chat", "code", "reasoning", "long-context", "embeddings")
#: Score points one doubling of the wait for a typical answer costs (past :data:`PATIENCE_S`),
#: per ``--prefer``: a choice, not a measurement.
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
_ORDER = {"best": 0, "fits": 1, "tight": 2, "too slow": 3, "not for long-context": 4, "licence": 5, "no room": 6}
#: The answer (tokens) a candidate is timed for where no time to a typical answer is known (no
#: measurement of its mode): the ranking weighs the wait for that many tokens at its decode speed.
ANSWER_SCALE_TOKENS = 1000.0
#: The wait (seconds) below which a faster answer weighs little: a choice, not a measurement.
#: The cost of a wait is log2(1 + seconds / PATIENCE_S) × the preference's points — near 0 for an
#: answer in 2 s, a point per doubling past half a minute.
PATIENCE_S = 10.0
#: The wait an entry with no known speed is weighed at: ranked after those with one.
_UNKNOWN_WAIT_S = 3600.0
#: ``--licence``: the uses of recipes/licences.toml each choice keeps.
LICENCE_FILTERS = {"any": ("open", "conditions", "non-commercial"), "commercial": ("open", "conditions"), "open": ("open",)}


def recommend_catalog(
    entries: Sequence[ModelEntry],
    models: Mapping[str, tuple[ModelSpec, ModelSummary]],
    hardware: Hardware,
    where: PlanInputs,
    host: HostDefaults,
    gpus: Sequence[GpuSpec],
    *,
    ctx: int,
    parallel: int,
    min_tokens_per_s: float,
    purpose: str = "chat",
    request: RunRequest | None = None,
    tight_fraction: float = 0.05,
    quality: Mapping[str, Mapping[str, ModelQuality]] | None = None,
    quant_losses: Mapping[str, QuantLoss] | None = None,
    prefer: str = "balanced",
    ctx_up_to_training: bool = False,
    licences: Mapping[str, LicenceTerms] | None = None,
    licence: str = "any",
    users: int | None = None,
    answer_lengths: AnswerLengths | None = None,
    thinking: str = "auto",
) -> CatalogRecommendation:
    """Plan every entry (``models``: spec and summary by key, else the rule of thumb) on ``where`` at ``ctx`` per slot × ``parallel``
    (``ctx_up_to_training``: ≤ its trained context), speed per user at ``users``; rank (module docstring) by ``quality`` less
    ``quant_losses`` against the time to a typical answer (``answer_lengths``) as ``prefer`` says; ``licence`` leaves out what
    ``licences`` disallow; ``thinking`` (:data:`THINKING`) which modes of a model are candidates."""
    budget = memory_budget(hardware, host)
    ask = PlanAsk(ctx, parallel, request or RunRequest(), users=users, up_to_training=ctx_up_to_training)
    on_this_machine = partial(check_model, where=where, ask=ask, template=_PUBLISHED_TEMPLATE)

    def plan(entry: ModelEntry, detail: bool) -> SourceCheck:
        path = f"<{entry.family}-{entry.quant}.gguf after tierlocal pull>"
        return _loaded(on_this_machine(entry.key, *models[entry.key], model_path=path, detail=detail))

    def judged(entry: ModelEntry) -> list[Candidate]:
        if entry.key in models:
            candidate = _from_plan(entry, plan(entry, False), min_tokens_per_s, purpose, tight_fraction)
        else:
            fit = fit_entry(entry, budget, host, ctx=ctx, parallel=parallel, up_to_training=ctx_up_to_training)
            candidate = _from_rule(entry, fit, min_tokens_per_s, purpose)
        candidate = replace(candidate, licence=(licences or {}).get(entry.licence))
        each = candidates_by_mode(candidate, quality or {}, thinking, quant_losses or {}, answer_lengths, purpose)
        return [_licensed(moded, licence) for moded in each]

    served = [entry for entry in entries if not entry.frontier and entry.role == role_for(purpose)]
    ranked = _rank([candidate for entry in served for candidate in judged(entry)], PREFERENCES[prefer], purpose)
    frontier = tuple(frontier_verdict(entry, gpus) for entry in entries if entry.frontier)
    notes = _quality_notes(ranked, purpose) + mode_notes(served, quality or {}, thinking, purpose)
    if purpose in EMBEDDING_PURPOSES:
        notes = ("~tok/s is the prompt's (prefill): an embedding model reads its input and writes nothing", *notes)
    found = CatalogRecommendation(hardware, budget, ctx, parallel, min_tokens_per_s, purpose, ranked, frontier, notes, prefer, licence, users)
    return _with_detail(found, lambda entry: plan(entry, True))


def _with_detail(recommendation: CatalogRecommendation, plan: Callable[[ModelEntry], SourceCheck]) -> CatalogRecommendation:
    """The plans that are shown — the best, the smaller and larger alternatives, and the first
    row (the closest, when nothing fits) — planned again with every detail."""
    first = recommendation.candidates[0] if recommendation.candidates else None
    shown = {id(c) for c in (recommendation.best, recommendation.smaller, recommendation.larger, first) if c is not None}
    candidates = tuple(
        replace(c, plan=mode_command(plan(c.entry), c)) if id(c) in shown and c.plan is not None else c for c in recommendation.candidates
    )
    return replace(recommendation, candidates=candidates)


def _loaded(check: SourceCheck) -> SourceCheck:
    """``check`` with its command loading the file the way it fits (:func:`load_note`)."""
    return replace(check, command=[*check.command, "--load-mode", "none"]) if load_note(check) else check


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


def role_for(purpose: str) -> str:
    """The catalog role (recipes/models.toml ``role``) a purpose ranks."""
    return "embeddings" if purpose in EMBEDDING_PURPOSES else "chat"


def _speed(check: SourceCheck, purpose: str) -> tuple[float | None, str]:
    """The tokens/s a row is judged by and its basis: for an embedding model the prompt's
    (prefill: it reads, never writes), else decode — each user's when the plan was asked for
    several users at once, else one stream's (:class:`HeadlineSpeed`)."""
    if purpose in EMBEDDING_PURPOSES:
        return check.headline.prefill_tokens_per_s, check.headline.basis
    shared = check.users_at(check.users_asked) if check.users_asked and check.users_asked > 1 else None
    if shared is not None:
        return shared.per_user_decode_tokens_per_s, shared.basis
    headline = check.headline
    return headline.decode_tokens_per_s, headline.basis


def _from_plan(entry: ModelEntry, check: SourceCheck, min_speed: float, purpose: str, tight_fraction: float) -> Candidate:
    estimate = check.estimate
    speed, basis = _speed(check, purpose)
    devices = estimate.devices if estimate else ()
    limiting = max(devices, key=lambda d: d.total_needed_bytes / max(d.free_bytes, 1)) if devices else None
    needed = limiting.total_needed_bytes if limiting else None
    free = limiting.free_bytes if limiting else 0
    bits = check.file_bytes * 8 / max(check.params, 1)
    status, reason = _status(entry, estimate is not None and estimate.fits, speed, min_speed, purpose)
    if status == "fits" and limiting is not None and free - limiting.total_needed_bytes < tight_fraction * free:
        status, reason = (
            "tight",
            f"tight: leaves {format_bytes(max(free - limiting.total_needed_bytes, 0))} of {format_bytes(free)} on {limiting.name}",
        )
    if status == "no room" and limiting is not None:
        reason = f"no room: needs {format_bytes(limiting.total_needed_bytes)} on {limiting.name}, {format_bytes(free)} free"
    elif status == "no room":
        reason = f"no room: {check.reason}"
    note = load_note(check)  # the command already loads it the way it fits (_loaded)
    total = sum(d.total_needed_bytes for d in devices) if devices else None
    return Candidate(entry, check, None, status, reason, speed, basis, needed, free, where_text(check), check.params, bits, note, total)


def _from_rule(entry: ModelEntry, fit: CatalogFit, min_speed: float, purpose: str) -> Candidate:
    status, reason = _status(entry, fit.fits, fit.est_decode_tokens_per_s, min_speed, purpose)
    reason = f"{reason} (rule of thumb: no header for this entry)"
    basis = "bound" if fit.est_decode_tokens_per_s else "unknown"
    return Candidate(
        entry,
        None,
        fit,
        status,
        reason,
        fit.est_decode_tokens_per_s,
        basis,
        fit.total_needed_bytes,
        fit.budget.memory_bytes,
        fit.budget.device,
        entry.params,
        entry.bits_per_weight,
    )


def _status(entry: ModelEntry, fits: bool, speed: float | None, min_speed: float, purpose: str) -> tuple[str, str]:
    if purpose == "long-context" and entry.context_length < LONG_CONTEXT_TOKENS:
        return "not for long-context", f"trained for {entry.context_length:,} tokens (long-context asks {LONG_CONTEXT_TOKENS:,})"
    if not fits:
        return "no room", "no room"
    if speed is not None and speed < min_speed and purpose not in EMBEDDING_PURPOSES:
        return "too slow", f"too slow: ~{speed:,.1f} tok/s, under --min-speed {min_speed:g}"
    return "fits", "fits"


def _licensed(candidate: Candidate, wanted: str) -> Candidate:
    """``candidate``, or set aside (status ``licence``) when its licence does not allow the use ``--licence`` asks for."""
    terms = candidate.licence
    if wanted == "any" or (terms is not None and terms.use in LICENCE_FILTERS[wanted]):
        return candidate
    why = terms.use if terms is not None else "terms not in recipes/licences.toml"
    return replace(candidate, status="licence", reason=f"licence {candidate.entry.licence}: {why}, outside --licence {wanted}")


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


def wait_seconds(candidate: Candidate) -> float:
    """The seconds the ranking weighs: the time to a typical answer where it is known, else a
    :data:`ANSWER_SCALE_TOKENS`-token answer at the decode speed, else an hour (unknown speed)."""
    if candidate.answer is not None:
        return candidate.answer.seconds
    speed = candidate.decode_tokens_per_s
    return ANSWER_SCALE_TOKENS / speed if speed else _UNKNOWN_WAIT_S


def _utility(quality: EntryQuality, seconds: float, points_per_doubling: float) -> float:
    """Score less the wait's cost (:data:`PREFERENCES` points per doubling of the wait beyond
    :data:`PATIENCE_S`: ``log2(1 + seconds / PATIENCE_S)``)."""
    return quality.score - points_per_doubling * math.log2(1.0 + seconds / PATIENCE_S)


def _rank_key(candidate: Candidate, points_per_doubling: float, purpose: str = "chat") -> tuple[float, ...]:
    if candidate.quality is None:
        return (0.0, 0.0, 0.0, *_size_key(candidate))
    if purpose in EMBEDDING_PURPOSES:  # nothing to wait for: documents to read, at the prompt's tokens/s
        speed = candidate.decode_tokens_per_s
        utility = candidate.quality.score + (points_per_doubling * math.log2(speed) if speed else 0.0)
    else:
        utility = _utility(candidate.quality, wait_seconds(candidate), points_per_doubling)
    return (1.0, utility, _known_speed(candidate), *_size_key(candidate))


def _rank(candidates: list[Candidate], points_per_doubling: float, purpose: str) -> tuple[Candidate, ...]:
    """Best first (module docstring); the winner's status becomes ``best`` and its reason says why."""
    fitting = [c for c in candidates if c.status == "fits"] or [c for c in candidates if c.status == "tight"]
    # A score on thin evidence never wins on it alone: such an entry is the pick only when nothing better attested fits.
    eligible = [c for c in fitting if c.quality is None or not c.quality.model.thin] or fitting
    ordered = sorted(candidates, key=lambda c: (_ORDER[c.status], tuple(-v for v in _rank_key(c, points_per_doubling, purpose))))
    if not eligible:
        return tuple(ordered)
    winner = max(eligible, key=lambda c: _rank_key(c, points_per_doubling, purpose))
    if winner.quality is None:
        why = "largest model that fits (no published quality figures)" + (", highest precision" if winner.bits_per_weight > 6 else "")
    elif points_per_doubling == 0:
        why = f"the highest {purpose} score that fits ({winner.quality.score:.1f})"
    else:
        pace = "time to answer" if winner.answer is not None else "speed"
        why = f"the {purpose} score ({winner.quality.score:.1f}) and {pace} that weigh most"
    if winner.quality is not None and winner.quality.model.thin:
        why += f" (thin evidence: {winner.quality.model.evidence.removesuffix('; thin')}; nothing better attested fits)"
    if winner.status == "tight":
        why += f" — {winner.reason}; nothing fits with room to spare"
    best = replace(winner, status="best", reason=why)
    return (best, *(replace(c, reason=_lost_to(c, winner)) if c.status == "fits" else c for c in ordered if c is not winner))


def _lost_to(candidate: Candidate, winner: Candidate) -> str:
    """Why an eligible entry lost, in one phrase: its score and speed beside the winner's (or
    the thin evidence its score rests on)."""
    thin = candidate.quality is not None and candidate.quality.model.thin and winner.quality is not None and not winner.quality.model.thin
    reason = _compared(candidate, winner)
    return (
        f"{reason}; its score rests on thin evidence ({candidate.quality.model.evidence.removesuffix('; thin')})"
        if thin and candidate.quality
        else reason
    )


def _compared(candidate: Candidate, winner: Candidate) -> str:
    """Its score and speed beside the winner's, in one phrase."""
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
    if candidate.answer is not None and winner.answer is not None:
        ratio = winner.answer.seconds / candidate.answer.seconds
        pace = f"answers {ratio:.1f}× sooner" if ratio >= 1.05 else f"answers {1 / ratio:.1f}× later" if ratio <= 1 / 1.05 else "as fast"
        return f"fits; {score}, {pace}"
    ours, theirs = candidate.decode_tokens_per_s, winner.decode_tokens_per_s
    if not ours or not theirs:
        return f"fits; {score}"
    ratio = ours / theirs
    speed = f"{ratio:.1f}× faster" if ratio >= 1.05 else f"{1 / ratio:.1f}× slower" if ratio <= 1 / 1.05 else "as fast"
    return f"fits; {score}, {speed}"

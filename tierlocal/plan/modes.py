"""A model's modes as candidates: a model with figures in both modes (a thinking switch) is one
candidate per mode, each with that mode's score, its time to a typical answer and the llama-server
option that asks for it; ``--thinking on|off`` keeps one mode. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..catalog import ModelEntry
from ..engines.flags import reasoning_flags
from ..published import AnswerLengths, QuantLoss
from .answer_time import answer_time, typical_answer
from .candidates import Candidate
from .quality import EntryQuality, ModelQuality, entry_quality, mode_scores
from .source import SourceCheck

__all__ = ["THINKING", "EMBEDDING_PURPOSES", "candidates_by_mode", "modes_of", "in_mode", "mode_command", "mode_notes"]

#: ``--thinking``: which modes of a model are candidates (``auto``: each mode it has figures in;
#: ``on``: thinking at any effort; ``low``/``medium``/``high``: thinking at that effort only).
THINKING = ("auto", "on", "off", "low", "medium", "high")
#: The purposes an embedding model is ranked for (its speed is the prompt's: it reads, never
#: writes; it answers nothing, so no time to an answer); every other purpose ranks the
#: generation models (catalog role ``chat``).
EMBEDDING_PURPOSES = ("embeddings",)


def modes_of(
    quality: Mapping[str, Mapping[str, ModelQuality]], family: str, thinking: str, default_effort: str | None = None
) -> list[tuple[str | None, Mapping[str, ModelQuality]]]:
    """The modes ``family`` is a candidate in, with each mode's scores: every mode it has figures
    in under ``auto``, only thinking (at any effort) under ``on``, only answering directly under
    ``off``, only thinking at that effort under ``low``/``medium``/``high`` (``thinking`` of a model
    whose thinking is at that effort, ``default_effort``) — none when the model has no such mode;
    a model without figures once, its mode unknown (None)."""
    by_mode = mode_scores(quality, family)
    if not by_mode:
        return [(None, {})]
    return [(mode, scores) for mode, scores in by_mode.items() if _wanted(mode, thinking, default_effort)]


def _wanted(mode: str, thinking: str, default_effort: str | None) -> bool:
    if thinking == "auto":
        return True
    if thinking == "off":
        return mode == "standard"
    if thinking == "on":
        return mode.startswith("thinking")
    return mode == f"thinking-{thinking}" or (mode == "thinking" and default_effort == thinking)


def candidates_by_mode(
    candidate: Candidate,
    quality: Mapping[str, Mapping[str, ModelQuality]],
    thinking: str,
    losses: Mapping[str, QuantLoss],
    lengths: AnswerLengths | None,
    purpose: str,
) -> list[Candidate]:
    """``candidate`` once per mode ``thinking`` keeps (:func:`modes_of`), each scored for
    ``purpose`` in that mode less its quantisation's loss, and timed (:func:`in_mode`)."""
    entry = candidate.entry
    hybrid = len(mode_scores(quality, entry.family)) > 1
    return [
        in_mode(candidate, mode, entry_quality(scores.get(purpose), entry.quant, losses), lengths, purpose, hybrid)
        for mode, scores in modes_of(quality, entry.family, thinking, entry.reasoning_effort)
    ]


def in_mode(
    candidate: Candidate, mode: str | None, scored: EntryQuality | None, lengths: AnswerLengths | None, purpose: str, hybrid: bool
) -> Candidate:
    """``candidate`` in ``mode``: its score in that mode, the time to a typical answer (none for
    an embedding model, which answers nothing, or where no model was measured in that mode) and,
    for a model with both modes, the command that asks llama-server for this one."""
    typical = typical_answer(candidate.entry.family, mode, lengths) if lengths and mode is not None and purpose not in EMBEDDING_PURPOSES else None
    prefill = candidate.plan.headline.prefill_tokens_per_s if candidate.plan else None
    timed = answer_time(typical, prefill, candidate.decode_tokens_per_s) if typical is not None else None
    moded = replace(candidate, quality=scored, mode=mode, answer=timed, switchable=hybrid)
    return replace(moded, plan=mode_command(moded.plan, moded))


def mode_command(check: SourceCheck | None, candidate: Candidate) -> SourceCheck | None:
    """``check`` with its command asking for the candidate's mode: where the model has both
    llama-server's ``--reasoning on|off`` (the chat template's ``enable_thinking``), and for
    thinking at an effort ``--reasoning-effort LEVEL`` (:func:`~tierlocal.engines.flags.reasoning_flags`)."""
    if check is None or candidate.mode is None:
        return check
    flags = reasoning_flags(candidate.mode, effort=candidate.entry.reasoning_effort, switch=candidate.switchable)
    return replace(check, command=[*check.command, *flags]) if flags else check


def mode_notes(entries: Sequence[ModelEntry], quality: Mapping[str, Mapping[str, ModelQuality]], thinking: str, purpose: str) -> tuple[str, ...]:
    """What ``--thinking`` left out, and how answer times were priced where a model was not measured."""
    if thinking == "auto" or purpose in EMBEDDING_PURPOSES:
        return ()
    left = sorted({e.family for e in entries if mode_scores(quality, e.family) and not modes_of(quality, e.family, thinking, e.reasoning_effort)})
    if not left:
        return ()
    which = {"on": "without a thinking mode", "off": "that always think"}.get(thinking, f"without figures at {thinking} reasoning effort")
    named = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
    return (f"--thinking {thinking} leaves out the {len(left)} models {which}: {named}",)

"""What a catalog recommendation holds: every entry planned on the machine (:class:`Candidate`),
with its status and why, and the ranking of them all (:class:`CatalogRecommendation`). Pure.

:mod:`.recommend` plans and ranks them; the CLI, the terminal UI and ``--json`` read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..catalog import ModelEntry
from ..hardware.types import Hardware
from ..published import LicenceTerms
from .answer_time import AnswerTime
from .quality import EntryQuality
from .rule_of_thumb import Budget, CatalogFit, FrontierVerdict
from .source import SourceCheck

__all__ = ["Candidate", "CatalogRecommendation", "dense_equivalent_params"]


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
    #: What the model's licence allows (None: recipes/licences.toml does not know it).
    licence: LicenceTerms | None = None
    #: The mode it answers in (``thinking``: a reasoning trace first; ``standard``: directly; None:
    #: unknown, no figures): a model with both is two candidates, one per mode.
    mode: str | None = None
    #: The time to a typical answer in that mode on this machine (None: no speed or no measurement).
    answer: AnswerTime | None = None
    #: The model can answer with or without thinking (its other mode is another candidate).
    switchable: bool = False

    @property
    def key(self) -> str:
        """The entry's key, and the mode where it is known (``qwen3-8b:q4_k_m@thinking``)."""
        return self.entry.key if self.mode is None else f"{self.entry.key}@{self.mode}"

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
            "mode": self.mode,
            "answer": self.answer.to_json() if self.answer else None,
            "licence": entry.licence,
            "licence_terms": self.licence.to_json() if self.licence else None,
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
    #: ``--licence``: which licences the pick may have (any, commercial, open).
    licence: str = "any"
    #: ``--users``: the users at once each entry's speed is judged for (None: one).
    users: int | None = None

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
            "licence": self.licence,
            "users": self.users,
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


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)

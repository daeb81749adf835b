"""The time to a typical answer on a machine: the prompt read, then the reasoning trace (a
thinking model's), then the answer, at the plan's speeds. Pure.

A typical answer is a reasoning trace (none when the mode answers directly), then the answer.
The answer is the typical one to a real user's prompt that recipes/answer_tokens.toml names
(``[answer]``: a measured mean, the same for every model: no per-model answer lengths on real
prompts were found in both modes). The trace comes from published measurements (``[[length]]``:
the output tokens a model spent per question of a named workload, reasoning included, in each
mode). Workloads differ tenfold (a knowledge question against an olympiad problem), so every
model and mode is carried to one reference workload the file names, on which models of both
modes answered the same questions. The measurements are read as ``log tokens = workload effect
+ model-and-mode effect`` (least squares, alternating means): a model measured on other workloads
is carried to the reference by how the models measured on both compare. Then a thinking mode's
tokens on the reference are:

- measured there: the median of its own measurements (``basis: "measured"``);
- measured elsewhere only, linked to the reference through others: the fit's value (``"scaled"``);
- not measured (or not linked): the median of the linked thinking units (``"assumed"``) — a
  thinking model without a measurement is not priced like one that answers directly;

and its trace is that less what the models answering directly spent on the same questions.

Seconds = prompt tokens ÷ prefill tokens/s + output tokens ÷ each user's decode tokens/s (the
decode speed the plan judges: one stream's, or each user's when several are planned).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from ..published import AnswerLength, AnswerLengths

__all__ = ["TYPICAL_PROMPT_TOKENS", "TypicalAnswer", "AnswerTime", "typical_answer", "answer_time"]

#: The prompt a typical question brings (tokens): a choice, the middle of the 128/512/2048 that
#: ``check`` times the first token for.
TYPICAL_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class TypicalAnswer:
    """The output tokens one answer takes in ``mode``: ``tokens`` in all (reasoning included),
    ``reasoning_tokens`` of them the trace before the answer (0 answering directly); ``basis``
    ``measured``, ``scaled`` or ``assumed`` (module docstring), on the reference ``workload``,
    from the unit's own ``lengths`` (none when assumed)."""

    mode: str
    tokens: float
    reasoning_tokens: float
    basis: str
    workload: str
    lengths: tuple[AnswerLength, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "tokens": round(self.tokens),
            "reasoning_tokens": round(self.reasoning_tokens),
            "basis": self.basis,
            "workload": self.workload,
            "sources": sorted({length.source for length in self.lengths}) if self.basis != "assumed" else [],
        }


@dataclass(frozen=True)
class AnswerTime:
    """How long one typical answer takes: ``first_token_s`` to read the prompt (None: the prefill
    speed is unknown, the prompt counted as free), ``seconds`` until the answer's last token
    (reasoning first, when the mode thinks)."""

    answer: TypicalAnswer
    prompt_tokens: int
    first_token_s: float | None
    seconds: float
    decode_tokens_per_s: float

    def to_json(self) -> dict[str, object]:
        return {
            **self.answer.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 2),
            "seconds": round(self.seconds, 1),
        }


def typical_answer(model: str, mode: str, lengths: AnswerLengths) -> TypicalAnswer | None:
    """``model``'s typical answer in ``mode`` (module docstring): its reasoning trace carried to
    the reference workload, then the typical answer; None when no unit of that mode is linked."""
    fitted = _fitted(lengths)
    reference = lengths.reference_workload
    unit = (model, mode)
    own = [length for length in lengths.lengths if (length.model, length.mode) == unit]
    if mode == "standard":
        basis = "measured" if own else "assumed"
        return TypicalAnswer(mode, lengths.answer_tokens, 0.0, basis, reference, tuple(own))
    linked = [u for u in fitted.units if u[1] == mode]
    direct = [u for u in fitted.units if u[1] == "standard"]
    if not linked or not direct:
        return None
    on_reference = [length.tokens_per_answer for length in own if length.workload == reference]
    if on_reference:
        tokens, basis, used = statistics.median(on_reference), "measured", tuple(own)
    elif unit in fitted.units:
        tokens, basis, used = math.exp(fitted.workloads[reference] + fitted.units[unit]), "scaled", tuple(own)
    else:
        tokens = math.exp(fitted.workloads[reference] + statistics.median(fitted.units[u] for u in linked))
        basis, used = "assumed", ()
    # The trace: what thinking adds to the question answered directly (the median of the units
    # that answer directly, on the same workload).
    answered = math.exp(fitted.workloads[reference] + statistics.median(fitted.units[u] for u in direct))
    trace = max(tokens - answered, 0.0)
    return TypicalAnswer(mode, trace + lengths.answer_tokens, trace, basis, reference, used)


@dataclass(frozen=True)
class _Fit:
    """log tokens ≈ ``workloads[w]`` + ``units[(model, mode)]``, for the units and workloads
    linked to the reference workload."""

    workloads: dict[str, float]
    units: dict[tuple[str, str], float]


@functools.lru_cache(maxsize=4)
def _fitted(lengths: AnswerLengths) -> _Fit:
    """Alternating means of the log residuals over the component linked to the reference."""
    cells: dict[tuple[tuple[str, str], str], list[float]] = {}
    for length in lengths.lengths:
        cells.setdefault(((length.model, length.mode), length.workload), []).append(math.log(length.tokens_per_answer))
    linked_workloads, linked_units = {lengths.reference_workload}, set()
    grown = True
    while grown:  # the connected component of the reference workload
        grown = False
        for unit, workload in cells:
            if (workload in linked_workloads) != (unit in linked_units):
                linked_workloads.add(workload)
                linked_units.add(unit)
                grown = True
    mean = {key: statistics.fmean(values) for key, values in cells.items() if key[1] in linked_workloads}
    workloads = {w: statistics.fmean(v for (_, cw), v in mean.items() if cw == w) for w in linked_workloads}
    units = dict.fromkeys(linked_units, 0.0)
    for _ in range(200):
        units = {u: statistics.fmean(v - workloads[w] for (cu, w), v in mean.items() if cu == u) for u in linked_units}
        workloads = {w: statistics.fmean(v - units[u] for (u, cw), v in mean.items() if cw == w) for w in linked_workloads}
    return _Fit(workloads, units)


def answer_time(
    answer: TypicalAnswer, prefill_tokens_per_s: float | None, decode_tokens_per_s: float | None, prompt_tokens: int = TYPICAL_PROMPT_TOKENS
) -> AnswerTime | None:
    """The seconds ``answer`` takes at these speeds (tokens/s); None when the decode speed is
    unknown. An unknown prefill speed counts the prompt as free (``first_token_s`` None)."""
    if not decode_tokens_per_s or decode_tokens_per_s <= 0:
        return None
    first = prompt_tokens / prefill_tokens_per_s if prefill_tokens_per_s else None
    return AnswerTime(answer, prompt_tokens, first, (first or 0.0) + answer.tokens / decode_tokens_per_s, decode_tokens_per_s)

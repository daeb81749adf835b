"""One comparable quality score per task from the benchmark figures publishers report. Pure.

Publishers report different benchmarks, in different modes (``thinking``: a reasoning trace
before the answer; ``standard``), so raw figures do not compare: a model that reports only hard
tests looks weak beside one that reports only easy ones. The method (docs/how-it-works/quality.md,
recipes/quality.toml):

1. Each benchmark in each mode is a column; a task (``chat``, ``code``, ``reasoning``,
   ``long-context``; ``embeddings``, fitted apart from the rest) takes the columns its benchmarks make (recipes/quality.toml ``[[benchmark]]``).
   A column reported by fewer than :data:`MIN_REPORTERS` catalog models is left out (its
   difficulty cannot be told from the models' strength); two figures for one cell are averaged.
2. One strength ``q`` per model and a line per column are fitted together (a one-factor model,
   by alternating least squares): figure ≈ ``a_column + b_column × q_model``. A model's ``q``
   comes from the columns it reports, each read through that column's own line, so a model is
   not penalised for reporting a hard benchmark. The ``general`` fit takes every column of every
   task, its ``q`` shrunk towards the average by :data:`RIDGE` (one figure says less than six);
   each task's fit starts from the general ``q`` and is shrunk towards it, which places models
   whose task figures share no benchmark with the others' (Llama's long-context tests, say) by
   what their other figures say.
3. The score is the mean, over every column of the task, of the figure the model's ``q``
   predicts (0–100): what it would score on average across those benchmarks. ``reported``
   says how many of them it published.

A model with no figure in a task's columns is placed on them by its general strength (basis
``general``, marked so in the output); a model with no figure at all has no score.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..published import QualityFigure, QuantLoss

__all__ = [
    "TASKS",
    "SEPARATE_TASKS",
    "INDEPENDENT_WEIGHT",
    "CANDIDATE_MODES",
    "MIN_EVIDENCE",
    "MIN_REPORTERS",
    "RIDGE",
    "ModelQuality",
    "EntryQuality",
    "fit_quality",
    "entry_quality",
]

TASKS = ("chat", "code", "reasoning", "long-context", "embeddings")
#: Tasks whose models are not generation models (embedding models, scored on MTEB): fitted on
#: their own, apart from the general fit, since no benchmark links them to the chat models.
SEPARATE_TASKS = ("embeddings",)
#: The fewest catalog models a column needs to be fitted.
MIN_REPORTERS = 3
#: Shrinkage of each model's strength towards the average, in units of one column's evidence.
RIDGE = 0.5
#: How much a cell of independent figures (measured by an evaluator that publishes no model)
#: weighs in a model's strength beside a publisher's (its own or a rival's): a choice, not a measurement.
INDEPENDENT_WEIGHT = 2.0
#: The fewest benchmarks a score rests on before its evidence is not thin: a thin score never
#: wins the ranking while one with enough evidence fits (plan/recommend.py).
MIN_EVIDENCE = 3
_ITERATIONS = 500
#: The fit stops once no strength moves by more than this in a round.
_TOLERANCE = 1e-7


@dataclass(frozen=True)
class ModelQuality:
    """A model's score for one task: ``score`` 0–100 (the mean predicted figure over the
    ``columns`` fitted), from the ``reported`` columns it published (``figures``); ``basis``
    ``task`` (its own figures for this task) or ``general`` (none for this task: every task's)."""

    model: str
    task: str
    score: float
    basis: str
    reported: int
    columns: int
    figures: tuple[QualityFigure, ...]

    @property
    def mode(self) -> str:
        """The mode its figures are in (``thinking``, ``standard``), or ``both`` for a score
        that pools them (none does since hybrids are fitted per mode), ``none`` without figures."""
        modes = {figure.mode for figure in self.figures}
        return modes.pop() if len(modes) == 1 else ("both" if modes else "none")

    @property
    def independent_figures(self) -> int:
        """Its figures measured by an independent evaluator (not a model publisher)."""
        return sum(1 for figure in self.figures if figure.independent)

    @property
    def independent_sources(self) -> int:
        """The distinct sources of those figures."""
        return len({figure.source for figure in self.figures if figure.independent})

    @property
    def thin(self) -> bool:
        """Whether the score rests on fewer than :data:`MIN_EVIDENCE` benchmarks of its own."""
        return self.reported < MIN_EVIDENCE

    @property
    def evidence(self) -> str:
        """``6 benchmarks (2 independent, 1 source)``: what the score rests on, in words."""
        independent = f"{self.independent_figures} independent, {self.independent_sources} source{'s' * (self.independent_sources != 1)}"
        own = f"{self.reported} benchmark{'s' * (self.reported != 1)}" if self.basis == "task" else "none of its own for this task"
        return f"{own} ({independent if self.independent_figures else 'all self-reported'}){'; thin' if self.thin else ''}"

    def to_json(self) -> dict[str, object]:
        return {
            "task": self.task,
            "score": round(self.score, 1),
            "basis": self.basis,
            "benchmarks_reported": self.reported,
            "benchmarks_fitted": self.columns,
            "independent_figures": self.independent_figures,
            "independent_sources": self.independent_sources,
            "thin": self.thin,
            "figures": [figure.to_json() for figure in self.figures],
        }


@dataclass(frozen=True)
class EntryQuality:
    """One catalog file's score: the model's, less its quantisation's measured loss (``loss``:
    None where none is measured, then counted as no loss and said so)."""

    model: ModelQuality
    quant: str
    loss: QuantLoss | None
    #: The loss is not measured for this quantisation: taken as none.
    unmeasured: bool

    @property
    def score(self) -> float:
        """The model's score × (1 − the quantisation's relative perplexity increase)."""
        return self.model.score * (1.0 - (self.loss.ppl_increase if self.loss else 0.0))

    def to_json(self) -> dict[str, object]:
        return {
            **self.model.to_json(),
            "model_score": round(self.model.score, 1),
            "score": round(self.score, 1),
            "quant": self.quant,
            "quant_loss": self.loss.to_json() if self.loss else None,
            "quant_loss_measured": not self.unmeasured,
        }


def entry_quality(model: ModelQuality | None, quant: str, losses: Mapping[str, QuantLoss]) -> EntryQuality | None:
    """``model``'s score for a file in ``quant`` (16-bit files and MXFP4 as published lose
    nothing), or None when the model has no score."""
    if model is None:
        return None
    lossless = quant.upper() in ("F16", "BF16", "F32", "MXFP4", "MXFP4_MOE")
    loss = losses.get(quant.upper())
    return EntryQuality(model, quant, loss, unmeasured=loss is None and not lossless)


def fit_quality(figures: Sequence[QualityFigure], benchmark_tasks: Mapping[str, Sequence[str]]) -> dict[str, dict[str, ModelQuality]]:
    """model → task → :class:`ModelQuality`, for every model with a figure in a fitted column
    (module docstring). ``benchmark_tasks``: benchmark → the tasks it counts for. A model with a
    figure for a :data:`SEPARATE_TASKS` task (an embedding model) is left out of the general fit
    and scored by that task's own fit alone.

    A model with figures in both modes (a hybrid: Qwen3's thinking switch), or thinking at several
    efforts (gpt-oss), is fitted as one unit per mode (:attr:`QualityFigure.variant`), each on its
    own figures (which sit in the mode's columns): ``MODEL@thinking``, ``MODEL@standard``,
    ``MODEL@thinking-low`` hold each one's scores, ``MODEL`` the one most of its figures are in
    (thinking on a tie). Every model also has ``MODEL@MODE`` for its one mode (:func:`mode_scores`
    lists them)."""
    modes: dict[str, dict[str, int]] = {}
    for figure in figures:
        modes.setdefault(figure.model, {}).setdefault(figure.variant, 0)
        modes[figure.model][figure.variant] += 1
    split = {model for model, counts in modes.items() if len(counts) > 1}
    units = [replace(f, model=f"{f.model}@{f.variant}") if f.model in split else f for f in figures]
    separate = {f.model for f in units if set(benchmark_tasks.get(f.benchmark, ())) & set(SEPARATE_TASKS)}
    _, strength = _fit_task("general", [f for f in units if f.model not in separate], None)
    fitted: dict[str, dict[str, ModelQuality]] = {}
    for task in TASKS:
        own, _ = _fit_task(task, [f for f in units if task in benchmark_tasks.get(f.benchmark, ())], None if task in SEPARATE_TASKS else strength)
        for unit, quality in own.items():
            fitted.setdefault(unit, {})[task] = quality
    found: dict[str, dict[str, ModelQuality]] = {}
    for unit, tasks in fitted.items():
        model, _, mode = unit.partition("@")
        restored = {task: replace(q, model=model, figures=tuple(replace(f, model=model) for f in q.figures)) for task, q in tasks.items()}
        if mode:
            found[unit] = restored
        else:
            found[unit] = found[f"{unit}@{next(iter(modes[unit]))}"] = restored
    for model in split:
        counts = modes[model]
        main = max(sorted(counts), key=lambda m: (counts[m], m == "thinking"))
        if f"{model}@{main}" in found:
            found[model] = found[f"{model}@{main}"]
    return found


#: The modes a candidate may be in, in the order they are listed.
CANDIDATE_MODES = ("thinking", "thinking-high", "thinking-medium", "thinking-low", "standard")


def mode_scores(scores: Mapping[str, Mapping[str, ModelQuality]], model: str) -> dict[str, Mapping[str, ModelQuality]]:
    """``model``'s scores per mode (``thinking``, ``thinking-low`` …, ``standard``): each for a
    hybrid or a model with effort levels, its one mode for any other model with a score, none without."""
    return {mode: scores[f"{model}@{mode}"] for mode in CANDIDATE_MODES if f"{model}@{mode}" in scores}


def _fit_task(task: str, figures: Sequence[QualityFigure], prior: Mapping[str, float] | None) -> tuple[dict[str, ModelQuality], dict[str, float]]:
    """Each model's score for ``task`` from ``figures``, and its fitted strength; ``prior``:
    the general strengths this fit starts from and is shrunk towards (None: the general fit)."""
    cells: dict[tuple[str, str], list[float]] = {}
    publishers: set[tuple[str, str]] = set()  # cells with a figure from a model publisher's page
    for figure in figures:
        cells.setdefault((figure.model, figure.column), []).append(figure.score)
        if not figure.independent:
            publishers.add((figure.model, figure.column))
    independent = set(cells) - publishers
    reporters: dict[str, int] = {}
    for _model, column in cells:
        reporters[column] = reporters.get(column, 0) + 1
    kept = {column for column, count in reporters.items() if count >= MIN_REPORTERS}
    matrix: dict[str, dict[str, float]] = {}
    for (model, column), scores in cells.items():
        if column in kept:
            matrix.setdefault(model, {})[column] = statistics.fmean(scores)
    if prior is not None:
        matrix = {model: row for model, row in matrix.items() if model in prior}
    if len(matrix) < 2:
        return {}, {}
    weights = {model: {column: INDEPENDENT_WEIGHT if (model, column) in independent else 1.0 for column in row} for model, row in matrix.items()}
    lines, strength = _one_factor(matrix, prior, weights)
    found = {}
    for model, q in {**(prior or {}), **strength}.items():
        predicted = statistics.fmean(min(max(a + b * q, 0.0), 100.0) for a, b in lines.values())
        own = tuple(f for f in figures if f.model == model and f.column in kept)
        basis = "task" if model in matrix else "general"
        found[model] = ModelQuality(model, task, predicted, basis, len(matrix.get(model, {})), len(lines), own)
    return found, strength


def _one_factor(
    matrix: Mapping[str, Mapping[str, float]], prior: Mapping[str, float] | None, weights: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """Fit figure ≈ a_c + b_c × q_m by alternating least squares: without ``prior``, q is
    standardised each round and shrunk towards 0 by :data:`RIDGE`; with it, q starts at and is
    shrunk towards ``prior`` (which also fixes its scale). Returns ({column: (a, b)}, {model: q})."""
    columns = sorted({column for row in matrix.values() for column in row})
    by_column = {c: {m: row[c] for m, row in matrix.items() if c in row} for c in columns}
    spread = {c: (statistics.fmean(v.values()), statistics.pstdev(v.values()) or 1.0) for c, v in by_column.items()}
    if prior is None:
        strength = {m: statistics.fmean((s - spread[c][0]) / spread[c][1] for c, s in row.items()) for m, row in matrix.items()}
    else:
        strength = {m: prior[m] for m in matrix}
    lines: dict[str, tuple[float, float]] = {}
    for _ in range(_ITERATIONS):
        before = strength
        if prior is None:
            mean, scale = statistics.fmean(strength.values()), statistics.pstdev(strength.values()) or 1.0
            strength = {m: (q - mean) / scale for m, q in strength.items()}
        for column, values in by_column.items():
            qs = [strength[m] for m in values]
            q_mean, s_mean = statistics.fmean(qs), statistics.fmean(values.values())
            variance = sum((q - q_mean) ** 2 for q in qs)
            slope = sum((strength[m] - q_mean) * (s - s_mean) for m, s in values.items()) / variance if variance > 1e-9 else 0.0
            slope = max(slope, 0.1 * spread[column][1])  # a harder test never ranks the stronger model lower
            lines[column] = (s_mean - slope * q_mean, slope)
        weight = RIDGE * statistics.fmean(b * b for _, b in lines.values())  # one typical column's evidence × RIDGE
        towards = prior or {}
        strength = {
            m: (sum(weights[m][c] * lines[c][1] * (s - lines[c][0]) for c, s in row.items()) + weight * towards.get(m, 0.0))
            / (sum(weights[m][c] * lines[c][1] ** 2 for c in row) + weight)
            for m, row in matrix.items()
        }
        if max(abs(strength[m] - before[m]) for m in strength) < _TOLERANCE:
            break
    return lines, strength

"""How ``tierlocal check`` shows the catalog recommendation: the machine, the best entry's
per-device plan (the table ``check FILE`` prints), every other entry with why it lost, and the
frontier models that never fit one machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..catalog import load_answer_lengths
from ..plan.answer_time import AnswerTime
from ..plan.candidates import Candidate, CatalogRecommendation
from ..plan.single_machine import SingleMachinePlan
from ..plan.source import SourceCheck
from ..units import format_bytes, format_count, format_decimal_bytes, format_marketed_bytes
from .common import COMPACT_WIDTH, console

__all__ = ["Wording", "render_catalog_recommendation"]

#: Rows of the candidates table without --all: the best, then the nearest losers.
_ROWS = 14


@dataclass(frozen=True)
class Wording:
    """What a ranking ranks (``ranked``: the words for one of them; ``title``: the table's) and
    how to fetch and serve its pick (``commands``: the pick and its serve option → the sentence;
    None: the catalog's)."""

    ranked: str = "catalog model"
    title: str = "The catalog on this machine, best first"
    commands: Callable[[Candidate, str], str] | None = None


def render_catalog_recommendation(
    recommendation: CatalogRecommendation,
    *,
    show_all: bool = False,
    render_plan: Callable[[SourceCheck], None] | None = None,
    closest: Candidate | None = None,
    wording: Wording | None = None,
) -> None:
    """The answer first, then its plan (or, when nothing fits, ``closest``'s: why not), then
    the ranking with reasons (``wording``: what is ranked, and how to fetch and serve the pick)."""
    wording = wording or Wording()
    out = console()
    _print_machine(out, recommendation)
    best = recommendation.best
    if best is None:
        out.print(
            f"[bold]Verdict:[/bold] no {wording.ranked}{_licensed(recommendation)} fits this machine at {recommendation.ctx:,} tokens × "
            f"{recommendation.parallel} slot(s) "
            f"and decodes ≥ {recommendation.min_tokens_per_s:g} tok/s; lower --ctx or --min-speed, or use tier 3 (a hosted API)."
        )
        if closest is not None and closest.plan is not None and render_plan is not None:
            out.print(f"The closest, {closest.entry.family} {closest.entry.quant}: {escape(closest.reason)}.")
            render_plan(closest.plan)
    else:
        entry = best.entry
        ollama = f"; Ollama tag {entry.ollama}" if entry.ollama else ""
        switch = best.switchable and best.mode is not None
        mode = f", {_mode_words(best.mode)}" if switch else ""
        thinking = f" --thinking {_thinking_choice(best.mode, entry.reasoning_effort)}" if switch else ""
        fetch = wording.commands(best, thinking) if wording.commands else _catalog_commands(best, thinking)
        out.print(
            f"[bold]Recommended:[/bold] {entry.family} {entry.quant} ({format_count(best.params)} parameters, {best.bits_per_weight:.2f} bits/weight"
            f"{ollama}){mode} — {escape(best.reason)}. {fetch}.{_licence_words(best)}"
        )
        if best.answer is not None:
            out.print(_answer_words(best.answer, recommendation.users, load_answer_lengths().answer_source.partition(" (")[0]))
        if best.note:
            out.print(f"[bold yellow]Note[/bold yellow]: {escape(best.note)}.")
        if best.plan is not None and render_plan is not None:
            render_plan(best.plan)
    out.print(_candidates_table(recommendation, show_all, out.width, wording.title))
    for note in recommendation.notes:
        out.print(f"Note: {escape(note)}.")
    shown = recommendation.candidates if show_all else recommendation.candidates[:_ROWS]
    legend = _basis_legend({c.speed_basis for c in shown if c.decode_tokens_per_s is not None}, recommendation)
    if legend:
        each = f"each user's with {recommendation.users} at once; " if recommendation.users and recommendation.users > 1 else ""
        out.print(f"tok/s: {each}{legend}.")
    out.print(
        f"score: the {recommendation.purpose} benchmarks each model's publisher reports, made comparable (docs/how-it-works/quality.md; "
        "* from all its figures, none for this task), less its quantisation's measured loss; - no published figures."
    )
    _print_frontier(out, recommendation)


def _catalog_commands(best: Candidate, thinking: str) -> str:
    """How to fetch and serve a catalog entry (``thinking``: the serve option for its mode)."""
    serve = f"; serve it with `tierlocal serve {best.entry.family}{thinking}`" if thinking else ""
    return f"Pull it with `tierlocal pull {best.entry.family}`{serve}"


def _answer_words(timed: AnswerTime, users: int | None, answer_source: str | None) -> str:
    """The time to a typical answer and its arithmetic, in one line."""
    answer = timed.answer
    trace = answer.reasoning_tokens
    tokens = f"~{trace:,.0f} reasoning + ~{answer.tokens - trace:,.0f} answer tokens" if trace else f"~{answer.tokens:,.0f} answer tokens"
    each = f" (each user's, {users} at once)" if users and users > 1 else ""
    read = f"read in {timed.first_token_s:.1f} s" if timed.first_token_s is not None else "(its reading time unknown, counted as none)"
    traced = {
        "measured": f"the trace measured for this model on {answer.workload}",
        "scaled": f"the trace measured for this model elsewhere, carried to {answer.workload}",
        "assumed": f"the trace not measured for this model: the median thinking model's on {answer.workload}",
    }
    basis = traced[answer.basis] + "; " if answer.mode.startswith("thinking") else ""
    typical = f"the answer: {answer_source}" if answer_source else "the typical answer"
    return escape(
        f"Typical answer: ~{timed.seconds:,.0f} s here — a {timed.prompt_tokens}-token prompt {read}, then {tokens} "
        f"at ~{timed.decode_tokens_per_s:,.1f} tok/s{each} ({basis}{typical}; docs/how-it-works/quality.md)."
    )


#: The mark after a speed in the table, per basis (tierlocal.fit.speed.BASES).
BASIS_MARK = {"measured": "m", "calibrated": "c", "published": "p", "derived": "d", "bound": "≤"}


def _basis_legend(bases: set[str], recommendation: CatalogRecommendation) -> str:
    """What the marks in the tok/s column mean, for the bases shown."""
    # Calibration times this CPU: no help for a machine described with --ram or --gpu NAME.
    calibrate = "" if recommendation.hardware.ram_overridden else " (`tierlocal hw --calibrate` once times this CPU)"
    meaning = {
        "measured": "measured by `tierlocal bench` here",
        "calibrated": "estimated from this CPU's calibration",
        "published": "estimated from published llama.cpp results for this GPU",
        "derived": "estimated from published results of devices like it (GPUs of its generation, on its datasheet; CPUs of its instruction set, "
        "by its cores)" + calibrate,
        "bound": "a ceiling from memory bandwidth alone" + calibrate,
    }
    return " · ".join(f"{BASIS_MARK[basis]} {meaning[basis]}" for basis in meaning if basis in bases)


def _print_machine(out: Console, recommendation: CatalogRecommendation) -> None:
    hardware = recommendation.hardware
    where = "as given" if hardware.overridden else "detected"
    gpus = ", ".join(f"{gpu.name} ({format_bytes(gpu.free_bytes)} free)" for gpu in hardware.gpus) or "no GPU"
    bandwidth = hardware.ram_bandwidth_bytes_per_s
    ram_speed = f"{bandwidth / 1e9:.0f} GB/s" if bandwidth else "bandwidth assumed"
    out.print(
        f"[bold]Machine[/bold] ({where}): {gpus}; system RAM {format_bytes(hardware.ram_available_bytes)} available ({ram_speed}). "
        f"Planned for {recommendation.ctx:,} tokens × {recommendation.parallel} slot(s)"
        + (f", for {recommendation.purpose}" if recommendation.purpose != "chat" else "")
        + "."
    )


def _candidates_table(recommendation: CatalogRecommendation, show_all: bool, width: int = 200, title: str = "") -> Table:
    """The ranked entries; under :data:`COMPACT_WIDTH` columns (an 80-column SSH session) a
    compact layout: no vertical rules, the quantisation and the verdict under the model's name,
    needed and free memory in one column — no name is cut and the verdict wraps as a phrase."""
    rows = recommendation.candidates if show_all else recommendation.candidates[:_ROWS]
    hidden = len(recommendation.candidates) - len(rows)
    caption = f"{hidden} more below these: --all lists every entry" if hidden else None
    title = title or Wording().title
    if width < COMPACT_WIDTH:
        table = Table(
            title=title, title_justify="left", caption=caption, caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
        )
        # Widths set here: rich's own share-out overshoots the console with these cells.
        # 12 columns go to the rules and padding between five columns.
        fixed = {"needs": 9, "busiest/free": 13, "tok/s": 8, "where": 14}
        table.add_column("model / quant · params · verdict", width=max(width - 12 - sum(fixed.values()), 12))
        for column, column_width in fixed.items():
            table.add_column(column, width=column_width, justify="left" if column == "where" else "right", no_wrap=column != "where")
        for candidate in rows:
            family, quant, params, needs, busiest, where, speed, answer, score, verdict = _row(candidate)
            answered = f" · answer {answer}" if answer != "-" else ""
            table.add_row(
                f"[bold]{escape(family)}[/bold]\n{escape(quant)} · {params} · score {score}{answered} · [dim]{verdict}[/dim]",
                needs,
                busiest,
                speed,
                where,
            )
        return table
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    names = max((len(c.entry.family) for c in rows), default=5)
    for column in ("model", "quant", "params", "needs", "busiest: need/free", "where", "~tok/s\nanswer", "score", "verdict"):
        # A name is never cut: the verdict wraps instead.
        table.add_column(
            column,
            justify="right" if column in ("params", "needs", "busiest: need/free", "~tok/s\nanswer", "score") else "left",
            min_width=names if column == "model" else None,
        )
    for candidate in rows:
        family, quant, params, needs, busiest, where, speed, answer, score, verdict = _row(candidate)
        if candidate.switchable and candidate.mode is not None:
            family += "\n[dim]" + _mode_label(candidate.mode) + "[/dim]"
        cells = [family, quant, params, needs, busiest, where, speed + (f"\n{answer}" if answer != "-" else ""), score, verdict]
        table.add_row(*cells)
    return table


def _row(candidate: Candidate) -> list[str]:
    """model, quant, params, needs (the whole run), busiest device (its need / free), where,
    tok/s, the time to a typical answer, quality score (*
    when not from this task's own figures), verdict."""
    entry = candidate.entry
    params = format_count(candidate.params) + (f"-A{format_count(entry.active_params)}" if entry.active_params < entry.params else "")
    speed = "-" if candidate.decode_tokens_per_s is None else f"{candidate.decode_tokens_per_s:,.1f}"
    if candidate.decode_tokens_per_s is not None and candidate.speed_basis in BASIS_MARK:
        speed += f" {BASIS_MARK[candidate.speed_basis]}"
    total = candidate.needed_total_bytes if candidate.needed_total_bytes is not None else candidate.needed_bytes
    needs = format_bytes(total) if total is not None else "-"
    busiest = (
        f"{format_bytes(candidate.needed_bytes).removesuffix(' GiB')}/{format_bytes(candidate.free_bytes)}"
        if candidate.needed_bytes is not None
        else "-"
    )
    verdict = candidate.status if candidate.reason in (candidate.status, "fits") else candidate.reason
    if candidate.status == "best":
        verdict = "best: " + candidate.reason
    quality = candidate.quality
    score = "-" if quality is None else f"{quality.score:.1f}" + ("*" if quality.model.basis == "general" else "")
    return [entry.family, entry.quant, params, needs, busiest, candidate.where, speed, _answer_cell(candidate), score, escape(verdict)]


def _answer_cell(candidate: Candidate) -> str:
    """``193 s`` / ``9.4 s``: the time to a typical answer (the mode is under the model's name)."""
    if candidate.answer is None:
        return "-"
    seconds = candidate.answer.seconds
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _print_frontier(out: Console, recommendation: CatalogRecommendation) -> None:
    for verdict in recommendation.frontier:
        entry = verdict.entry
        out.print(
            f"[bold]{entry.family}[/bold]: not tier 2 — never fits one machine. Memory floor {format_decimal_bytes(verdict.floor_bytes)} "
            f"of weights alone ({format_count(entry.params)} parameters at {entry.quant}); ≥ {verdict.gpus_for_floor} × {verdict.largest_gpu} "
            f"({format_marketed_bytes(verdict.largest_gpu_bytes)} each) just to hold them. Rent a cluster (tier 1) or use the hosted API "
            f"(tier 3): `tierlocal plan {entry.family}` sizes both."
        )
        if verdict.single_machine is not None:
            _print_single_machine(out, verdict.single_machine)


def _gb(n_bytes: int) -> str:
    """Decimal gigabytes (terabytes from 1 TB), whole: the publisher's own unit."""
    return f"{n_bytes / 1e12:.2f} TB" if n_bytes >= 1e12 else f"{n_bytes / 1e9:,.0f} GB"


def _print_single_machine(out: Console, plan: SingleMachinePlan) -> None:
    """The published GGUFs with the experts in RAM: not a GPU, not fast, and this much worse."""
    out.print(
        f"On one machine, not a GPU: {plan.engine}, {plan.placement}. Published GGUFs ({plan.source}); quality against {plan.baseline}.",
        markup=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for column in (
        "quant",
        "file",
        "GPU + RAM",
        "publisher says",
        "mean KLD",
        "top-1 agrees",
        f"decode ≤ at {plan.ram_bandwidth_bytes_per_s / 1e9:,.0f} GB/s",
        "here",
    ):
        table.add_column(column)
    for quant in plan.quants:
        table.add_row(
            quant.name,
            _gb(quant.file_bytes),
            f"{_gb(quant.gpu_bytes)} + {_gb(quant.ram_bytes)}",
            "-" if quant.publisher_memory_bytes is None else _gb(quant.publisher_memory_bytes),
            "-" if quant.mean_kld is None else f"{quant.mean_kld:.3f}",
            "-" if quant.top1_agreement is None else f"{quant.top1_agreement:.1%}",
            "-" if quant.decode_bound_tokens_per_s is None else f"{quant.decode_bound_tokens_per_s:.1f} tok/s",
            "fits" if quant.fits_here else "no",
        )
    out.print(table)
    for speed, setup, source in plan.measured:
        out.print(f"  measured: {speed:g} tok/s — {setup} ({source})", markup=False)
    out.print(
        f"  GPU: the tensors outside the routed experts (assumed {plan.other_bits_per_weight:g} bits/weight) + KV and state for {plan.ctx:,} tokens;"
        " RAM: the routed experts. Decode ≤ RAM bandwidth ÷ the experts each token reads (an upper bound; the measured runs reach a fraction of it).",
        markup=False,
    )


def _licence_words(candidate: Candidate) -> str:
    """A licence that restricts use, said where the pick is (nothing for an open one)."""
    terms = candidate.licence
    if terms is not None and terms.use == "open":
        return ""
    if terms is None:
        return f" [bold yellow]Licence[/bold yellow] {escape(candidate.entry.licence)}: not in tierlocal's licence notes; read it before use."
    use = {"conditions": "commercial use under conditions", "non-commercial": "NON-COMMERCIAL"}[terms.use]
    return (
        f" [bold yellow]Licence[/bold yellow] {escape(terms.id)}, {use}: {escape(terms.summary)} ({terms.source}; --licence commercial|open filters)."
    )


def _licensed(recommendation: CatalogRecommendation) -> str:
    return "" if recommendation.licence == "any" else f" of a licence --licence {recommendation.licence} allows"


def _mode_label(mode: str | None) -> str:
    """A candidate's mode under its name: ``thinking``, ``thinking, low effort``, ``no thinking``."""
    if mode and mode.startswith("thinking-"):
        return f"thinking, {mode.removeprefix('thinking-')} effort"
    return "no thinking" if mode == "standard" else "thinking"


def _mode_words(mode: str | None) -> str:
    """The pick's mode in the verdict: ``thinking first`` (at an effort), ``answering without thinking``."""
    if mode == "standard":
        return "answering without thinking"
    effort = f" at {mode.removeprefix('thinking-')} reasoning effort" if mode and mode.startswith("thinking-") else ""
    return f"thinking first{effort}"


def _thinking_choice(mode: str | None, default_effort: str | None) -> str:
    """The ``serve --thinking`` value that asks for ``mode``: on, off, or the effort."""
    if mode == "standard":
        return "off"
    if mode and mode.startswith("thinking-"):
        return mode.removeprefix("thinking-")
    return default_effort or "on"

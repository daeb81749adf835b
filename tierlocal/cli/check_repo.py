"""``tierlocal check hf://OWNER/REPO[@REVISION]``: every quantisation of a Hub repository planned
for this machine from its own headers (range requests only, cached by the files' hashes) and
ranked as the catalog is, with the evidence it inherits from its base model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..errors import UsageError
from ..fetch.hf import parse_hf_pull
from ..fetch.hub import RepoListing, list_gguf_files
from ..fetch.repo_read import QuantHeaders, RepoQuant, default_header_cache, read_quant_headers, repo_quants
from ..fit.estimate import RunRequest
from ..hardware.types import Hardware
from ..hub_recommendation import RepoRecommendation, repo_recommendation
from ..plan.candidates import Candidate
from ..plan.source import SourceCheck
from ..units import format_bytes
from .common import console, print_json
from .rank_options import RankingChoices, ranking_ask
from .recommend_view import Wording, render_catalog_recommendation
from .source_view import render_source_check

__all__ = ["check_repo"]


@contextmanager
def _progress(enabled: bool, total: int, repo_id: str) -> Iterator[Callable[[RepoQuant], None] | None]:
    if not enabled or total < 2:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console(stderr=True), transient=True) as progress:
        task = progress.add_task(f"reading headers of hf://{repo_id}", total=total)
        yield lambda _quant: progress.advance(task)


def read_repo(source: str, *, interactive: bool) -> tuple[str | None, list[QuantHeaders], list[RepoQuant], RepoListing]:
    """The revision asked for, the model quantisations' headers, every quantisation (projectors
    and incomplete splits too) and the repository's listing.

    Raises:
        UsageError: the repository holds no GGUF model file.
        SourceError: the hub refused or could not answer.
    """
    spec = parse_hf_pull(source)
    listing = list_gguf_files(spec.repo_id, spec.revision)
    quants = repo_quants(listing)
    models = [q for q in quants if not q.projector and q.complete]
    if not models:
        raise UsageError(f"{source}: the repo has no complete .gguf model file", hint="check OWNER/REPO; tierlocal plans GGUF files only")
    with _progress(interactive, len(models), spec.repo_id) as advance:
        reads = read_quant_headers(listing, models, default_header_cache(), revision=spec.revision, progress=advance)
    return spec.revision, reads, quants, listing


def check_repo(
    source: str,
    hardware: Hardware,
    ctx: str | None,
    parallel: str,
    request: RunRequest,
    users: int | None,
    priced: Callable[[SourceCheck], SourceCheck],
    *,
    as_json: bool,
    min_speed: float,
    purpose: str,
    prefer: str,
    licence: str,
    thinking: str,
    show_all: bool,
) -> None:
    """Plan, rank and show every quantisation of the repository ``source`` names."""
    chosen = RankingChoices(min_speed=min_speed, purpose=purpose, prefer=prefer, licence=licence, thinking=thinking)
    ask = ranking_ask(ctx, parallel, request, users, chosen, ranked="a repository's ranking", needs="one file: hf://OWNER/REPO/FILE.gguf")
    revision, reads, quants, listing = read_repo(source, interactive=not as_json and console(stderr=True).is_terminal)
    result = repo_recommendation(listing, reads, quants, hardware, revision=revision, **ask)
    best = result.recommendation.best
    if best is not None and best.plan is not None:
        shown = replace(best, plan=priced(best.plan))
        candidates = tuple(shown if c.key == best.key else c for c in result.recommendation.candidates)
        result = replace(result, recommendation=replace(result.recommendation, candidates=candidates))
    if as_json:
        payload = result.to_json()
        best = result.recommendation.best
        payload["plan"] = best.plan.to_json() if best and best.plan else None
        print_json(payload)
        return
    _render(result, min_speed, show_all)


def _commands(result: RepoRecommendation, best: Candidate, thinking: str) -> str:
    repo = result.listing.repo_id + (f"@{result.revision}" if result.revision else "")
    return (
        f"Pull it with `tierlocal pull hf://{repo} --quant {best.entry.quant}`; "
        f"serve it with `tierlocal serve hf://{repo} --quant {best.entry.quant} --pull{thinking}`"
    )


def _render(result: RepoRecommendation, min_speed: float, show_all: bool) -> None:
    out = console()
    listing = result.listing
    base = result.base
    if base is not None:
        why = (
            "the catalog pulls it from this repo" if base.gguf_repo and base.gguf_repo.lower() == listing.repo_id.lower() else "its card's base_model"
        )
        out.print(f"hf://{escape(listing.repo_id)}: quantisations of {base.family} ({why}); scores, modes and licence inherited from the catalog.")
    else:
        named = ", ".join(listing.base_models) or "none named"
        out.print(f"hf://{escape(listing.repo_id)}: base model {escape(named)}, not in the catalog: no quality figures, ranked by size and speed.")
    wording = Wording(
        ranked=f"quantisation of hf://{listing.repo_id}",
        title=f"hf://{listing.repo_id} on this machine, best first",
        commands=partial(_commands, result),
    )
    render_catalog_recommendation(
        result.recommendation, show_all=show_all, render_plan=partial(render_source_check, min_speed=min_speed), wording=wording
    )
    cached = sum(1 for r in result.reads if r.cached)
    out.print(
        f"Headers: {len(result.reads)} quantisations, {format_bytes(result.bytes_read)} read of {format_bytes(result.file_bytes)} of files"
        + (f" ({cached} from the cache)" if cached else "")
        + "."
    )
    for projector in result.projectors:
        out.print(f"Projector: {escape(', '.join(projector.paths))} ({format_bytes(projector.size)}): plan it beside a model with --mmproj.")
    for quant in result.incomplete:
        out.print(f"[yellow]Incomplete[/yellow] {escape(quant.label)}: only {len(quant.files)} of its shards are in the repo; left out.")
    for read in result.reads:
        if read.error:
            out.print(f"[yellow]Unreadable[/yellow] {escape(read.quant.label)}: {escape(read.error)}")

"""``tierlocal search WORDS``: GGUF repositories on the Hub, each planned for this machine (or the
one --gpu/--ram describe) at its best-fitting quantisation, from the files' own headers."""

from __future__ import annotations

import time

import click
from rich.markup import escape
from rich.table import Table

from .. import constants
from ..errors import UsageError
from ..fetch.hub_search import SORTS
from ..hub_recommendation import SearchRecommendation, SearchResult, search_hub
from ..units import format_bytes
from .common import console, gpu_option, json_option, machine, print_json, ram_options

__all__ = ["search"]


@click.command()
@click.argument("words", nargs=-1, required=True)
@click.option(
    "--sort", type=click.Choice(list(SORTS)), default="downloads", show_default=True, help="The hub's order of the results (each descending)."
)
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True, help="Most repositories to plan.")
@click.option("--ctx", type=click.IntRange(256), default=constants.DEFAULT_CTX, show_default=True, help="Context tokens per slot to plan for.")
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=constants.DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode, tokens/s.",
)
@gpu_option
@ram_options
@json_option
def search(
    words: tuple[str, ...],
    sort: str,
    limit: int,
    ctx: int,
    min_speed: float,
    gpus: tuple[str, ...],
    ram: str | None,
    ram_bandwidth: str | None,
    as_json: bool,
) -> None:
    """Find GGUF repositories on the Hugging Face Hub and plan each for this machine.

    Each repository found (its name holds WORDS) is listed with its base model, the quantisation that
    fits this machine best, where it runs, its speed and — when its card names a base model the
    catalog scores — the inherited score. Only headers are read (range requests, cached by the files'
    hashes); `tierlocal check hf://OWNER/REPO` plans every quantisation of one.

    \b
    Examples:
      tierlocal search qwen3
      tierlocal search llama 70b --gpu "2xRTX 3090" --ram 64GiB
      tierlocal search gemma --sort recent --limit 10 --json
    """
    query = " ".join(words).strip()
    if not query:
        raise UsageError("search needs words to look for", hint="e.g. tierlocal search qwen3")
    hardware = machine(gpus, ram, ram_bandwidth)
    started = time.monotonic()
    result = search_hub(query, hardware, sort=sort, limit=limit, ctx=ctx, parallel=1, min_tokens_per_s=min_speed, ctx_up_to_training=True)
    if as_json:
        print_json({"query": query, "sort": sort, **result.to_json(), "seconds": round(time.monotonic() - started, 2)})
        return
    _render(query, sort, result, time.monotonic() - started)


def _render(query: str, sort: str, result: SearchRecommendation, seconds: float) -> None:
    out = console()
    if not result.results and not result.skipped:
        out.print(f"No GGUF repository on the hub matches {escape(query)!r}.")
        return
    table = Table(title=f"GGUF repositories matching {escape(query)!r}, by {sort}, planned for this machine", title_justify="left")
    for column in ("repo", "base model", "quant", "needs", "where", "~tok/s", "score", "verdict", "downloads"):
        table.add_column(column, justify="right" if column in ("needs", "~tok/s", "score", "downloads") else "left")
    for row in result.results:
        table.add_row(*_cells(row, result))
    out.print(table)
    best = result.best
    if best is not None and best.candidate is not None:
        repo, quant = best.found.listing.repo_id, best.candidate.entry.quant
        out.print(f"Best here: hf://{escape(repo)} {escape(quant)} — `tierlocal check hf://{escape(repo)}` compares every quantisation of it.")
    for skip in result.skipped:
        out.print(f"[yellow]Skipped[/yellow] {escape(skip.repo_id)}: {escape(skip.why)}")
    read = sum(r.bytes_read for found in result.results for r in found.found.reads)
    out.print(
        f"score † inherited from the catalog model the card names as base_model; - no figures. Headers: {format_bytes(read)} read "
        f"in {seconds:.1f} s; the largest quantisations no bigger than the memory were planned."
    )


def _cells(row: SearchResult, result: SearchRecommendation) -> list[str]:
    cells, candidate = row.cells(), row.candidate
    if candidate is None:
        verdict = "unreadable"
    else:
        verdict = "best here" if result.best is row else candidate.status if candidate.reason in (candidate.status, "fits") else candidate.reason
    keys = ("repo", "base", "quant", "needs", "where", "tok/s", "score")
    return [*(escape(cells[key]) for key in keys), escape(verdict), cells["downloads"]]

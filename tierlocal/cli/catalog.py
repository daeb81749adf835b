"""``tierlocal catalog …``: the model catalog. ``list`` and ``show NAME`` print its entries and
their facts (sizes and KV from each quantisation's header); ``capture SOURCE`` writes a
published GGUF's header in the compact form a catalog entry keeps (header only: nothing is
downloaded beyond it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click
from rich import box
from rich.markup import escape
from rich.table import Table

from .. import constants
from ..catalog import ModelEntry, find_model, load_entry_headers, load_models, load_quality, recipes_dir
from ..errors import SourceError, UsageError
from ..fetch.hf import parse_hf_pull
from ..fetch.hub import is_repo_source, list_gguf_files
from ..fetch.repo_read import default_header_cache, read_quant_headers, repo_quants
from ..fetch.sources import read_headers
from ..fit.memory import kv_cache, server_context
from ..fit.model import model_spec
from ..gguf.compact import to_compact
from ..gguf.parse import GGUFHeader
from ..gguf.summary import summarize
from ..plan.quality import MIN_REPORTERS, ModelQuality, mode_scores
from ..recommendation import catalog_quality
from ..units import format_bytes, format_count
from .common import COMPACT_WIDTH, console, json_option, print_json

__all__ = ["catalog"]


@click.group()
def catalog() -> None:
    """The model catalog's files (recipes/)."""


def _families() -> dict[str, list[ModelEntry]]:
    families: dict[str, list[ModelEntry]] = {}
    for entry in load_models():
        families.setdefault(entry.family, []).append(entry)
    return families


def _quant_facts(entry: ModelEntry) -> dict[str, object]:
    """One quantisation: its file's size, parameters and bits per weight from its header, and
    the KV cache (f16, one slot) at the default context and at the trained one."""
    headers = load_entry_headers(entry)
    base = {"quant": entry.quant, "ollama_tag": entry.ollama, "header": entry.header_file, "method": "estimator" if headers else "rule-of-thumb"}
    if headers is None:
        return {**base, "file_bytes": entry.file_bytes, "params": entry.params, "bits_per_weight": entry.bits_per_weight, "kv_bytes": {}}
    spec, summary = model_spec(headers), summarize(headers)
    contexts = sorted({min(constants.DEFAULT_CTX, spec.n_ctx_train), spec.n_ctx_train})
    kv = {str(ctx): kv_cache(spec, server_context(spec, ctx=ctx, parallel=1)).total_bytes for ctx in contexts}
    return {
        **base,
        "file_bytes": summary.file_bytes,
        "params": summary.params,
        "bits_per_weight": round(summary.file_bytes * 8 / max(summary.params, 1), 3),
        "kv_bytes": kv,
    }


def _family_json(entries: list[ModelEntry], *, facts: bool) -> dict[str, object]:
    first = entries[0]
    quality = _quality_json(first.family)
    payload: dict[str, object] = {
        "name": first.family,
        "series": first.series,
        "architecture": first.architecture or ("frontier" if first.frontier else ""),
        "params": first.params,
        "active_params": first.active_params,
        "context_length": first.context_length,
        "quants": [entry.quant for entry in entries],
        "licence": first.licence,
        "facts_date": first.facts_date,
        "source": first.source,
        "gguf_repo": first.gguf_repo,
        "role": first.role,
        "quality": quality,
        "quality_missing": None if quality is not None else _why_unscored(first.family),
        "frontier": first.frontier,
        "note": first.note,
    }
    if facts and not first.frontier:
        payload["quantisations"] = [_quant_facts(entry) for entry in entries]
    return payload


def _quality_json(family: str) -> dict[str, object] | None:
    """The model's score per task (in the mode most of its figures are in), its other mode's
    where it has both, and the published figures they come from (None: none)."""
    every = catalog_quality()
    scores = every.get(family)
    if not scores:
        return None
    by_mode = mode_scores(every, family)
    main = next(iter(scores.values())).mode
    figures = {json.dumps(f.to_json(), sort_keys=True): f for tasks in by_mode.values() for q in tasks.values() for f in q.figures}
    return {
        "mode": main,
        "scores": {task: _score_json(q) for task, q in scores.items()},
        "other_modes": {mode: {task: _score_json(q) for task, q in tasks.items()} for mode, tasks in by_mode.items() if mode != main},
        "figures": [f.to_json() for f in figures.values()],
    }


def _score_json(quality: ModelQuality) -> dict[str, object]:
    return {
        "score": round(quality.score, 1),
        "basis": quality.basis,
        "benchmarks_reported": quality.reported,
        "independent_figures": quality.independent_figures,
        "independent_sources": quality.independent_sources,
        "thin": quality.thin,
        "evidence": quality.evidence,
    }


def _quality_cell(quality: dict[str, object] | None) -> str:
    """``chat 88.3 (4)``: the chat score (an embedding model's: embeddings) and how many of its
    benchmarks the publisher reported."""
    if quality is None:
        return "-"
    scores: dict[str, dict[str, object]] = quality["scores"]  # type: ignore[assignment]
    task = "chat" if "chat" in scores else next(iter(scores))
    return f"{task} {scores[task]['score']:.1f} ({scores[task]['benchmarks_reported']})"


def _quality_lines(quality: dict[str, object]) -> str:
    """Each task's score, then every figure it comes from with its source."""
    scores = quality["scores"]
    lines = f"{quality['mode']}: " + "; ".join(f"{task} {s['score']:.1f} from {s['evidence']}" for task, s in scores.items())  # type: ignore[attr-defined]
    for mode, other in quality["other_modes"].items():  # type: ignore[attr-defined]
        lines += f" — {mode}: " + "; ".join(f"{task} {s['score']:.1f} from {s['evidence']}" for task, s in other.items())
    figures = quality["figures"]
    cited = "".join(
        f"\n    {escape(str(f['benchmark']))} ({f['mode']}{', ' + str(f['effort']) + ' effort' if f.get('effort') else ''}) {f['score']:g}: "
        f"{escape(str(f['setting']))} — {escape(str(f['source']))}, {f['date']}"
        for f in figures  # type: ignore[attr-defined]
    )
    return escape(lines) + cited


@catalog.command("list")
@json_option
def list_(as_json: bool) -> None:
    """Every model in the catalog: family, parameters, architecture, quantisations, when its
    facts were published and where from."""
    families = [_family_json(entries, facts=False) for entries in _families().values()]
    if as_json:
        print_json({"models": families})
        return
    n_entries = sum(len(f["quants"]) for f in families)  # type: ignore[arg-type, misc]
    title = f"{len(families)} models, {n_entries} entries (recipes/models.toml)"
    out = console()
    if out.width < COMPACT_WIDTH:
        out.print(_compact_list(families, title, out.width))
        out.print("`tierlocal catalog show NAME` prints one model's facts; `tierlocal check NAME` plans it on this machine.")
        return
    table = Table(title=title, title_justify="left")
    for column in ("name", "family", "params", "architecture", "context", "quants", "facts", "quality"):
        table.add_column(column, justify="right" if column in ("params", "context") else "left")
    for family in families:
        params, active = int(family["params"]), int(family["active_params"])  # type: ignore[call-overload]
        quality = family["quality"]
        table.add_row(
            str(family["name"]),
            str(family["series"]),
            format_count(params) + (f"-A{format_count(active)}" if active < params else ""),
            str(family["architecture"]),
            f"{family['context_length']:,}",
            " ".join(family["quants"]),  # type: ignore[arg-type]
            str(family["facts_date"]),
            _quality_cell(quality),  # type: ignore[arg-type]
        )
    console().print(table)
    console().print("`tierlocal catalog show NAME` prints one model's facts; `tierlocal check NAME` plans it on this machine.")


def _compact_list(families: list[dict[str, object]], title: str, width: int) -> Table:
    """The list for a narrow terminal: the name whole, its architecture, facts date and quality
    under it; widths set here (rich's own share-out overshoots the console with these cells)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    fixed = {"params": 13, "context": 9, "quants": 19}
    table.add_column("name / architecture · facts", width=max(width - 9 - sum(fixed.values()), 12))
    for column, column_width in fixed.items():
        table.add_column(column, width=column_width, justify="left" if column == "quants" else "right", no_wrap=column != "quants")
    for family in families:
        params, active = int(family["params"]), int(family["active_params"])  # type: ignore[call-overload]
        quality = family["quality"]
        scored = "" if quality is None else f" · {_quality_cell(quality)}"  # type: ignore[arg-type]
        table.add_row(
            f"[bold]{escape(str(family['name']))}[/bold]\n[dim]{escape(str(family['architecture']))} · {family['facts_date']}{escape(scored)}[/dim]",
            format_count(params) + (f"-A{format_count(active)}" if active < params else ""),
            f"{family['context_length']:,}",
            " ".join(family["quants"]),  # type: ignore[arg-type]
        )
    return table


def _why_unscored(model: str) -> str:
    """Why a model has no score: no figures, or figures only on benchmarks too few models report."""
    facts = load_quality()
    own = sorted({figure.benchmark for figure in facts.figures if figure.model == model})
    if not own:
        reason = facts.no_figures.get(model, "")
        return "no published figures in recipes/quality.toml" + (f" ({reason})" if reason else "")
    return f"not scored: its figures ({', '.join(own)}) are on benchmarks fewer than {MIN_REPORTERS} catalog models report"


@catalog.command("show")
@click.argument("name")
@json_option
def show(name: str, as_json: bool) -> None:
    """One model's facts: its published source and date, and per quantisation the file's size,
    bits per weight and KV cache (from the compact header llama-quantize's layout gave)."""
    entries = _families().get(name.lower()) or _families().get(name.lower().split(":")[0]) or find_model(name)
    if not entries:
        raise UsageError(f"{name!r} is not in the catalog", hint="`tierlocal catalog list` names every model")
    payload = _family_json(entries, facts=True)
    if as_json:
        print_json(payload)
        return
    out = console()
    out.print(f"[bold]{escape(str(payload['name']))}[/bold] ({escape(str(payload['series']))}, {escape(str(payload['architecture']))})")
    for key in ("params", "active_params", "context_length", "licence", "facts_date", "source", "gguf_repo", "note"):
        value = payload[key]
        if value not in (None, ""):
            out.print(f"  {key}: {escape(f'{value:,}' if isinstance(value, int) else str(value))}")
    quality = payload["quality"]
    out.print("  quality: " + (_why_unscored(str(payload["name"])) if quality is None else _quality_lines(quality)))  # type: ignore[arg-type]
    if payload["frontier"]:
        out.print(f"  never fits one machine: `tierlocal plan {payload['name']}`")
        return
    table = Table()
    for column in ("quant", "file", "params", "bits/weight", "KV (f16, 1 slot)", "Ollama tag", "planned by"):
        table.add_column(column)
    for quant in payload["quantisations"]:  # type: ignore[attr-defined]
        kv = ", ".join(f"{format_bytes(size)} at {int(ctx):,}" for ctx, size in quant["kv_bytes"].items()) or "-"
        table.add_row(
            quant["quant"],
            format_bytes(quant["file_bytes"]),
            format_count(quant["params"]),
            f"{quant['bits_per_weight']:.2f}",
            kv,
            quant["ollama_tag"] or "-",
            quant["method"],
        )
    out.print(table)


@catalog.command("capture")
@click.argument("source")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write the compact header here (default: stdout).")
@click.option("--name", help="hf://OWNER/REPO: the catalog name the files are written under (NAME.QUANT.json).")
@click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), help="hf://OWNER/REPO: where to write them (default: recipes/headers)."
)
@click.option("--quant", "quants", multiple=True, help="hf://OWNER/REPO: only these quantisations (default: every one).")
def capture(source: str, out: Path | None, name: str | None, directory: Path | None, quants: tuple[str, ...]) -> None:
    """Read SOURCE's header (a GGUF path, URL or hf://OWNER/REPO/FILE.gguf; a split model by its
    first shard) and write its compact form: metadata without vocabulary-sized arrays, and every
    tensor's name, shape, type and offset — what `check` needs to plan the file without it. With
    hf://OWNER/REPO, every quantisation in the repository (its headers read as `check hf://OWNER/REPO`
    reads them), each to NAME.QUANT.json: a catalog entry's headers from the published files.

    \b
    Examples:
      tierlocal catalog capture hf://ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf --out recipes/headers/gemma-3-4b-it-Q4_K_M.json
      tierlocal catalog capture hf://unsloth/Qwen3-8B-GGUF --name qwen3-8b --quant Q4_K_M --quant Q8_0
    """
    if is_repo_source(source):
        if name is None:
            raise UsageError("capturing a repository needs the catalog name its files are written under", hint="add --name NAME")
        for label, headers in _repo_headers(source, quants):
            _write_compact(list(headers), (directory or recipes_dir() / "headers") / f"{name}.{label}.json")
        return
    if out is None:
        click.echo(_compact_text(read_headers(source)), nl=False)
        return
    _write_compact(read_headers(source), out)


def _repo_headers(source: str, quants: tuple[str, ...]) -> list[tuple[str, tuple[GGUFHeader, ...]]]:
    """Each (or each asked-for) quantisation's label and headers in the repository ``source``.

    Raises:
        UsageError: a quantisation asked for is not in the repository.
        SourceError: a header cannot be read.
    """
    spec = parse_hf_pull(source)
    listing = list_gguf_files(spec.repo_id, spec.revision)
    found = [q for q in repo_quants(listing) if not q.projector and q.complete]
    wanted = [q for q in found if not quants or q.label.upper() in {w.upper() for w in quants}]
    missing = sorted({w.upper() for w in quants} - {q.label.upper() for q in wanted})
    if missing or not wanted:
        raise UsageError(f"{source}: no quantisation {', '.join(missing) or 'to capture'}", hint=f"it has: {', '.join(q.label for q in found)}")
    reads = read_quant_headers(listing, wanted, default_header_cache(), revision=spec.revision)
    for read in reads:
        if read.error:
            raise SourceError(source, f"{read.quant.label}: {read.error}")
    return [(read.quant.label, read.headers) for read in reads]


def _compact_text(headers: Sequence[GGUFHeader]) -> str:
    return json.dumps(to_compact(headers), indent=1, sort_keys=True) + "\n"


def _write_compact(headers: Sequence[GGUFHeader], out: Path) -> None:
    """Write the compact form of ``headers`` to ``out``, whole or not at all."""
    text = _compact_text(headers)
    if out.exists() and out.is_dir():
        raise UsageError(f"{out} is a directory", hint="give a file name for the compact header")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text)
    partial.replace(out)  # whole or not at all
    click.echo(f"wrote {out} ({format_bytes(len(text.encode()))})", err=True)

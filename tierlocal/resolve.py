"""The one place a SOURCE or a catalog name becomes something to fetch or a file to serve: an
``ollama://`` tag's blob in Ollama's store, a path, an ``hf://`` file in the hub cache (pulled
when asked), or a catalog entry's GGUF repo at the quantisation the recommendation picks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import constants
from .catalog import ModelEntry, find_frontier, find_model, load_models
from .errors import UsageError
from .fetch.hf import cached_gguf, parse_hf_pull, plan_hf_pull, run_pull
from .fetch.ollama_store import ollama_store_blob
from .hardware.detect import detect
from .hardware.types import Hardware
from .hub_recommendation import repo_choice
from .recommendation import catalog_recommendation
from .units import format_bytes

__all__ = ["catalog_choice", "resolve_model"]


def resolve_model(
    source: str,
    *,
    pull: bool,
    say: Callable[[str], None],
    hardware: Callable[[], Hardware] = detect,
    ctx: int | None = None,
    pull_option: bool = True,
    quant: str | None = None,
) -> Path:
    """A local GGUF path for SOURCE: the path itself, an ollama:// tag's blob in Ollama's store,
    or an hf:// / catalog model from the hub cache (downloaded first when ``pull``). A catalog
    name is taken at the quantisation the recommendation picks for the machine ``hardware()``
    gives (detected when asked: only a catalog name needs it) at ``ctx`` tokens per slot (None: the default, up to each model's trained context).
    ``pull_option``: the command has ``--pull`` (the hint names it). An ``hf://OWNER/REPO``
    source is taken at ``quant``, else at the quantisation its ranking here puts first.

    Raises:
        UsageError: an unknown name, a malformed source, or a model not downloaded yet.
    """
    if source.startswith("ollama://"):
        return ollama_store_blob(source.removeprefix("ollama://"))
    if not source.startswith("hf://"):
        path = Path(source)
        if path.exists() or "/" in source or source.endswith(".gguf"):
            return path
        entries = [entry for entry in find_model(source) if entry.gguf_repo]
        if not entries:
            raise UsageError(
                f"{source!r} is neither a GGUF file nor a catalog model",
                hint="give a path, hf://OWNER/REPO/FILE.gguf, or a name from `tierlocal catalog list`",
            )
        repo, quant, reason = catalog_choice(source, hardware(), ctx, named=entries)
        say(f"{source}: {reason}")
        spec = parse_hf_pull(repo)
    else:
        spec = parse_hf_pull(source)
        if spec.filename is None and quant is None:
            quant, reason = repo_choice(spec.repo_id, spec.revision, hardware(), ctx)
            say(f"{source}: {quant}, {reason}")
    wanted_quant = None if spec.filename else quant
    cached = cached_gguf(spec, quant=wanted_quant)  # the hub is asked only when something is missing
    if cached is not None:
        return cached
    if not pull:
        raise UsageError(
            f"{source}: not downloaded yet",
            hint=("add --pull, or run " if pull_option else "run ") + f"`tierlocal pull {source}{_quant_option(wanted_quant, source)}` first",
        )
    plan = plan_hf_pull(spec, quant=wanted_quant, dest_dir=None)
    if not all(planned.present for planned in plan.files):
        say(f"pulling {plan.source}: {', '.join(f.repo_file.path for f in plan.files)}")
        run_pull(plan)
    return plan.files[0].final_path


def _quant_option(quant: str | None, source: str) -> str:
    """`pull`'s --quant for an hf://OWNER/REPO source (a catalog name's pull picks it again)."""
    return f" --quant {quant}" if quant and source.startswith("hf://") else ""


def catalog_choice(source: str | None, hardware: Hardware, ctx: int | None, *, named: list[ModelEntry] | None = None) -> tuple[str, str, str]:
    """(``hf://`` repo, quantisation, why) for a catalog name, or for what the recommendation
    picks for ``hardware`` at ``ctx`` tokens of context (None: the default, up to each model's
    trained context) when ``source`` is None — the answer
    `tierlocal check` gives (:func:`tierlocal.recommendation.catalog_recommendation`).

    Raises:
        UsageError: the name has no GGUF repo, or nothing in the catalog fits.
    """
    if source is not None:
        entries = named if named is not None else [entry for entry in find_model(source) if entry.gguf_repo]
        if not entries and find_frontier(source) is not None:
            raise UsageError(
                f"{source!r} never fits one machine: the catalog has no GGUF of it to pull",
                hint=f"see `tierlocal plan {source}` for the cluster that serves it (tier 1) and the hosted API (tier 3)",
            )
        if not entries:
            raise UsageError(
                f"{source!r} is not a pull source",
                hint="give hf://OWNER/REPO --quant Q4_K_M, hf://OWNER/REPO/FILE.gguf, ollama://TAG or a catalog model",
            )
    else:
        entries = [entry for entry in load_models() if entry.gguf_repo and entry.role == "chat"]
    tokens = ctx or constants.DEFAULT_CTX
    recommendation = catalog_recommendation(
        entries, hardware, ctx=tokens, parallel=1, min_tokens_per_s=constants.DEFAULT_MIN_TOKENS_PER_S, ctx_up_to_training=ctx is None
    )
    best = recommendation.best
    if best is None:
        if source is not None:
            entry: ModelEntry = min(entries, key=lambda e: e.file_bytes)
            return (
                f"hf://{entry.gguf_repo}",
                entry.quant,
                f"{entry.family} {entry.quant}, the smallest, as asked (it does not fit this machine: see `tierlocal check {entry.family}`)",
            )
        raise UsageError(
            "nothing in the catalog fits this machine", hint="see `tierlocal check`; or pull a file by name with hf://OWNER/REPO/FILE.gguf"
        )
    entry = best.entry
    speed = f", ~{best.decode_tokens_per_s:.0f} tok/s" if best.decode_tokens_per_s else ""
    needs = f"needs {format_bytes(best.needed_bytes)} of {format_bytes(best.free_bytes)}" if best.needed_bytes is not None else "fits"
    reason = (
        f"{entry.family} {entry.quant}: recommended for this machine at {tokens:,} tokens of context — {needs}{speed}, {best.reason} "
        "(`tierlocal check` shows the arithmetic)"
    )
    return f"hf://{entry.gguf_repo}", entry.quant, reason

"""The one place a SOURCE or a catalog name becomes something to fetch or a file to serve: an
``ollama://`` tag's blob in Ollama's store, a path, an ``hf://`` file in the hub cache (pulled
when asked), or a catalog entry's GGUF repo at the quantisation the recommendation picks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import constants
from ..catalog import ModelEntry, find_model, load_gpus, load_host_defaults, load_models
from ..errors import UsageError
from ..fit.rule_of_thumb import recommend
from ..hardware.types import Hardware
from ..units import format_bytes
from .hf import parse_hf_pull, plan_hf_pull, run_pull
from .ollama_store import ollama_store_blob

__all__ = ["catalog_choice", "resolve_model"]


def resolve_model(source: str, *, pull: bool, say: Callable[[str], None]) -> Path:
    """A local GGUF path for SOURCE: the path itself, an ollama:// tag's blob in Ollama's store,
    or an hf:// / catalog model from the hub cache (downloaded first when ``pull``).

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
                f"{source!r} is neither a GGUF file nor a catalog model", hint="give a path, hf://OWNER/REPO/FILE.gguf, or a name from recipes/models.toml"
            )
        entry = entries[0]
        spec, quant = parse_hf_pull(f"hf://{entry.gguf_repo}"), entry.quant
    else:
        spec, quant = parse_hf_pull(source), None
    plan = plan_hf_pull(spec, quant=None if spec.filename else quant, dest_dir=None)
    if not all(planned.present for planned in plan.files):
        if not pull:
            raise UsageError(f"{source}: not downloaded yet", hint=f"add --pull, or run `tierlocal pull {source}` first")
        say(f"pulling {plan.source}: {', '.join(f.repo_file.path for f in plan.files)}")
        run_pull(plan)
    return plan.files[0].final_path


def catalog_choice(source: str | None, hardware: Hardware, ctx: int) -> tuple[str, str, str]:
    """(``hf://`` repo, quantisation, why) for a catalog name, or for what the recommendation
    picks for ``hardware`` at ``ctx`` tokens of context when ``source`` is None.

    Raises:
        UsageError: the name has no GGUF repo, or nothing in the catalog fits.
    """
    if source is not None:
        entries = [entry for entry in find_model(source) if entry.gguf_repo]
        if not entries:
            raise UsageError(
                f"{source!r} is not a pull source", hint="give hf://OWNER/REPO --quant Q4_K_M, hf://OWNER/REPO/FILE.gguf, ollama://TAG or a catalog model"
            )
    else:
        entries = [entry for entry in load_models() if entry.gguf_repo]
    recommendation = recommend(entries, hardware, load_host_defaults(), load_gpus(), ctx=ctx, parallel=1, min_tokens_per_s=constants.DEFAULT_MIN_TOKENS_PER_S)
    best = recommendation.best
    if best is None:
        if source is not None and len(entries) == 1:
            entry: ModelEntry = entries[0]
            return (
                f"hf://{entry.gguf_repo}",
                entry.quant,
                f"{entry.family} {entry.quant} as asked (it does not fit this machine: see `tierlocal check {entry.family}`)",
            )
        raise UsageError("nothing in the catalog fits this machine", hint="see `tierlocal check`; or pull a file by name with hf://OWNER/REPO/FILE.gguf")
    entry = best.entry
    speed = f", ~{best.est_decode_tokens_per_s:.0f} tok/s" if best.est_decode_tokens_per_s else ""
    budget = recommendation.budget
    reason = (
        f"{entry.family} {entry.quant}: recommended for {budget.device} ({format_bytes(budget.memory_bytes)}) at {ctx:,} tokens of context — "
        f"needs {format_bytes(best.total_needed_bytes or best.weights_bytes)}{speed} (`tierlocal check` shows the arithmetic)"
    )
    return f"hf://{entry.gguf_repo}", entry.quant, reason

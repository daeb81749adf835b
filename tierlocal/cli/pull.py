"""``tierlocal pull``: a Hugging Face GGUF (resumable, verified, with a progress bar) or an Ollama tag."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from .. import constants
from ..errors import Interrupted, UsageError
from ..fetch.download import DownloadedFile, partial_paths
from ..fetch.hf import PlannedFile, PullPlan, check_disk, parse_hf_pull, plan_hf_pull, run_pull
from ..resolve import catalog_choice
from ..units import format_bytes, parse_memory_size
from .common import console, gpu_option, machine, print_json

__all__ = ["pull"]


@contextmanager
def _byte_progress(enabled: bool, total: int, description: str) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr (bytes, rate, ETA) when ``enabled``; else nothing."""
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console(stderr=True), transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


@click.command()
@click.argument("source", required=False)
@click.option("--quant", help="Quantisation to pick from an hf://OWNER/REPO listing (Q4_K_M, Q8_0 …), matched case-insensitively.")
@click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), help="Put the GGUF file(s) here instead of huggingface_hub's cache."
)
@click.option(
    "--keep-free",
    default=format_bytes(constants.DEFAULT_KEEP_FREE_BYTES).replace(" ", ""),
    show_default=True,
    help="Refuse unless this much disk stays free after the download.",
)
@click.option("--insecure", is_flag=True, help="ollama:// only: allow a registry over plain HTTP.")
@gpu_option
@click.option(
    "--ctx",
    type=click.IntRange(1),
    show_default=f"{constants.DEFAULT_CTX}, or the model's trained context if shorter",
    help="Context tokens per slot the recommendation plans for (no SOURCE).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: {files: [{path, bytes, sha256}], source}.")
def pull(
    source: str | None,
    quant: str | None,
    directory: Path | None,
    keep_free: str,
    insecure: bool,
    gpus: tuple[str, ...],
    ctx: int | None,
    as_json: bool,
) -> None:
    """Download a model: a GGUF from Hugging Face, or an Ollama tag.

    \b
    SOURCE is one of:
      hf://OWNER/REPO --quant Q4_K_M   the matching file (every shard of a split one)
      hf://OWNER/REPO/FILE.gguf[@REV]  that file
      ollama://TAG                     through the Ollama server at OLLAMA_HOST
      a catalog name (qwen3-8b)        its GGUF repo, at the quantisation that fits
      nothing                          what `tierlocal check` recommends for this machine

    Hugging Face downloads honour HF_ENDPOINT and HF_TOKEN, land in huggingface_hub's cache
    (or --dir), resume after an interruption (run the same command again), and reach their
    final path only after the size, the hub's sha256 and the GGUF header check out.
    """
    interactive = sys.stderr.isatty() and not as_json
    if source is not None and source.startswith("ollama://"):
        _pull_ollama(source.removeprefix("ollama://"), insecure, interactive, as_json)
        return
    reason = None
    if source is None or not source.startswith("hf://"):
        source, chosen_quant, reason = catalog_choice(source, machine(gpus), ctx)
        quant = quant or chosen_quant
    spec = parse_hf_pull(source)
    plan = plan_hf_pull(spec, quant=None if spec.filename else quant, dest_dir=directory)
    check_disk(plan, parse_memory_size(keep_free, "--keep-free"))
    if not as_json:
        if reason:
            click.echo(f"pulling {reason}", err=True)
        names = ", ".join(f.repo_file.path for f in plan.files)
        where = directory if directory is not None else plan.cache_dir
        resumed = sum(f.partial_bytes for f in plan.files)
        resume_note = f", resuming with {format_bytes(resumed)} already here" if resumed else ""
        click.echo(f"{plan.source}: {names} ({format_bytes(plan.total_bytes)}) into {where}{resume_note}", err=True)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    results = _run_with_progress(plan, interactive)
    payload = {
        "source": plan.source,
        "repo": plan.repo_id,
        "commit": plan.commit,
        "reason": reason,
        "files": [result.to_json() for result in results],
    }
    if as_json:
        print_json(payload)
        return
    for result in results:
        state = "already here" if result.fetched_bytes == 0 else f"fetched {format_bytes(result.fetched_bytes)}"
        click.echo(f"{result.path}  {format_bytes(result.size)}  sha256 {result.sha256[:16]}…  ({state}, verified)")


def _run_with_progress(plan: PullPlan, interactive: bool) -> list[DownloadedFile]:
    current: list[PlannedFile] = []
    with _byte_progress(interactive and plan.remaining_bytes > 0, plan.remaining_bytes, "downloading") as advance:
        try:
            return run_pull(plan, progress=advance, on_file=current.append)
        except KeyboardInterrupt:
            kept = ""
            if current:
                data, _ = partial_paths(current[-1].blob_path)
                if data.exists():
                    kept = f"; {format_bytes(data.stat().st_size)} kept in {data}"
            raise Interrupted(f"interrupted{kept}", hint="run the same command again to resume") from None


def _pull_ollama(tag: str, insecure: bool, interactive: bool, as_json: bool) -> None:
    from ..fetch.ollama import OllamaProgress, pull_ollama  # the ollama client is a slow import

    if not tag:
        raise UsageError("ollama:// needs a tag", hint="e.g. tierlocal pull ollama://qwen3:8b")
    if interactive:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console(stderr=True)) as progress:
            task = progress.add_task(f"ollama pull {tag}", total=None)

            def show(update: OllamaProgress) -> None:
                progress.update(task, description=f"{tag}: {update.status}", completed=update.completed_bytes, total=update.total_bytes or None)

            result = pull_ollama(tag, insecure=insecure, progress=show)
    else:
        result = pull_ollama(tag, insecure=insecure)
    if as_json:
        print_json(result.to_json())
        return
    click.echo(f"ollama://{tag}: pulled into the Ollama server at {result.host} ({format_bytes(result.size)}, digest {result.digest[:12]})")

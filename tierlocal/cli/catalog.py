"""``tierlocal catalog …``: the model catalog's files. ``capture SOURCE`` writes a published
GGUF's header in the compact form a catalog entry keeps (header only: nothing is downloaded
beyond it)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import UsageError
from ..gguf.compact import to_compact
from ..gguf.sources import read_headers
from ..units import format_bytes

__all__ = ["catalog"]


@click.group()
def catalog() -> None:
    """The model catalog's files (recipes/)."""


@catalog.command("capture")
@click.argument("source")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write the compact header here (default: stdout).")
def capture(source: str, out: Path | None) -> None:
    """Read SOURCE's header (a GGUF path, URL or hf://OWNER/REPO/FILE.gguf; a split model by its
    first shard) and write its compact form: metadata without vocabulary-sized arrays, and every
    tensor's name, shape, type and offset — what `check` needs to plan the file without it.

    \b
    Example:
      tierlocal catalog capture hf://ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf --out recipes/headers/gemma-3-4b-it-Q4_K_M.json
    """
    text = json.dumps(to_compact(read_headers(source)), indent=1, sort_keys=True) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    if out.exists() and out.is_dir():
        raise UsageError(f"{out} is a directory", hint="give a file name for the compact header")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text)
    partial.replace(out)  # whole or not at all
    click.echo(f"wrote {out} ({format_bytes(len(text.encode()))})", err=True)

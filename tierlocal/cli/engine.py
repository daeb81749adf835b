"""The ``tierlocal engine`` commands: build llama-server, list what is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import constants
from ..engines.build import BACKENDS, build_engine, choose_backend, installed_engines
from ..engines.llama_server import find_llama_server
from .common import console, print_json

__all__ = ["engine"]


@click.group()
def engine() -> None:
    """llama-server builds in tierlocal's engine directory."""


@engine.command("build")
@click.option(
    "--backend",
    type=click.Choice(["auto", *BACKENDS]),
    default="auto",
    show_default=True,
    help="auto: CUDA with nvcc, ROCm with hipcc, Metal on macOS, Vulkan with glslc, else CPU.",
)
@click.option(
    "--source", type=click.Path(file_okay=False, path_type=Path), help="A llama.cpp checkout to build instead of the pinned llama-cpp-python sdist's."
)
@click.option("--jobs", type=click.IntRange(1, 512), help="Parallel compile jobs (default: CPU count).")
@click.option("--json", "as_json", is_flag=True, help="Print {path, binary, backend, version} when done.")
def build(backend: str, source: Path | None, jobs: int | None, as_json: bool) -> None:
    """Compile llama-server from the llama.cpp sources tierlocal is tested with."""
    chosen = choose_backend() if backend == "auto" else backend
    interactive = sys.stderr.isatty() and not as_json

    def say(message: str) -> None:
        if not as_json:
            click.echo(message, err=True)

    say(f"backend: {chosen}" + (" (detected)" if backend == "auto" else ""))
    if interactive:
        columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console(stderr=True)) as progress:
            task = progress.add_task("build", total=None)
            result = build_engine(
                chosen,
                source=source,
                jobs=jobs,
                say=progress.console.print,
                on_progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
    else:
        result = build_engine(chosen, source=source, jobs=jobs, say=say)
    if as_json:
        print_json(result.to_json())
    else:
        click.echo(f"installed {result.binary} ({result.backend}, {result.version})")


@engine.command("list")
@click.option("--json", "as_json", is_flag=True)
def list_engines(as_json: bool) -> None:
    """Engines in tierlocal's engine directory, and the llama-server tierlocal would use."""
    installed = installed_engines()
    chosen = find_llama_server()
    if as_json:
        print_json(
            {
                "engine_dir": str(constants.engine_dir()),
                "engines": [install.to_json() for install in installed],
                "selected": str(chosen) if chosen else None,
            }
        )
        return
    if not installed:
        click.echo(f"no engines in {constants.engine_dir()} (build one: tierlocal engine build)")
    for install in installed:
        click.echo(f"{install.backend:7} {install.version:40} {install.binary}")
    click.echo(f"tierlocal uses: {chosen or 'none found'}")

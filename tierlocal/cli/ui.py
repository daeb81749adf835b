"""``tierlocal ui``: the terminal UI (Textual) — What fits this machine, and Live."""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import click

from .. import constants
from ..errors import UsageError
from ..plan.recommend import PREFERENCES, PURPOSES
from .common import gpu_option, machine, ram_options

__all__ = ["ui"]


def _first_plan_pool() -> Executor:
    """Where the first plan runs while Textual loads and draws: a forked process on Linux (a
    second core plans the catalog meanwhile: the UI opens ~0.2 s sooner on two cores), else a
    thread (fork is unsafe on macOS)."""
    if sys.platform == "linux":
        return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    return ThreadPoolExecutor(1, thread_name_prefix="first-plan")


@click.command()
@gpu_option
@ram_options
@click.option(
    "--ctx", type=click.IntRange(512, 1 << 20), default=constants.DEFAULT_CTX, show_default=True, help="Context tokens per slot to plan at first."
)
@click.option("--parallel", type=click.IntRange(1, 64), default=1, show_default=True, help="Slots to plan at first.")
@click.option(
    "--for", "purpose", type=click.Choice(PURPOSES), default="chat", show_default=True, help="The task whose published benchmarks score the models."
)
@click.option("--prefer", type=click.Choice(list(PREFERENCES)), default="balanced", show_default=True, help="How quality weighs against speed.")
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=constants.DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode speed, tokens/s.",
)
@click.option(
    "--gateway-config",
    "gateway_config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway's TOML file: Live shows its routes (GET /health on its port) and spend (its store). Default: the built-in configuration.",
)
@click.option("--live", "start_live", is_flag=True, help="Open on the Live screen.")
def ui(
    gpus: tuple[str, ...],
    ram: str | None,
    ram_bandwidth: str | None,
    ctx: int,
    parallel: int,
    purpose: str,
    prefer: str,
    min_speed: float,
    gateway_config_path: Path | None,
    start_live: bool,
) -> None:
    """A terminal UI for this machine over SSH: browse what fits, watch what runs.

    \b
    1  What fits: the catalog planned for this machine (or --gpu/--ram), with the selected
       entry's plan beside it. Keys: / filter, f fits/tight/no room, o sort (rank, score,
       speed, size, context, licence, status), r reverse, + - context, ] [ slots,
       n next quantisation, m machine, d pull, s serve (in the background).
    2  Live: each running `tierlocal serve` (plan against what loaded, slots, tok/s), the
       gateway's routes and targets, and spend against budgets, refreshed every second.
    q or Ctrl-C quits. Needs a terminal of 80×24 or more.
    """
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise UsageError(
            "tierlocal ui needs a terminal", hint="run it in an SSH session or a terminal; `tierlocal check --json` is the scriptable answer"
        )
    from ..gateway.config import default_config, load_config
    from ..tui.planning import Planning, machine_label, plan_catalog

    gateway_config = load_config(gateway_config_path) if gateway_config_path is not None else default_config()
    hardware = machine(gpus, ram, ram_bandwidth)
    label = machine_label(list(gpus), ram)
    planning = Planning(
        hardware=hardware, ctx=ctx, parallel=parallel, purpose=purpose, prefer=prefer, min_tokens_per_s=min_speed, machine_label=label
    )
    with _first_plan_pool() as pool:
        first = pool.submit(plan_catalog, planning)
        from ..tui.app import TierlocalApp

        TierlocalApp(planning, gateway_config, start_on="live" if start_live else "fits", first=first).run()

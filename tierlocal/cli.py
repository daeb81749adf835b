"""The ``tierlocal`` command: parse options, call the library, render a table or ``--json``."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import click

from . import __version__, constants
from ._render import print_json, render_hardware, render_recommendation, render_summary
from .catalog import load_gpus, load_host_defaults, load_models
from .errors import TierlocalError
from .fit import CatalogFit, Recommendation, recommend
from .gguf import read_headers, summarize
from .hardware import Hardware, detect, with_gpu_override

__all__ = ["cli", "main"]

_DEFAULT_CTX = 8192
_DEFAULT_MIN_TOKENS_PER_S = 5.0

_gpu_option = click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME|SIZE",
    help="Plan for this GPU instead of detecting: a size (24GiB), a name from recipes/gpus.toml (\"RTX 4090\"), or N× either (2xH100). Repeatable.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tierlocal")
def cli() -> None:
    """What fits on one GPU, and how to serve it.

    Set TIERLOCAL_DEBUG=1 for tracebacks on errors.
    """


@cli.command()
@click.argument("source")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def inspect(source: str, as_json: bool) -> None:
    """Show what a GGUF header says, reading the header only.

    SOURCE is a local path, an http(s):// URL (read with Range requests), or
    hf://OWNER/REPO/FILE.gguf[@REVISION] (honours HF_ENDPOINT and HF_TOKEN).
    Split models (NAME-00001-of-00003.gguf) are read as one: every shard's header.

    \b
    Examples:
      tierlocal inspect ./gemma-3-270m-q4_k_m.gguf
      tierlocal inspect hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q8_0.gguf --json
    """
    summary = summarize(read_headers(source))
    if as_json:
        print_json(summary.to_json())
    else:
        render_summary(summary)


def _machine(gpus: Sequence[str]) -> Hardware:
    return with_gpu_override(detect(), gpus)


@cli.command()
@_gpu_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def hw(gpus: tuple[str, ...], as_json: bool) -> None:
    """Show this machine's GPUs, RAM, free disk and cores (or what --gpu describes).

    GPUs are found through NVML (NVIDIA), sysfs (AMD), unified memory (Apple) and
    `llama-server --list-devices` when a llama-server binary is found
    (TIERLOCAL_LLAMA_SERVER, PATH, or tierlocal's engine directory).
    """
    hardware = _machine(gpus)
    if as_json:
        print_json(hardware.to_json())
    else:
        render_hardware(hardware)


def _fit_json(fit: CatalogFit | None) -> dict[str, object] | None:
    if fit is None:
        return None
    entry = fit.entry
    return {
        "model": entry.family,
        "params": entry.params,
        "active_params": entry.active_params,
        "quant": entry.quant,
        "bits_per_weight": entry.bits_per_weight,
        "file_bytes": entry.file_bytes,
        "file_bytes_measured": entry.file_bytes_measured,
        "ctx": fit.ctx,
        "parallel": fit.parallel,
        "weights_bytes": fit.weights_bytes,
        "kv_bytes": fit.kv_bytes,
        "overhead_bytes": fit.overhead_bytes,
        "margin_bytes": fit.margin_bytes,
        "total_needed_bytes": fit.total_needed_bytes,
        "fits": fit.fits,
        "est_decode_tokens_per_s": None if fit.est_decode_tokens_per_s is None else round(fit.est_decode_tokens_per_s, 1),
        "ollama_tag": entry.ollama,
    }


def _recommendation_json(recommendation: Recommendation, hardware: Hardware) -> dict[str, object]:
    budget = recommendation.budget
    return {
        "method": "rule-of-thumb",
        "hardware": hardware.to_json(),
        "budget": {
            "device": budget.device,
            "backend": budget.backend,
            "memory_bytes": budget.memory_bytes,
            "bandwidth_bytes_per_s": budget.bandwidth_bytes_per_s,
            "bandwidth_assumed": budget.bandwidth_assumed,
        },
        "min_tokens_per_s": recommendation.min_tokens_per_s,
        "recommendation": _fit_json(recommendation.best),
        "alternatives": [
            {"role": role, **fit_json}
            for role, fit in (("smaller", recommendation.smaller), ("larger", recommendation.larger))
            if (fit_json := _fit_json(fit)) is not None
        ],
        "frontier": [
            {
                "model": verdict.entry.family,
                "fits": verdict.fits,
                "floor_bytes": verdict.floor_bytes,
                "params": verdict.entry.params,
                "active_params": verdict.entry.active_params,
                "largest_gpu": verdict.largest_gpu,
                "gpus_for_floor": verdict.gpus_for_floor,
                "facts_date": verdict.entry.facts_date,
            }
            for verdict in recommendation.frontier
        ],
    }


@cli.command()
@_gpu_option
@click.option("--ctx", type=click.IntRange(256, 1 << 24), default=_DEFAULT_CTX, show_default=True, help="Context tokens per slot.")
@click.option("--parallel", type=click.IntRange(1, 1024), default=1, show_default=True, help="Concurrent slots, each with its own KV cache.")
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=_DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode speed, tokens/s (bandwidth bound).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def check(gpus: tuple[str, ...], ctx: int, parallel: int, min_speed: float, as_json: bool) -> None:
    """Recommend a model and quantisation from the built-in catalog for this machine.

    Works offline: the catalog (recipes/models.toml) carries the facts. Shows the
    arithmetic (weights + KV cache + overhead against free memory) and says plainly
    which frontier models can never fit one machine.

    \b
    Examples:
      tierlocal check
      tierlocal check --gpu 24GiB --ctx 32768
      tierlocal check --gpu 2xH100 --json
    """
    hardware = _machine(gpus)
    recommendation = recommend(
        load_models(),
        hardware,
        load_host_defaults(),
        load_gpus(),
        ctx=ctx,
        parallel=parallel,
        min_tokens_per_s=min_speed,
    )
    if as_json:
        print_json(_recommendation_json(recommendation, hardware))
    else:
        render_recommendation(recommendation, hardware)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the CLI; a TierlocalError becomes one line (and a hint) on stderr."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="tierlocal", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TierlocalError as exc:
        if constants.debug_enabled():
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)


def _register_commands() -> None:
    from ._plan_cli import plan

    cli.add_command(plan)


_register_commands()

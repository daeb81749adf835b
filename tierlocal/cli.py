"""The ``tierlocal`` command: parse options, call the library, render a table or ``--json``."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence

import click

from . import __version__, constants
from ._render import print_json, render_hardware, render_recommendation, render_summary
from ._check_source import check_source, machine_for, parse_ctx, parse_parallel, render_source_check, source_check_json
from .catalog import find_model, load_gpus, load_host_defaults, load_models
from .errors import TierlocalError, UsageError
from .estimate import RunRequest
from .fit import CatalogFit, Recommendation, recommend
from .gguf import read_headers, summarize
from .hardware import Hardware
from ._cli_common import DEFAULT_CTX as _DEFAULT_CTX, DEFAULT_MIN_TOKENS_PER_S as _DEFAULT_MIN_TOKENS_PER_S, gpu_option as _gpu_option, machine as _machine

__all__ = ["cli", "main"]

class _LazyGroup(click.Group):
    """Commands that live in their own modules are imported when used, not at every start
    (huggingface_hub, ollama and gguf cost a second of imports together)."""

    lazy = {
        "plan": "tierlocal._plan_cli:plan",
        "pull": "tierlocal._pull_cli:pull",
        "serve": "tierlocal._serve_cli:serve",
        "status": "tierlocal._serve_cli:status",
        "service": "tierlocal._service_cli:service",
        "engine": "tierlocal._engine_cli:engine",
        "gateway": "tierlocal._gateway_cli:gateway",
        "usage": "tierlocal._gateway_cli:usage",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, _, attribute = self.lazy[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module_name), attribute)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
        "gguf_repo": entry.gguf_repo,
        "pull": f"hf://{entry.gguf_repo} --quant {entry.quant}" if entry.gguf_repo else None,
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
@click.argument("source", required=False)
@_gpu_option
@click.option("--ctx", default=str(_DEFAULT_CTX), show_default=True, help="Context tokens (per slot for the catalog), or 'max' with SOURCE.")
@click.option("--parallel", default="1", show_default=True, help="Slots, each with its own KV cache; with SOURCE also 'auto' (llama-server's 4 unified) or 'max'.")
@click.option("--ngl", type=click.IntRange(0, 10_000), help="Layers on the GPU (default: the most that fit).")
@click.option("--n-cpu-moe", type=click.IntRange(0, 10_000), help="MoE: keep the experts of the first N blocks on the CPU (default: planned).")
@click.option("--cache-type-k", default="f16", show_default=True, help="KV cache type for K (f16, q8_0, q4_0 ...).")
@click.option("--cache-type-v", default="f16", show_default=True, help="KV cache type for V.")
@click.option("--flash-attn", type=click.Choice(["on", "off", "auto"]), default="auto", show_default=True, help="Flash attention (auto = on, as llama-server decides on CPU and GPU).")
@click.option("--ubatch", type=click.IntRange(1, 65536), default=512, show_default=True, help="Physical batch size (-ub).")
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=_DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode speed, tokens/s (bandwidth bound), for the catalog recommendation.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def check(
    source: str | None,
    gpus: tuple[str, ...],
    ctx: str,
    parallel: str,
    ngl: int | None,
    n_cpu_moe: int | None,
    cache_type_k: str,
    cache_type_v: str,
    flash_attn: str,
    ubatch: int,
    min_speed: float,
    as_json: bool,
) -> None:
    """What fits this machine (or the one --gpu describes), and how to run it.

    Without SOURCE: recommend a model and quantisation from the built-in catalog
    (recipes/models.toml), offline, showing the arithmetic, and say plainly which
    frontier models can never fit one machine.

    With SOURCE (a GGUF path, URL or hf:// file — header only — or a catalog name): the
    per-device estimate of weights, KV cache, compute and output buffers, the largest -ngl
    that fits (or the one you give), --ctx max / --parallel max solved, the llama-server
    command line and the Ollama settings.

    \b
    Examples:
      tierlocal check
      tierlocal check --gpu 24GiB --ctx 32768
      tierlocal check ./model.gguf --ctx max --json
      tierlocal check kimi-k3
    """
    hardware = _machine(gpus)
    if len(hardware.gpus) > 1 and not as_json:
        largest = max(hardware.gpus, key=lambda device: device.free_bytes)
        click.echo(f"note: planning for one GPU ({largest.name}); tierlocal does not split a model across {len(hardware.gpus)} GPUs yet", err=True)
    if source is not None and not find_model(source):
        _check_one_source(source, hardware, ctx, parallel, RunRequest(ngl=ngl, n_cpu_moe=n_cpu_moe, cache_type_k=cache_type_k, cache_type_v=cache_type_v, flash_attn=flash_attn != "off", n_ubatch=ubatch), as_json)
        return
    entries = find_model(source) if source is not None else list(load_models())
    if not ctx.isdigit() or not parallel.isdigit():
        raise UsageError("the catalog recommendation takes numbers for --ctx and --parallel", hint="'max' and 'auto' need a GGUF SOURCE")
    recommendation = recommend(
        entries,
        hardware,
        load_host_defaults(),
        load_gpus(),
        ctx=parse_ctx(ctx) or _DEFAULT_CTX,
        parallel=int(parallel),
        min_tokens_per_s=min_speed,
    )
    if as_json:
        print_json(_recommendation_json(recommendation, hardware))
    else:
        render_recommendation(recommendation, hardware)


def _check_one_source(source: str, hardware: Hardware, ctx: str, parallel: str, request: RunRequest, as_json: bool) -> None:
    if "/" not in source and not source.endswith(".gguf"):
        raise UsageError(f"{source!r} is neither a catalog model nor a GGUF path", hint="see recipes/models.toml, or give a path, URL or hf://OWNER/REPO/FILE.gguf")
    result = check_source(
        source,
        read_headers(source),
        machine_for(hardware, load_host_defaults()),
        ctx=parse_ctx(ctx),
        parallel=parse_parallel(parallel),
        request=request,
    )
    if as_json:
        print_json(source_check_json(result))
    else:
        render_source_check(result)


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

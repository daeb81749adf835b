"""The ``tierlocal serve`` and ``tierlocal status`` commands."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from . import constants
from ._cli_common import ollama_port, serve_options
from ._render import print_json
from .catalog import find_model
from .errors import TierlocalError, UsageError
from .pull import parse_hf_pull, plan_hf_pull, run_pull
from .serve import ServeOptions, serve_llama, state_path

__all__ = ["serve", "status"]


def _resolve_model(source: str, pull: bool) -> Path:
    """A local GGUF path for SOURCE: the path itself, an ollama:// tag's blob in Ollama's store,
    or an hf:// / catalog model from the hub cache (downloaded first with --pull)."""
    if source.startswith("ollama://"):
        from .serve_ollama import ollama_store_blob

        return ollama_store_blob(source.removeprefix("ollama://"))
    if not source.startswith("hf://"):
        path = Path(source)
        if path.exists() or "/" in source or source.endswith(".gguf"):
            return path
        entries = [entry for entry in find_model(source) if entry.gguf_repo]
        if not entries:
            raise UsageError(f"{source!r} is neither a GGUF file nor a catalog model", hint="give a path, hf://OWNER/REPO/FILE.gguf, or a name from recipes/models.toml")
        entry = entries[0]
        spec, quant = parse_hf_pull(f"hf://{entry.gguf_repo}"), entry.quant
    else:
        spec, quant = parse_hf_pull(source), None
    plan = plan_hf_pull(spec, quant=None if spec.filename else quant, dest_dir=None)
    if not all(planned.present for planned in plan.files):
        if not pull:
            raise UsageError(f"{source}: not downloaded yet", hint=f"add --pull, or run `tierlocal pull {source}` first")
        click.echo(f"pulling {plan.source}: {', '.join(f.repo_file.path for f in plan.files)}", err=True)
        run_pull(plan)
    return plan.files[0].final_path


@click.command()
@click.argument("source")
@click.option("--engine", type=click.Choice(["llama-server", "ollama", "python"]), default="llama-server", show_default=True, help="The engine: llama-server; Ollama (an Ollama at --host:--port is used as it is; else `ollama serve` is started with the plan's settings); or python: llama-cpp-python's server (pip install 'tierlocal[python-engine]'), one request at a time.")
@click.option("--ollama", "ollama_binary", metavar="PATH", help="--engine ollama: the ollama binary to start when none is running (default: PATH).")
@serve_options
@click.option("--pull", is_flag=True, help="Download an hf:// or catalog model first if it is not in the hub cache.")
@click.option("--load-timeout", type=click.FloatRange(1), help="Seconds to wait for the engine to become healthy (default: 120 + 1 per 50 MB of model).")
@click.option("--threads", type=click.IntRange(1, 1024), help="CPU threads for llama-server (-t).")
@click.option("--json", "as_json", is_flag=True, help="Once ready, print the plan, what llama.cpp did and the delta as one JSON object.")
def serve(
    source: str,
    engine: str,
    ollama_binary: str | None,
    llama_server: str | None,
    ctx: str,
    parallel: str,
    host: str,
    port: int,
    gpus: tuple[str, ...],
    api_key_file: Path | None,
    pull: bool,
    load_timeout: float | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Run llama-server with the planned -c, -np, -ngl (and --n-cpu-moe, cache types, -fa),
    wait until it answers /health, check the load against the plan, and keep it running until
    SIGTERM or Ctrl-C (systemd: Type=notify, READY=1 once verified).

    \b
    Examples:
      tierlocal serve ./gemma-3-270m-Q4_K_M.gguf --ctx 8192 --parallel 2
      tierlocal serve qwen3-8b --pull --ctx max
      tierlocal serve ./model.gguf --host 0.0.0.0 --api-key-file /etc/tierlocal/key
      tierlocal serve ollama://gemma3:270m --engine ollama   # a tag already in Ollama's store
    """
    model = _resolve_model(source, pull)
    if engine == "ollama":
        tag = source.removeprefix("ollama://") if source.startswith("ollama://") else None
        _serve_with_ollama(model, ollama_binary, ctx, parallel, host, port, gpus, as_json, tag)
        return
    options = ServeOptions(
        model=model,
        llama_server=llama_server,
        ctx=ctx,
        parallel=parallel,
        host=host,
        port=port,
        gpus=gpus,
        api_key_file=api_key_file,
        load_timeout_s=load_timeout,
        threads=threads,
    )

    if engine == "python":
        from .serve_python import serve_python

        code = serve_python(options, say=_say, on_ready=_on_ready(as_json, _render_status))
    else:
        code = serve_llama(options, say=_say, on_ready=_on_ready(as_json, _render_status))
    if code:
        sys.exit(code)


def _say(message: str) -> None:
    click.echo(message, err=True)


def _on_ready(as_json: bool, render: Callable[[dict[str, object]], None]) -> Callable[[dict[str, object]], None]:
    """Once the engine is up: the JSON object on stdout (flushed: a supervisor may be reading
    it while we keep running), or the human summary."""

    def on_ready(payload: dict[str, object]) -> None:
        if as_json:
            print_json(payload)
            sys.stdout.flush()
        else:
            render(payload)

    return on_ready


def _serve_with_ollama(model: Path, ollama_binary: str | None, ctx: str, parallel: str, host: str, port: int, gpus: tuple[str, ...], as_json: bool, tag: str | None) -> None:
    from .serve import stop_on_signals
    from .serve_ollama import OllamaServeOptions, check_ollama_exposure, plan_for_ollama, serve_ollama

    check_ollama_exposure(host)
    if not model.is_file():
        raise UsageError(f"{model}: no such model file", hint="give a GGUF path, or a catalog name / hf:// source with --pull")
    port = ollama_port(port)
    check = plan_for_ollama(model, gpus, ctx, parallel)

    def render(payload: dict[str, object]) -> None:
        actual, delta = payload["actual"], payload["delta"]
        assert isinstance(actual, dict) and isinstance(delta, dict)
        click.echo(f"serving {actual['ollama_model']} through Ollama at {payload['url']}: context {actual['context_length']}, {actual['size_vram_bytes'] / 2**20:.0f} of {actual['size_bytes'] / 2**20:.0f} MiB in VRAM")
        click.echo("plan held" if delta["verified"] else "PLAN NOT HELD: " + "; ".join(delta["problems"]))
        for warning in delta["warnings"]:
            click.echo(f"warning: {warning}", err=True)

    with stop_on_signals() as stop:
        code = serve_ollama(check, model, OllamaServeOptions(host, port, ollama_binary, tag), stop=stop, say=_say, on_ready=_on_ready(as_json, render))
    if code:
        sys.exit(code)


def _render_status(payload: dict[str, object]) -> None:
    delta = payload["delta"]
    actual = payload["actual"]
    assert isinstance(delta, dict) and isinstance(actual, dict)
    click.echo(f"serving {payload['url']}  ({payload['engine']} pid {payload['engine_pid']}, log {payload['log']})")
    click.echo(f"layers on the GPU: {actual['layers_offloaded']}/{actual['layers_total'] or '-'}   context {actual['n_ctx']} = {actual['parallel']} slot(s) × {actual['n_ctx_per_slot']}")
    for device in delta["devices"]:
        error = "" if device["error"] is None else f" ({device['error']:+.1%})"
        click.echo(f"  {device['name']}: planned {device['planned_bytes'] / 2**20:.0f} MiB, allocated {device['actual_bytes'] / 2**20:.0f} MiB{error}")
    click.echo("plan held" if delta["verified"] else "PLAN NOT HELD: " + "; ".join(delta["problems"]))
    for warning in delta["warnings"]:
        click.echo(f"warning: {warning}", err=True)


@click.command()
@click.option("--port", type=click.IntRange(1, 65535), help="The server's port (default: the only one running).")
@click.option("--json", "as_json", is_flag=True, help="Print {plan, actual, delta, …} as one JSON object.")
def status(port: int | None, as_json: bool) -> None:
    """Show the running `tierlocal serve`: its plan, what llama.cpp did, and the delta."""
    if port is not None:
        candidates = [state_path(port)]
    else:
        candidates = sorted(constants.run_dir().glob("serve-*.json")) if constants.run_dir().is_dir() else []
    running = []
    for path in candidates:
        try:
            payload = json.loads(path.read_text())
            os.kill(int(payload["pid"]), 0)
        except (OSError, ValueError, KeyError):
            continue
        running.append(payload)
    if not running:
        raise TierlocalError("no tierlocal serve is running" + (f" on port {port}" if port else ""), hint="start one with `tierlocal serve MODEL`")
    if len(running) > 1:
        raise UsageError(f"{len(running)} servers are running", hint="choose one with --port")
    if as_json:
        print_json(running[0])
    else:
        _render_status(running[0])

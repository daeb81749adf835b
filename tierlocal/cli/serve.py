"""``tierlocal serve`` (plan, launch, verify, supervise: tierlocal.serve) and ``tierlocal status``
(the running server's plan, load and delta)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from ..catalog import catalog_reasoning_effort
from ..engines.flags import reasoning_flags
from ..errors import TierlocalError, UsageError
from ..fit.concurrency import UsersSpeed
from ..plan.modes import THINKING
from ..resolve import resolve_model
from ..serve import ENGINES
from ..serve import serve as run_serve
from ..serve.state import ServeState, running_servers, running_sets, starting_servers
from .common import console, machine, ollama_port, print_json, serve_options, serve_options_from
from .serve_set import render_sets, serve_set, set_sources
from .users_view import users_table_view

__all__ = ["serve", "status"]


@click.command()
@click.argument("source", required=False)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED, metavar="[SOURCE]... [-- LLAMA_SERVER_OPTIONS...]")
@click.option(
    "--set",
    "set_file",
    metavar="FILE",
    help="Serve a set of models planned together from a set file (docs/model-sets.md); several SOURCEs are a quick set. One endpoint: the "
    "request's model chooses the member; members load on demand and unload by bytes.",
)
@click.option("--ram", metavar="SIZE", help="With a set: the RAM the set may use (32GiB), instead of what is available here.")
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default="llama-server",
    show_default=True,
    help="The engine: llama-server; Ollama (an Ollama at --host:--port is used as it is; else `ollama serve` is started with the plan's "
    "settings); or python: llama-cpp-python's server (pip install 'tierlocal[python-engine]'), one request at a time.",
)
@click.option("--ollama", "ollama_binary", metavar="PATH", help="--engine ollama: the ollama binary to start when none is running (default: PATH).")
@serve_options
@click.option("--pull", is_flag=True, help="Download an hf:// or catalog model first if it is not in the hub cache.")
@click.option(
    "--quant",
    help="The quantisation of an hf://OWNER/REPO source (Q4_K_M, UD-Q4_K_XL …; default: the one `check hf://OWNER/REPO` ranks first here).",
)
@click.option(
    "--load-timeout", type=click.FloatRange(1), help="Seconds to wait for the engine to become healthy (default: 120 + 1 per 50 MB of model)."
)
@click.option("--threads", type=click.IntRange(1, 1024), help="CPU threads for llama-server (-t).")
@click.option(
    "--thinking",
    type=click.Choice(THINKING),
    default="auto",
    show_default=True,
    help="For a model that can answer with or without a reasoning trace (Qwen3, Qwen3.5/3.6, Gemma 4, …): on or off (llama-server's "
    "--reasoning, which sets the chat template's enable_thinking); low, medium or high: the reasoning effort (llama-server's "
    "--reasoning-effort, for gpt-oss); auto keeps the template's default, except that a catalog model scored at one effort (gpt-oss: "
    "high) is served at it. `check` says which mode it picked.",
)
@click.option("--json", "as_json", is_flag=True, help="Once ready, print the plan, what llama.cpp did and the delta as one JSON object.")
def serve(
    source: str | None,
    set_file: str | None,
    ram: str | None,
    engine: str,
    ollama_binary: str | None,
    engine_args: tuple[str, ...],
    pull: bool,
    quant: str | None,
    load_timeout: float | None,
    threads: int | None,
    thinking: str,
    as_json: bool,
    **served: Any,
) -> None:
    """Run llama-server with the planned -c, -np, -ngl (and --n-cpu-moe, cache types, -fa),
    wait until it answers /health, check the load against the plan and the chat template, send
    one short chat, and keep it running until SIGTERM or Ctrl-C (systemd: Type=notify, READY=1
    once it answered). Other llama-server options go after `--`; the ones the plan sets are
    refused (use serve's own), --swa-full is planned for.

    \b
    Examples:
      tierlocal serve ./gemma-3-270m-Q4_K_M.gguf --ctx 8192 --parallel 2
      tierlocal serve ./model.gguf --users 4          # four users at once, one KV cache they share
      tierlocal serve qwen3-8b --pull --ctx max
      tierlocal serve hf://unsloth/Qwen3-8B-GGUF --quant Q6_K --pull
      tierlocal serve qwen3.5-9b --thinking off      # answer directly (gpt-oss: --thinking low|medium|high)
      tierlocal serve ./model.gguf --host 0.0.0.0 --api-key-file /etc/tierlocal/key
      tierlocal serve ./no-template.gguf --chat-template llama3
      tierlocal serve ./model.gguf --flash-attn off -- --temp 0.7 --no-webui
      tierlocal serve ollama://gemma3:270m --engine ollama   # a tag already in Ollama's store
      tierlocal serve ./chat.gguf ./code.gguf --ram 16GiB       # a set: one endpoint, loaded on demand
      tierlocal serve --set team.toml --port 8080
    """
    if set_sources(source, engine_args) or set_file is not None:
        serve_set(
            source, engine_args, set_file, served, engine=engine, ram=ram, pull=pull, load_timeout=load_timeout, threads=threads, as_json=as_json
        )
        return
    source = _one_model(source, ram, engine, served)
    engine_args = _with_thinking(engine_args, thinking, engine, catalog_reasoning_effort(source))
    ctx_tokens = int(served["ctx"]) if served["ctx"] is not None and served["ctx"].isdigit() else None  # None: the default, up to training
    # A catalog name is planned for this machine (as --gpu describes it): detected only then.
    model = resolve_model(source, pull=pull, say=_say, hardware=lambda: machine(served["gpus"]), ctx=ctx_tokens, quant=quant)
    options = serve_options_from(
        model,
        served,
        engine=engine,
        ollama_binary=ollama_binary,
        ollama_tag=source.removeprefix("ollama://") if engine == "ollama" and source.startswith("ollama://") else None,
        load_timeout_s=load_timeout,
        threads=threads,
        engine_args=engine_args,
    )
    if engine == "ollama":
        options = replace(options, port=ollama_port(options.port))
    code = run_serve(options, say=_say, on_ready=_on_ready(as_json, _render_ollama if engine == "ollama" else _render_status))
    if code:
        sys.exit(code)


def _one_model(source: str | None, ram: str | None, engine: str, served: dict[str, Any]) -> str:
    """SOURCE, once the options make sense for one model.

    Raises:
        UsageError: no SOURCE, --ram (a set's budget), or --mmproj for an engine other than llama-server.
    """
    if source is None:
        raise UsageError("give a SOURCE to serve, or --set FILE", hint="tierlocal serve ./model.gguf")
    if ram is not None:
        raise UsageError("--ram is the budget of a set", hint="serve one model with the memory this machine has, or give several SOURCEs")
    if served.get("mmproj") is not None and engine != "llama-server":
        raise UsageError(
            f"--mmproj is planned and passed for llama-server only, not --engine {engine}", hint="drop --mmproj, or serve with --engine llama-server"
        )
    return source


def _with_thinking(engine_args: tuple[str, ...], thinking: str, engine: str, effort: str | None = None) -> tuple[str, ...]:
    """``engine_args`` with llama-server's ``--reasoning`` for ``--thinking on|off``, its
    ``--reasoning-effort`` for ``--thinking low|medium|high``, and under ``auto`` the effort a
    catalog model was scored at (``effort``), unless the arguments name one.

    Raises:
        UsageError: --thinking with another engine, or beside a --reasoning (--reasoning-effort) of its own.
    """
    own = {"--reasoning", "-rea", "--reasoning-effort"} & {arg.partition("=")[0] for arg in engine_args}
    if thinking == "auto":
        quiet = effort is None or engine != "llama-server" or "--reasoning-effort" in own
        return engine_args if quiet else (*engine_args, *reasoning_flags("thinking", effort=effort, switch=False))
    if engine != "llama-server":
        raise UsageError(
            f"--thinking is passed to llama-server only, not --engine {engine}", hint="Ollama takes `think` per request; drop --thinking"
        )
    if own:
        raise UsageError(f"--thinking and llama-server's own {sorted(own)[0]} both given", hint="keep one of them")
    mode = {"on": "thinking", "off": "standard"}.get(thinking, f"thinking-{thinking}")
    return (*engine_args, *reasoning_flags(mode))


def _say(message: str) -> None:
    click.echo(message, err=True)


def _on_ready(as_json: bool, render: Callable[[ServeState], None]) -> Callable[[ServeState], None]:
    """Once the engine is up: the JSON object on stdout (flushed: a supervisor may be reading
    it while we keep running), or the human summary."""

    def on_ready(state: ServeState) -> None:
        if as_json:
            print_json(state.to_json())
            sys.stdout.flush()
        else:
            render(state)

    return on_ready


def _render_ollama(state: ServeState) -> None:
    actual, delta = state.actual, state.delta
    click.echo(
        f"serving {actual['ollama_model']} through Ollama at {state.url}: context {actual['context_length']}, "
        f"{actual['size_vram_bytes'] / 2**20:.0f} of {actual['size_bytes'] / 2**20:.0f} MiB in VRAM"
    )
    click.echo("plan held" if delta["verified"] else "PLAN NOT HELD: " + "; ".join(delta["problems"]))
    for warning in delta["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    _render_users_planned(state)


def _render_status(state: ServeState) -> None:
    delta, actual = state.delta, state.actual
    click.echo(f"serving {state.url}  ({state.engine} pid {state.engine_pid}, log {state.log})")
    slots = f" = {actual['parallel']} slot(s) × {actual['n_ctx_per_slot']}" if actual.get("parallel") and actual.get("n_ctx_per_slot") else ""
    click.echo(
        f"layers on the GPU: {actual.get('layers_offloaded') or 0}/{actual.get('layers_total') or '-'}   context {actual.get('n_ctx') or '-'}{slots}"
    )
    for device in delta["devices"]:
        error = "" if device["error"] is None else f" ({device['error']:+.1%})"
        click.echo(
            f"  {device['name']}: planned {device['planned_bytes'] / 2**20:.0f} MiB, allocated {device['actual_bytes'] / 2**20:.0f} MiB{error}"
        )
    click.echo("plan held" if delta["verified"] else "PLAN NOT HELD: " + "; ".join(delta["problems"]))
    for warning in delta["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    _render_users_planned(state)


def _render_users_planned(state: ServeState) -> None:
    """The plan's users table (measured rows where `bench --users` recorded them)."""
    rows = [row for row in map(UsersSpeed.from_json, state.plan.get("users") or []) if row is not None]
    if rows:
        asked = state.plan.get("users_asked")
        console().print(users_table_view(rows, asked=asked if isinstance(asked, int) else None))


@click.command()
@click.option("--port", type=click.IntRange(1, 65535), help="The server's port (default: the only one running; with --live, every one).")
@click.option("--live", is_flag=True, help="What the engines are doing now: slots busy, requests waiting, tokens/s over --window.")
@click.option(
    "--window", "window_s", type=click.FloatRange(0.5, 600), default=5.0, show_default=True, help="With --live: seconds between the two samples."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {plan, actual, delta, …} as one JSON object (a list of them when several run and no --port is given; with --live: {engines: […]}).",
)
def status(port: int | None, live: bool, window_s: float, as_json: bool) -> None:
    """Show the running `tierlocal serve` (each of them, without --port): its plan, what llama.cpp
    did, and the delta; a served model set: each member's state, bytes and last use."""
    sets = running_sets(port) if not live else []
    if sets and (port is not None or not as_json):
        render_sets(sets, as_json=as_json)
        if port is not None or as_json:
            return
    running = running_servers(port)
    if not running and sets:
        return
    if not running:
        starting = starting_servers(port)
        if starting:
            first = starting[0]
            raise TierlocalError(
                f"tierlocal serve at {first.get('url')} is still starting ({first.get('phase')}; pid {first.get('pid')})",
                hint="it is serving once the load is checked against the plan: run status again in a moment",
            )
        raise TierlocalError("no tierlocal serve is running" + (f" on port {port}" if port else ""), hint="start one with `tierlocal serve MODEL`")
    if live:
        engines = _live(running, window_s)
        if as_json:
            print_json({"engines": engines})
        else:
            _render_live(engines)
        return
    if as_json:
        print_json(
            running[0].to_json() if len(running) == 1 else [server.to_json() for server in running]
        )  # several (no --port): a list of the same objects
        return
    for index, server in enumerate(running):
        if index:
            click.echo("")
        if server.engine == "ollama":
            _render_ollama(server)
        else:
            _render_status(server)


def _live(running: list[ServeState], window_s: float) -> list[dict[str, object]]:
    """Two samples of every engine ``window_s`` apart, with the rates between them."""
    import asyncio
    import time

    from ..serve.live import Throughput, live_report

    history: dict[str, Throughput] = {}
    asyncio.run(live_report(running, history))
    time.sleep(window_s)
    return asyncio.run(live_report(running, history, window_s=window_s))


def _render_live(engines: list[dict[str, Any]]) -> None:
    for engine in engines:
        if engine["error"]:
            click.echo(f"{engine['url']} ({engine['engine']}): {engine['error']}")
            continue
        if engine["engine"] == "ollama":
            names = ", ".join(model["name"] for model in engine["models"]) or "no model loaded"
            click.echo(f"{engine['url']} (ollama): {names}")
            continue
        rate = engine["decode_tokens_per_s"]
        click.echo(
            f"{engine['url']} ({engine['engine']}): slots {engine['slots_busy']}/{engine['slots_total']} busy, {engine['requests_deferred'] or 0} "
            "waiting;"
            + (
                f" {rate:.1f} tok/s decoded, {engine['prompt_tokens_per_s']:.1f} tok/s prompt over {engine['window_s']:g} s"
                if rate is not None
                else ""
            )
        )

"""``tierlocal bench``: a running server's speed measured, beside the estimate, and recorded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

import click
from rich.table import Table

from ..errors import EngineFailed, TierlocalError, UsageError
from ..serve.bench import BenchRun, bench_path, bench_server, record_bench
from ..serve.bench_users import UsersRun, measure_users, parse_users, record_users
from ..serve.port import free_loopback_port
from ..serve.state import ServeState, running_servers
from ..units import format_bytes
from .common import console, json_option, print_json

__all__ = ["bench"]

T = TypeVar("T")


@click.command()
@click.argument("source", required=False)
@click.option("--port", type=click.IntRange(1, 65535), help="Measure the `tierlocal serve` on this port (default: the only one running).")
@click.option("--ctx", default="4096", show_default=True, help="With SOURCE: the context to serve it with.")
@click.option("--llama-server", "llama_server", metavar="PATH", help="With SOURCE: the llama-server binary.")
@click.option("--threads", type=click.IntRange(1, 1024), help="With SOURCE: CPU threads.")
@click.option(
    "--users",
    "users_text",
    metavar="N,N,…",
    help="Measure users at once instead: for each count, that many streaming clients start together, each with a prompt of its own "
    "(with SOURCE, served with that many slots at most).",
)
@click.option(
    "--prompt", "prompt_tokens", type=click.IntRange(16, 32768), default=256, show_default=True, help="With --users: prompt tokens per user."
)
@click.option("--tokens", type=click.IntRange(2, 4096), default=64, show_default=True, help="With --users: tokens each user is given.")
@json_option
def bench(
    source: str | None,
    port: int | None,
    ctx: str,
    llama_server: str | None,
    threads: int | None,
    users_text: str | None,
    prompt_tokens: int,
    tokens: int,
    as_json: bool,
) -> None:
    """Measure prefill and decode tokens/s and time to first token at a few prompt lengths,
    and the engine's peak memory, on a running `tierlocal serve` — or, with SOURCE, on one
    started for it and stopped after — and print them beside the estimate. Each result is
    recorded ($TIERLOCAL_HOME/bench.jsonl) under the model file, engine build and device, and
    `tierlocal check` shows it for the same three.

    \b
    Examples:
      tierlocal bench                     # the running tierlocal serve
      tierlocal bench ./gemma-3-270m-Q4_K_M.gguf --ctx 4096
      tierlocal bench --users 1,2,4,8     # users at once, beside the plan's table
    """
    users = parse_users(users_text) if users_text else None
    if users is not None:
        slots = max(users)
        measured = _with_server(source, port, ctx, llama_server, threads, slots, lambda state: _users(state, users, prompt_tokens, tokens))
        record_users(measured)
        print_json(measured.to_json()) if as_json else _render_users(measured)
        return
    run = _with_server(source, port, ctx, llama_server, threads, None, lambda state: bench_server(state, say=_say))
    record_bench(run)
    print_json(run.to_json()) if as_json else _render(run)


def _users(state: ServeState, users: tuple[int, ...], prompt_tokens: int, tokens: int) -> UsersRun:
    return measure_users(state, users, prompt_tokens=prompt_tokens, tokens=tokens, say=_say)


def _say(message: str) -> None:
    click.echo(message, err=True)


def _with_server(
    source: str | None,
    port: int | None,
    ctx: str,
    llama_server: str | None,
    threads: int | None,
    parallel: int | None,
    measure: Callable[[ServeState], T],
) -> T:
    """``measure`` the running `tierlocal serve` (the only one, or the one on ``port``), or with
    ``source`` one started for the measurement (planned for ``parallel`` users) and stopped after."""
    if source is not None:
        return _on_source(source, ctx, llama_server, threads, parallel, measure)
    servers = running_servers(port)
    if not servers:  # a state, not a bad option: exit 1, as `status` says it
        raise TierlocalError(
            "no tierlocal serve is running" + (f" on port {port}" if port else ""),
            hint="start one with `tierlocal serve MODEL`, or give a SOURCE to serve for the measurement",
        )
    if len(servers) > 1:
        raise UsageError(f"{len(servers)} servers are running", hint="give --port to say which")
    return measure(servers[0])


def _on_source(source: str, ctx: str, llama_server: str | None, threads: int | None, parallel: int | None, measure: Callable[[ServeState], T]) -> T:
    """`tierlocal serve SOURCE` started for the measurement (its plan, template check and first
    answer included), measured, and stopped."""
    argv = [sys.executable, "-m", "tierlocal", "serve", source, "--port", str(free_loopback_port()), "--ctx", ctx, "--json"]
    argv += ["--llama-server", llama_server] if llama_server else []
    argv += ["--threads", str(threads)] if threads else []
    argv += ["--users", str(parallel)] if parallel else []
    _say(f"starting tierlocal serve {source} for the measurement")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        text = ""
        for line in process.stdout:
            text += line
            if line.startswith("}"):
                break
        if not text.strip():
            _, stderr = process.communicate(timeout=30)
            error = next((line for line in stderr.splitlines() if line.startswith("error: ")), stderr.strip()[-300:])
            raise EngineFailed(f"tierlocal serve {source} did not start: {error.removeprefix('error: ')}", hint="run it alone to see why")
        return measure(ServeState.from_json(json.loads(text)))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def _render_users(run: UsersRun) -> None:
    out = console()
    estimated = {int(row["users"]): row for row in run.estimate if isinstance(row.get("users"), int)}  # type: ignore[call-overload]
    title = f"{run.model} on {run.device}: users at once, {run.slots} slot(s), {run.prompt_tokens}-token prompts, {run.tokens} tokens each"
    table = Table(title=title, title_justify="left")
    for column in ("users", "each, tok/s", "estimated", "all, tok/s", "estimated", "first token p50", "estimated", "p95"):
        table.add_column(column, justify="right")
    for point in run.points:
        row = estimated.get(point.users, {})
        table.add_row(
            str(point.users),
            f"{point.per_user_decode_tokens_per_s:,.1f}",
            _number(row.get("per_user_decode_tokens_per_s"), "{:,.1f}"),
            f"{point.aggregate_decode_tokens_per_s:,.1f}",
            _number(row.get("aggregate_decode_tokens_per_s"), "{:,.1f}"),
            f"{point.first_token_quantile(0.5):,.2f} s",
            _number(row.get("first_token_p50_s"), "{:,.2f} s"),
            f"{point.first_token_quantile(0.95):,.2f} s",
        )
    out.print(table)
    if run.estimate and run.estimate[0].get("prompt_tokens") != run.prompt_tokens:
        out.print(f"The plan's estimate is for {run.estimate[0].get('prompt_tokens')}-token prompts.")
    out.print(f"Recorded in {bench_path()}: `tierlocal check` shows it for this model, engine build and device.")


def _number(value: object, form: str) -> str:
    return form.format(value) if isinstance(value, int | float) else "-"


def _render(run: BenchRun) -> None:
    out = console()
    calibrated = run.calibrated or {}
    first_token = calibrated.get("first_token_s") if isinstance(calibrated.get("first_token_s"), dict) else {}
    assert isinstance(first_token, dict)
    table = Table(title=f"{run.model} on {run.device} ({run.engine_version})", title_justify="left")
    for column in ("prompt tokens", "prefill tok/s", "decode tok/s", "first token", "first token, estimated"):
        table.add_column(column, justify="right")
    for prompt in run.runs:
        estimated = first_token.get(str(prompt.prompt_tokens))
        table.add_row(
            str(prompt.prompt_tokens),
            f"{prompt.prefill_tokens_per_s:,.1f}",
            f"{prompt.decode_tokens_per_s:,.1f}",
            f"{prompt.first_token_s:.2f} s",
            f"{estimated:.2f} s" if isinstance(estimated, int | float) else "-",
        )
    out.print(table)
    estimate = run.bound_decode_tokens_per_s
    bound = f"; the memory-bandwidth bound says {estimate:,.1f} ({estimate / run.decode_tokens_per_s:.1f}× the measured)" if estimate else ""
    decode, prefill = calibrated.get("decode_tokens_per_s"), calibrated.get("prefill_tokens_per_s")
    if isinstance(decode, int | float) and isinstance(prefill, int | float):
        out.print(
            f"Decode: {run.decode_tokens_per_s:,.1f} tok/s measured, {decode:,.1f} estimated ({decode / run.decode_tokens_per_s:.2f}×){bound}. "
            f"Prefill: {run.prefill_tokens_per_s:,.1f} tok/s measured, {prefill:,.1f} estimated at 512 tokens "
            f"({prefill / run.prefill_tokens_per_s:.2f}×)."
        )
    else:
        out.print(
            f"Decode: {run.decode_tokens_per_s:,.1f} tok/s measured{bound}. Prefill: {run.prefill_tokens_per_s:,.1f} tok/s measured "
            "(no estimate from the devices' figures: `tierlocal hw --calibrate` times this CPU)."
        )
    memory = ", ".join(f"{name} {format_bytes(size)} allocated" for name, size in run.device_bytes.items())
    peak = f"host peak (VmHWM) {format_bytes(run.host_peak_bytes)}; " if run.host_peak_bytes else ""
    out.print(f"Memory: {peak}{memory}.")
    out.print(f"Recorded in {bench_path()}: `tierlocal check` shows it for this model, engine build and device.")

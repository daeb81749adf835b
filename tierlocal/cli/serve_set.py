"""``tierlocal serve A B C`` and ``serve --set FILE``: a model set planned together and served on
one endpoint (:mod:`tierlocal.serve.set_run`)."""

from __future__ import annotations

import itertools
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from .. import constants
from ..errors import UsageError
from ..fit.estimate import RunRequest
from ..plan.inputs import PlanAsk
from ..plan.source import parse_ctx, parse_parallel
from ..resolve import resolve_model
from ..serve.exposure import check_exposure
from ..serve.port import check_port_free
from ..serve.set_plan import plan_model_set

if TYPE_CHECKING:
    from ..serve.set_run import SetServe
from ..units import format_bytes
from .common import machine, print_json

__all__ = ["serve_set"]

#: How long one member's load may take by default (seconds): its serve's own bound is longer for big files.
DEFAULT_MEMBER_LOAD_S = 600.0


def set_sources(source: str | None, engine_args: tuple[str, ...]) -> tuple[str, ...]:
    """The sources of a quick set (``serve A B C``): the words after SOURCE up to the first
    option, which click hands over with the llama-server options; () for one model."""
    more = tuple(itertools.takewhile(lambda arg: not arg.startswith("-"), engine_args))
    return (*((source,) if source else ()), *more) if more else ()


def serve_set(
    source: str | None,
    engine_args: tuple[str, ...],
    set_file: str | None,
    served: dict[str, Any],
    *,
    engine: str,
    ram: str | None,
    pull: bool,
    load_timeout: float | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Plan the set, then serve it until SIGTERM or Ctrl-C (exit code on failure)."""
    more = set_sources(source, engine_args)
    sources = more or ((source,) if source else ())
    if engine != "llama-server" or engine_args[max(len(more) - 1, 0) :]:
        raise UsageError("a set is served with llama-server, with no options after --", hint="drop --engine and the options after --")
    if served.get("role", "chat") != "chat":
        raise UsageError("a set gives each member its role in its set file", hint='role = "embeddings" in the member\'s [[model]] table')
    ask = set_ask(served)
    hardware = machine(served["gpus"], ram)
    check_port_free(served["host"], served["port"])
    key_file = check_exposure(served["host"], served["api_key_file"])
    local = lambda source: resolve_model(source, pull=pull, say=_say, hardware=lambda: hardware)  # noqa: E731
    plan, settings = plan_model_set(sources, set_file, hardware, ask, local=local)
    options: list[str] = []
    for gpu in served["gpus"]:
        options += ["--gpu", gpu]
    options += ["--llama-server", served["llama_server"]] if served.get("llama_server") else []
    options += ["--threads", str(threads)] if threads else []
    options += ["--load-timeout", str(load_timeout)] if load_timeout else []
    from ..serve.set_run import SetServe, read_keys, run_set  # the endpoint's server loads only when a set is served

    how = SetServe(served["host"], served["port"], read_keys(key_file), tuple(options), load_timeout or DEFAULT_MEMBER_LOAD_S)
    code = run_set(plan, settings, how, say=_say, on_ready=lambda snapshot: _ready(snapshot, how, as_json))
    if code:
        sys.exit(code)


def set_ask(served: dict[str, Any]) -> PlanAsk:
    """What a set asks of each member where its set file says nothing: serve's options.

    Raises:
        UsageError: an option that is for one model (--mmproj, --chat-template).
    """
    for option, value in (("--mmproj", served.get("mmproj")), ("--chat-template", served.get("chat_template"))):
        if value is not None:
            raise UsageError(f"{option} is for one model, not a set", hint="serve that model alone, or leave the option out")
    users = served["users"]
    request = RunRequest(
        ngl=served["ngl"],
        n_cpu_moe=served["n_cpu_moe"],
        cache_type_k=served["cache_type_k"],
        cache_type_v=served["cache_type_v"],
        flash_attn=served["flash_attn"] != "off",
        n_ubatch=served["ubatch"],
        kv_unified=True if users and users > 1 else None,
    )
    ctx = served["ctx"]
    parallel_given = click.get_current_context().get_parameter_source("parallel") is not click.core.ParameterSource.DEFAULT
    slots = parse_parallel(str(users) if users and not parallel_given else served["parallel"])
    ask = PlanAsk(
        parse_ctx(ctx) if ctx is not None else constants.DEFAULT_CTX, slots, request, users, up_to_training=ctx is None, cap_at_training=True
    )
    return ask


def _ready(snapshot: dict[str, Any], how: SetServe, as_json: bool) -> None:
    if as_json:
        print_json({"url": f"http://{how.host}:{how.port}", "pid": os.getpid(), **snapshot})
        sys.stdout.flush()
        return
    click.echo(f"serving a set of {len(snapshot['members'])} models at http://{how.host}:{how.port}/v1 (the request's model chooses)")
    for member in snapshot["members"]:
        planned = ", ".join(f"{d} {format_bytes(b)}" for d, b in zip(snapshot["devices"], member["planned_bytes"], strict=True))
        click.echo(f"  {member['name']}: {member['state']}{' (pinned)' if member['pinned'] else ''}, plans {planned}")


def _say(message: str) -> None:
    click.echo(message, err=True)


def render_sets(sets: list[dict[str, Any]], *, as_json: bool) -> None:
    """``tierlocal status`` of served model sets: the one object with ``--json`` (``--port``), else
    a line per member."""
    if as_json:
        print_json(sets[0])
        return
    for state in sets:
        devices = list(state.get("devices") or [])
        held = ", ".join(f"{d} {format_bytes(b)}" for d, b in zip(devices, state.get("resident_bytes") or [], strict=False))
        budget = ", ".join(f"{d} {format_bytes(b)}" for d, b in zip(devices, state.get("budget_bytes") or [], strict=False))
        click.echo(f"model set at {state.get('url')} (pid {state.get('pid')}): resident {held} of {budget}")
        for member in state.get("members") or []:
            click.echo("  " + _member_line(member, devices))
        click.echo("")


def _member_line(member: dict[str, Any], devices: list[str]) -> str:
    planned = ", ".join(f"{d} {format_bytes(b)}" for d, b in zip(devices, member.get("planned_bytes") or [], strict=False))
    parts = [f"{member.get('name')}: {member.get('state')}{' (pinned)' if member.get('pinned') else ''}", f"plans {planned}"]
    if member.get("state") == "loaded":
        parts.append(f"{member.get('in_flight')} in flight, idle {member.get('idle_s')} s")
        if member.get("unloads_in_s") is not None:
            parts.append(f"unloads in {member.get('unloads_in_s')} s")
    parts.append(f"{member.get('loads')} load(s)")
    if member.get("error"):
        parts.append(f"last error: {member.get('error')}")
    return "; ".join(parts)

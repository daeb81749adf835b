"""The ``tierlocal gateway keys …`` and ``tierlocal usage`` commands."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from .. import constants
from ..errors import UsageError
from ..gateway.config import GatewayConfig, default_config, load_config, name_problem
from ..gateway.protocol import printable
from ..gateway.store import Store, open_store, store_label
from ..gateway.usage_report import PERIODS, usage_report
from ..units import format_usd
from .common import print_json

__all__ = ["gateway", "server_options", "usage"]

_F = TypeVar("_F", bound=Callable[..., Any])

_config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="The gateway's TOML file (default: the built-in configuration)."
)


def server_options(workers_default: str) -> Callable[[_F], _F]:
    """``--config``, ``--host``, ``--port`` and ``--workers``: one definition for `gateway` and
    `service install gateway` (``workers_default``: what each does without --workers)."""
    options = [
        _config_option,
        click.option("--host", help="Listen address (default: the config's, else 127.0.0.1); anything but loopback needs a gateway key."),
        click.option("--port", type=click.IntRange(1, 65535), help=f"Listen port (default: the config's, else {constants.GATEWAY_PORT})."),
        click.option(
            "--workers",
            type=click.IntRange(1, 256),
            default=None,
            help="Processes serving the port (SO_REUSEPORT), sharing keys, budgets, rate limits and usage through the store; "
            f"each keeps its own view of target health (default: {workers_default}).",
        ),
    ]

    def apply(command: _F) -> _F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def _config(path: Path | None) -> GatewayConfig:
    return load_config(path) if path is not None else default_config()


def _open_store(config: GatewayConfig) -> Store:
    """The gateway's store, refused when its directory belongs to another account (the
    service's): what this process wrote there (the database's journal, a lock) would be this
    account's, and the service could no longer write them.

    Raises:
        UsageError: the state directory is another account's.
    """
    state_dir = config.server.state_dir
    if config.server.redis_url_env is None and state_dir.is_dir() and (owner := state_dir.stat().st_uid) != os.geteuid():
        name = _account_name(owner)
        raise UsageError(
            f"{state_dir} belongs to {name}, not to you: the gateway running as {name} could not write what this command would write there",
            hint=f"run it as that account: sudo -u {name} tierlocal gateway …",
        )
    return open_store(config)


def _account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@click.group(invoke_without_command=True)
@server_options("1; `service install gateway`: the CPU cores")
@click.pass_context
def gateway(context: click.Context, config_path: Path | None, host: str | None, port: int | None, workers: int | None) -> None:
    """The OpenAI-compatible fallback gateway. Without a subcommand: serve in the foreground.

    Clients send a gateway key as their API key; each model id routes to its targets in order
    (local llama-server/Ollama, then a hosted API whose key the gateway holds). Without
    --config: kimi-k3 → Moonshot (key from MOONSHOT_API_KEY) plus every model a local
    llama-server (port 8080) or Ollama (11434) reports."""
    if context.invoked_subcommand is not None:
        return
    from ..gateway.runner import run_gateway

    config = _config(config_path)
    server = config.server
    config = replace(config, server=replace(server, host=host or server.host, port=port or server.port))
    run_gateway(config, discover=config_path is None, workers=workers or 1)


@gateway.command("agents")
@_config_option
@click.option("--model", help="The model id the agents ask for (default: the config's first route).")
@click.option("--json", "as_json", is_flag=True, help="Print each agent's environment and config lines as JSON.")
def agents(config_path: Path | None, model: str | None, as_json: bool) -> None:
    """What to set for Claude Code, Codex CLI and chat-completions agents to use this gateway."""
    import socket

    from ..gateway.agents_env import agent_setups

    config = _config(config_path)
    if model is None and not config.routes:
        raise UsageError(f"{config.source} has no [[routes]]", hint="add one, or name the model with --model")
    model = model or config.routes[0].model
    if config.route(model) is None:
        raise UsageError(f"the gateway has no route for {model!r}", hint=f"it serves: {', '.join(r.model for r in config.routes) or 'none'}")
    server = config.server
    host = server.host if server.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    scheme = "https" if server.tls_cert else "http"
    setups = agent_setups(f"{scheme}://{host}:{server.port}", model)
    if as_json:
        print_json({"model": model, "agents": [setup.to_json() for setup in setups]})
        return
    click.echo("\n".join(line for setup in setups for line in setup.lines()))
    click.echo("each developer gets a key of their own: tierlocal gateway keys add NAME", err=True)


@gateway.group()
def keys() -> None:
    """Gateway keys: clients send one as their API key; only its hash is stored."""


@keys.command("add")
@click.argument("name")
@_config_option
@click.option("--json", "as_json", is_flag=True, help='Print {"user", "key"}.')
def add_key(name: str, config_path: Path | None, as_json: bool) -> None:
    """Create a key for user NAME and print it — once: it cannot be shown again."""
    if problem := name_problem(name):
        raise UsageError(f"user name {problem}", hint="use letters, digits and punctuation")
    config = _config(config_path)
    if config.users and config.user(name) is None:
        raise UsageError(f"{config.source}: no [[users]] entry named {name!r}", hint="add one (with its limits and budget) first")
    store = _open_store(config)
    try:
        key = store.add_key(name)
    finally:
        store.close()
    if as_json:
        print_json({"user": name, "key": key})
    else:
        click.echo(key)
        click.echo(f"key for {name}: shown once; only its hash is stored in {config.server.state_dir}", err=True)
    if config.path is not None and config.user(name) is not None:
        click.echo(
            f"a gateway running with {config.path} reads its [[users]] again when the file changes: {name}'s limits and budget apply "
            "from the first request (routes, prices and [server] apply at a restart)",
            err=True,
        )
    elif config.path is not None:
        click.echo(f"{config.path} names no [[users]]: {name} has no limits and no budget until it does", err=True)


@keys.command("list")
@_config_option
@click.option("--json", "as_json", is_flag=True)
def list_keys(config_path: Path | None, as_json: bool) -> None:
    """Keys by user, with the first characters of each (never the key)."""
    config = _config(config_path)
    store = _open_store(config)
    try:
        infos = store.list_keys()
    finally:
        store.close()
    if as_json:
        print_json([info.to_json() for info in infos])
        return
    for info in infos:
        state = "revoked" if info.revoked else "live"
        click.echo(f"{printable(info.user):20} {info.shown_prefix}…  {time.strftime('%Y-%m-%d %H:%M', time.gmtime(info.created))} UTC  {state}")


@keys.command("revoke")
@click.argument("user_or_prefix")
@_config_option
def revoke_key(user_or_prefix: str, config_path: Path | None) -> None:
    """Revoke every key of a user, or the one whose shown prefix is given."""
    config = _config(config_path)
    store = _open_store(config)
    try:
        count = store.revoke(user_or_prefix)
    finally:
        store.close()
    if not count:
        raise UsageError(f"no live key for {user_or_prefix!r}", hint="see `tierlocal gateway keys list`")
    click.echo(f"revoked {count} key(s)")


@click.command()
@_config_option
@click.option(
    "--period",
    type=click.Choice(PERIODS),
    default="month",
    show_default=True,
    help="From the start of the current day/week/month (UTC), or everything.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {period, since, users, models, targets, by_tier, clusters, local, budgets, break_even}.")
def usage(config_path: Path | None, period: str, as_json: bool) -> None:
    """Requests, tokens (prompt, cached, completion) and spend per user and per model, and for a
    hosted frontier model (Kimi K3) whether renting its cluster would be cheaper at this volume."""
    config = _config(config_path)
    where = store_label(config)
    if config.path is None and config.server.redis_url_env is None and not (config.server.state_dir / "gateway.sqlite3").is_file():
        raise UsageError(
            f"no gateway has kept usage in {where} (the built-in configuration's store, for this account's TIERLOCAL_HOME)",
            hint="give the running gateway's config: tierlocal usage --config FILE",
        )
    store = _open_store(config)
    try:
        report = usage_report(config, store, period)
    finally:
        store.close()
    if as_json:
        print_json({"store": where, **report})
        return
    click.echo(f"usage from {where} ({config.source}), this {period}" if period != "all" else f"usage from {where} ({config.source}), all of it")
    _render_usage(report)


def _render_usage(report: dict[str, Any]) -> None:
    for label in ("users", "models", "protocols"):
        click.echo(f"{label}:")
        for name, row in report.get(label, {}).items():
            click.echo(
                f"  {printable(name):24} {row['requests']:>6} requests  {row['prompt_tokens']:>9} in ({row['cached_tokens']} cached)  "
                f"{row['completion_tokens']:>9} out  {format_usd(row['cost_usd'])}"
            )
    for tier, row in report["by_tier"].items():
        label = f"tier {tier} ({row['name']})" if tier != "none" else row["name"]
        click.echo(f"{label}: {row['requests']} requests, {row['prompt_tokens'] + row['completion_tokens']} tokens, {format_usd(row['cost_usd'])}")
    for label, cluster in report["clusters"].items():
        click.echo(_cluster_line(label, cluster))
    for label, local in report["local"].items():
        click.echo(_local_line(label, local))
    for name, budget in report["budgets"].items():
        click.echo(
            f"budget {printable(name)}: {format_usd(budget['spent_usd'])} of {format_usd(budget['budget_usd'])} this {budget['budget_period']}"
        )
    for model, verdict in report["break_even"].items():
        click.echo(
            f"{model}: at the measured volume (~{verdict['tokens_per_month']:,.0f} tokens/month) the API costs "
            f"${verdict['api_usd_per_month']:,.2f}/month;"
            f" renting {verdict['rent']} costs ${verdict['rent_usd_per_month']:,.0f}/month — "
            f"{'the API' if verdict['cheaper'] == 'api' else 'renting'} is cheaper"
            f" (break-even ~{verdict['break_even_tokens_per_month']:,.0f} tokens/month)"
        )


def _local_line(label: str, local: dict[str, Any]) -> str:
    """One local engine's tokens this period at the API price of its route."""
    tokens = local["prompt_tokens"] + local["completion_tokens"]
    line = f"local {printable(label)}: {tokens:,} tokens ({local['requests']} requests)"
    if local["api_usd"] is None:
        return line + f"; no API price for {printable(local['api_model'])} to compare with"
    return line + f" would have cost {format_usd(local['api_usd'])} on {printable(local['api_model'])}'s API"


def _cluster_line(label: str, cluster: dict[str, Any]) -> str:
    """One tier-1 cluster's cost over the period against the API price of the tokens it served."""
    line = (
        f"cluster {printable(label)}: {cluster['hours']:.1f} h at ${cluster['usd_per_hour']:,.2f}/h = {format_usd(cluster['cluster_usd'])}"
        f" for {cluster['tokens']:,} tokens ({cluster['requests']} requests)"
    )
    if cluster["api_usd"] is None:
        return line + "; no API price for this route to compare with"
    cheaper = "the cluster" if cluster["cheaper"] == "cluster" else "the API"
    even = cluster["break_even_tokens_per_hour"]
    return (
        line
        + f"; the API would have cost {format_usd(cluster['api_usd'])}: {cheaper} was cheaper"
        + (f" (break-even ~{even:,} tokens/hour)" if even else "")
    )

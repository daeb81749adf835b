"""``tierlocal service install serve --set FILE``: one unit that serves a model set, its
memory limits from the joint plan; and writing a serve unit, for one model or a set."""

from __future__ import annotations

import pwd
from pathlib import Path
from typing import Any

import click

from ..engines.llama_server import find_llama_server, llama_server_missing
from ..errors import UsageError
from ..resolve import resolve_model
from ..serve.exposure import check_exposure, is_loopback
from ..serve.set_plan import plan_model_set
from ..serve.systemd import SUPERVISOR_BYTES, ServeUnit, memory_limits, render_serve_unit, write_unit
from ..serve.unit_access import Needed
from .common import machine, serve_argv, serve_options_from
from .serve_set import set_ask
from .service_access import check_access, runtime_files

__all__ = ["install_set", "emit_serve_unit"]


def install_set(set_file: Path, served: dict[str, Any], *, user: str, directory: Path, dry_run: bool, skip_access_check: bool) -> None:
    """Write tierlocal-serve.service for the set in ``set_file`` (its members already pulled).

    Raises:
        UsageError: the set does not fit here, a member is not a local file yet, or --user could not reach a file.
    """
    hardware = machine(served["gpus"])
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    local = lambda source: resolve_model(source, pull=False, say=say, pull_option=False).resolve()  # noqa: E731
    plan, _settings = plan_model_set((), str(set_file), hardware, set_ask(served), local=local)
    if not plan.fits:
        missing = "; ".join(f"{m.member.name}: {m.reason}" for m in plan.members if not m.fits)
        raise UsageError(f"the set does not fit this machine ({missing})", hint=f"see `tierlocal check --set {set_file}`")
    binary = find_llama_server(served["llama_server"])
    if binary is None:
        raise llama_server_missing(served["llama_server"])
    key: Path | None = served["api_key_file"]
    if key is not None or not is_loopback(served["host"]):
        check_exposure(served["host"], key.resolve() if key else None)
    # Every member's default (--ctx, --parallel, --ngl, cache types …), as typed; resolved where the unit runs.
    args = ["--set", str(set_file.resolve()), "--llama-server", str(binary.resolve()), *serve_argv(serve_options_from(set_file, served))]
    if not skip_access_check:
        models = [Needed(f"the member {m.member.name}", Path(m.member.source)) for m in plan.members]
        check_access(
            user, [*runtime_files(), Needed("llama-server", binary.resolve(), execute=True), Needed("the set file", set_file.resolve()), *models]
        )
    # The cgroup holds the largest resident group's engines, a tierlocal serve for each, and their prompt caches.
    held = max(plan.resident_bytes(group)[-1] for group in plan.resident_groups)
    most = max(len(group) for group in plan.resident_groups)
    memory = memory_limits(held + SUPERVISOR_BYTES * most, plan.members[0].cache_ram_bytes * most, hardware.ram_total_bytes)
    unit = ServeUnit(tuple(args), set_file.resolve(), user, key.resolve() if key else None, memory)
    emit_serve_unit(render_serve_unit(unit), directory, dry_run, user)


def emit_serve_unit(text: str, directory: Path, dry_run: bool, user: str) -> None:
    """Print the unit (``dry_run``) or write it to ``directory`` and say what to run next."""
    if dry_run:
        click.echo(text, nl=False)
        return
    path = write_unit(directory, "tierlocal-serve.service", text)
    click.echo(f"wrote {path}")
    try:
        pwd.getpwnam(user)
    except KeyError:
        click.echo(f"create the account first: useradd --system --home-dir /var/lib/tierlocal --shell /usr/sbin/nologin {user}", err=True)
    click.echo("then: systemctl daemon-reload && systemctl enable --now tierlocal-serve", err=True)

"""The ``tierlocal service`` commands: render and install systemd units."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from .. import constants
from ..engines.llama_server import find_llama_server, llama_server_missing
from ..errors import TierlocalError, UsageError
from ..gateway.config import GatewayConfig, default_config, load_config
from ..resolve import resolve_model
from ..serve.exposure import check_exposure, check_ollama_exposure, is_loopback
from ..serve.run import ServeOptions
from ..serve.systemd import (
    STATUS_PROPERTIES,
    UNIT_HOME,
    GatewayUnit,
    ServeUnit,
    describe_unit,
    memory_limits,
    parse_systemctl_show,
    render_gateway_unit,
    render_ollama_dropin,
    render_serve_unit,
    tierlocal_command,
    write_unit,
)
from ..serve.unit_access import Needed, hidden_by
from .common import ollama_port, print_json, serve_argv, serve_options, serve_options_from
from .gateway import server_options
from .service_access import GATEWAY_SANDBOX, STATE_FILES, check_access, path_arguments, runtime_files
from .service_set import emit_serve_unit, install_set

__all__ = ["service"]


@click.group()
def service() -> None:
    """systemd units for `tierlocal serve` and `tierlocal gateway`."""


@service.group()
def install() -> None:
    """Render a hardened unit into /etc/systemd/system (or --dir): serve MODEL, or gateway."""


@install.command("serve")
@click.argument("source", required=False)
@click.option(
    "--set", "set_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Serve the model set of a set file (docs/model-sets.md)."
)
@serve_options
@click.option(
    "--engine",
    type=click.Choice(["llama-server", "ollama"]),
    default="llama-server",
    show_default=True,
    help="ollama: write a drop-in for the installer's ollama.service instead of a unit.",
)
@click.option("--user", default="tierlocal", show_default=True, help="The account the service runs as.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("/etc/systemd/system"), show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the unit instead of writing it.")
@click.option(
    "--no-access-check",
    "skip_access_check",
    is_flag=True,
    help="Write the unit even when --user seems unable to reach a file it names (an ACL or a drop-in with BindReadOnlyPaths= the check cannot see).",
)
def install_serve(
    source: str | None,
    set_file: Path | None,
    engine: str,
    user: str,
    directory: Path,
    dry_run: bool,
    skip_access_check: bool,
    **served: Any,
) -> None:
    """Write tierlocal-serve.service for SOURCE (a GGUF file, or a catalog name or hf:// model
    already pulled): Type=notify (READY=1 once the load is verified), Restart=on-failure with
    start limits, KillMode=mixed, a dedicated user, ProtectSystem=strict, GPU device access, the
    key as a credential (never on a command line). Refused when --user could not reach the
    interpreter, tierlocal, the engine or the model under the unit's sandboxing. With --set FILE
    instead of SOURCE: one unit for the set (memory limits from its largest resident group)."""
    if set_file is not None and source is None and engine == "llama-server":
        return install_set(set_file, served, user=user, directory=directory, dry_run=dry_run, skip_access_check=skip_access_check)
    if source is None or set_file is not None:
        raise UsageError("give SOURCE, or --set FILE (a set is served by llama-server)", hint="tierlocal service install serve ./model.gguf")
    model = resolve_model(source, pull=False, say=lambda line: click.echo(line, err=True), pull_option=False).resolve()
    if not model.is_file():
        raise UsageError(f"{model}: no such model file", hint="give a GGUF file, or pull a catalog model first: tierlocal pull NAME")
    options = serve_options_from(model, served, engine=engine)
    if engine == "ollama":
        _install_ollama_dropin(options, directory, dry_run)
        return
    binary = find_llama_server(options.llama_server)
    if binary is None:
        raise llama_server_missing(options.llama_server)
    api_key_file = options.api_key_file
    if api_key_file is not None:
        check_exposure(options.host, api_key_file.resolve())
    elif not is_loopback(options.host):
        check_exposure(options.host, None)
    args = ["--llama-server", str(binary.resolve()), *serve_argv(options)]
    if not skip_access_check:
        check_access(
            user, [*runtime_files(), Needed("llama-server", binary.resolve(), execute=True), Needed("the model", model), *path_arguments(args)]
        )
    unit = ServeUnit((str(model), *args), model, user, api_key_file.resolve() if api_key_file else None, _memory_lines(options, binary))
    emit_serve_unit(render_serve_unit(unit), directory, dry_run, user)


def _memory_lines(options: ServeOptions, binary: Path) -> str:
    """MemoryHigh/MemoryMax from the plan on this machine, or a comment saying why not."""
    from ..serve.run import detected_machine, plan_for

    machine = detected_machine(options, llama_server=binary)
    try:
        check = plan_for(options, machine)
    except TierlocalError as exc:
        click.echo(f"note: no MemoryHigh/MemoryMax in the unit: the plan failed here ({exc})", err=True)
        return f"# No MemoryHigh/MemoryMax: the plan failed on the machine this unit was written on ({str(exc)[:120]})."
    memory = check.host_memory[0]  # mmap: llama-server's default load mode
    return memory_limits(memory.in_use_bytes, memory.grows_by_bytes, machine.host_total_bytes)


def _install_ollama_dropin(options: ServeOptions, directory: Path, dry_run: bool) -> None:
    """ollama.service.d/tierlocal.conf: the plan's server settings for the installer's unit,
    which every Ollama install overwrites (so tierlocal never edits it)."""
    from ..serve.ollama import plan_for_ollama

    check_ollama_exposure(options.host)
    options = replace(options, port=ollama_port(options.port))
    check = plan_for_ollama(options)
    assert check.ollama is not None
    host, port, model = options.host, options.port, options.model
    text = render_ollama_dropin(check.ollama, model, None if (host, port) == (constants.DEFAULT_HOST, constants.OLLAMA_PORT) else f"{host}:{port}")
    if dry_run:
        click.echo(text, nl=False)
        return
    path = write_unit(directory / "ollama.service.d", "tierlocal.conf", text)
    click.echo(f"wrote {path}")
    click.echo("then: systemctl daemon-reload && systemctl restart ollama, and load the model with `tierlocal serve MODEL --engine ollama`", err=True)


@install.command("gateway")
@server_options("this machine's CPU cores")
@click.option(
    "--credential",
    "credentials",
    multiple=True,
    metavar="NAME=FILE",
    help="Hand FILE to the service as credential NAME (an upstream key: name it like the config's api_key_env). Repeatable.",
)
@click.option("--user", default="tierlocal", show_default=True, help="The account the service runs as.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("/etc/systemd/system"), show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the unit instead of writing it.")
@click.option("--no-access-check", "skip_access_check", is_flag=True, help="Write the unit even when --user seems unable to reach a file it names.")
def install_gateway(
    config_path: Path | None,
    host: str | None,
    port: int | None,
    workers: int | None,
    credentials: tuple[str, ...],
    user: str,
    directory: Path,
    dry_run: bool,
    skip_access_check: bool,
) -> None:
    """Write tierlocal-gateway.service: Type=notify, Restart=on-failure, a dedicated user,
    ProtectSystem=strict with the state directory writable, PrivateDevices, and each upstream
    key as a LoadCredential= (never in the unit or on a command line)."""
    config = load_config(config_path.resolve()) if config_path is not None else default_config()
    pairs = _credential_files(credentials)
    needed = sorted({t.api_key_env or t.api_key_credential or "" for r in config.routes for t in r.targets if t.hosted} - {name for name, _ in pairs})
    args: list[str] = []
    if config_path is not None:
        args += ["--config", str(config_path.resolve())]
    if host:
        args += ["--host", host]
    if port:
        args += ["--port", str(port)]
    args += ["--workers", str(workers or os.cpu_count() or 1)]
    state_dir = _gateway_state_dir(config)
    if not skip_access_check:
        config_file = [Needed("the gateway's config", config_path.resolve())] if config_path is not None else []
        state = [
            Needed("the gateway's state directory", state_dir, execute=True, write=True),
            *(Needed(f"the gateway's {name}", state_dir / name, write=True) for name in STATE_FILES if (state_dir / name).exists()),
        ]
        check_access(user, [*runtime_files(), *config_file, *(state if state_dir.exists() else [])], GATEWAY_SANDBOX)
        if not state_dir.exists() and (hidden := hidden_by(state_dir, GATEWAY_SANDBOX)) is not None:
            raise UsageError(
                f"the gateway's state directory {state_dir}: {hidden[0]}", hint="give [server] state_dir outside /tmp and home directories"
            )
    text = render_gateway_unit(GatewayUnit(tuple(args), config_path, user, state_dir, tuple(pairs)))
    if needed:
        click.echo(f"note: no --credential for {', '.join(needed)}: those upstreams will be unreachable until the key is handed over", err=True)
    if dry_run:
        click.echo(text, nl=False)
        return
    _make_state_dir(state_dir, user)
    path = write_unit(directory, "tierlocal-gateway.service", text)
    click.echo(f"wrote {path}")
    keys = f"--config {config_path.resolve()}" if config_path is not None else ""
    click.echo(
        f"the service keeps keys and usage in {state_dir}; make keys as its account: sudo -u {user} "
        + (
            f"{' '.join(tierlocal_command())} gateway keys add NAME {keys}"
            if keys
            else f"env TIERLOCAL_HOME={UNIT_HOME} tierlocal gateway keys add NAME"
        ),
        err=True,
    )
    click.echo("then: systemctl daemon-reload && systemctl enable --now tierlocal-gateway", err=True)


def _credential_files(credentials: tuple[str, ...]) -> list[tuple[str, Path]]:
    """``--credential NAME=FILE`` as (name, absolute file) pairs.

    Raises:
        UsageError: one is not NAME=FILE, or its file does not exist.
    """
    pairs: list[tuple[str, Path]] = []
    for item in credentials:
        name, _, file = item.partition("=")
        if not name or not file or "/" in name:
            raise UsageError(f"--credential {item!r} is not NAME=FILE", hint="e.g. --credential MOONSHOT_API_KEY=/etc/tierlocal/moonshot.key")
        path = Path(file).resolve()
        if not path.is_file():
            raise UsageError(f"--credential {name}: {path} is not a file", hint="write the key into it (chmod 600) first")
        pairs.append((name, path))
    return pairs


def _gateway_state_dir(config: GatewayConfig) -> Path:
    """The one state directory the service and `tierlocal gateway keys add --config` (and
    `usage`) share: the config's state_dir, or the service's own under its TIERLOCAL_HOME.

    Raises:
        UsageError: the config names none, so the service and the commands run here would
            each keep a store of their own.
    """
    service_dir = config.server.state_dir if config.server.state_dir_named else UNIT_HOME / "gateway"
    if config.path is not None and service_dir != config.server.state_dir:
        raise UsageError(
            f"{config.path} names no [server] state_dir: the service would keep keys and usage in {service_dir}, "
            f"and `tierlocal gateway keys add --config` or `usage` run here in {config.server.state_dir}",
            hint=f'add state_dir = "{service_dir}" under [server], so both use one store',
        )
    return service_dir


def _make_state_dir(state_dir: Path, user: str) -> None:
    """Create the state directory (0700) owned by the service's account, so the unit's
    ReadWritePaths= names a directory that exists and that its account can write."""
    if state_dir.exists():
        return
    state_dir.mkdir(parents=True, mode=0o700)
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        click.echo(f"note: created {state_dir}; once the account {user} exists: chown {user}: {state_dir}", err=True)
        return
    try:
        os.chown(state_dir, account.pw_uid, account.pw_gid)
    except PermissionError:
        click.echo(f"note: created {state_dir}, and could not give it to {user}: chown {user}: {state_dir}", err=True)


@service.command("status")
@click.argument("what", type=click.Choice(["serve", "gateway"]), default="serve")
@click.option("--json", "as_json", is_flag=True, help="Print {unit, properties} as one JSON object.")
def status(what: str, as_json: bool) -> None:
    """What systemd says about tierlocal-serve.service (or -gateway): state, PID, restarts,
    and the STATUS= line tierlocal sends (`tierlocal status` has the plan and the load)."""
    unit = f"tierlocal-{what}.service"
    systemctl = shutil.which("systemctl", path=constants.search_path())
    if systemctl is None:
        raise UsageError("systemctl is not installed here", hint="`tierlocal status` reads the running server's state without systemd")
    try:
        shown = subprocess.run(
            [systemctl, "show", unit, "--no-pager", "--property=" + ",".join(STATUS_PROPERTIES)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(f"systemctl show {unit} did not answer in 30 s", hint="is systemd busy? try `systemctl status` yourself") from None
    if shown.returncode != 0:
        reason = (shown.stderr.strip().splitlines() or ["no output"])[0]
        raise UsageError(
            f"systemctl show {unit} failed: {reason}",
            hint="systemd must be running (PID 1); without it, `tierlocal status` reads the server's own state",
        )
    properties = parse_systemctl_show(shown.stdout)
    if properties.get("LoadState") == "not-found":
        raise UsageError(f"{unit} is not installed", hint=f"tierlocal service install {what} …, then systemctl daemon-reload")
    if as_json:
        print_json({"unit": unit, "properties": properties})
    else:
        click.echo(describe_unit(unit, properties))

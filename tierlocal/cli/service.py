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
from ..serve.exposure import check_exposure, check_ollama_exposure, is_loopback
from ..serve.run import ServeOptions
from ..serve.systemd import (
    STATUS_PROPERTIES,
    GatewayUnit,
    ServeUnit,
    describe_unit,
    memory_limits,
    parse_systemctl_show,
    render_gateway_unit,
    render_ollama_dropin,
    render_serve_unit,
    write_unit,
)
from .common import ollama_port, print_json, serve_argv, serve_options, serve_options_from

__all__ = ["service"]


@click.group()
def service() -> None:
    """systemd units for `tierlocal serve` and `tierlocal gateway`."""


@service.group()
def install() -> None:
    """Render a hardened unit into /etc/systemd/system (or --dir): serve MODEL, or gateway."""


@install.command("serve")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
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
def install_serve(
    model: Path,
    engine: str,
    user: str,
    directory: Path,
    dry_run: bool,
    **served: Any,
) -> None:
    """Write tierlocal-serve.service: Type=notify (READY=1 once the load is verified),
    Restart=on-failure with start limits, KillMode=mixed, a dedicated user, ProtectSystem=strict,
    GPU device access, the key as a credential (never on a command line)."""
    model = model.resolve()
    if not model.is_file():
        raise UsageError(f"{model}: no such model file", hint="pull it first: tierlocal pull …, then give its path")
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
    unit = ServeUnit((str(model), *args), model, user, api_key_file.resolve() if api_key_file else None, _memory_lines(options, binary))
    text = render_serve_unit(unit)
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
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="The gateway's TOML file (default: the built-in configuration).")
@click.option("--host", help="Listen address (any non-loopback address needs a gateway key).")
@click.option("--port", type=click.IntRange(1, 65535), help="Listen port.")
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=None,
    help="Gateway processes on the port (default: this machine's CPU cores; see `tierlocal gateway --workers`).",
)
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
def install_gateway(
    config_path: Path | None,
    host: str | None,
    port: int | None,
    workers: int | None,
    credentials: tuple[str, ...],
    user: str,
    directory: Path,
    dry_run: bool,
) -> None:
    """Write tierlocal-gateway.service: Type=notify, Restart=on-failure, a dedicated user,
    ProtectSystem=strict with the state directory writable, PrivateDevices, and each upstream
    key as a LoadCredential= (never in the unit or on a command line)."""
    from ..gateway.config import default_config, load_config

    config = load_config(config_path.resolve()) if config_path is not None else default_config()
    pairs: list[tuple[str, Path]] = []
    for item in credentials:
        name, _, file = item.partition("=")
        if not name or not file or "/" in name:
            raise UsageError(f"--credential {item!r} is not NAME=FILE", hint="e.g. --credential MOONSHOT_API_KEY=/etc/tierlocal/moonshot.key")
        path = Path(file).resolve()
        if not path.is_file():
            raise UsageError(f"--credential {name}: {path} is not a file", hint="write the key into it (chmod 600) first")
        pairs.append((name, path))
    needed = sorted({t.api_key_env or t.api_key_credential or "" for r in config.routes for t in r.targets if t.hosted} - {name for name, _ in pairs})
    args: list[str] = []
    if config_path is not None:
        args += ["--config", str(config_path.resolve())]
    if host:
        args += ["--host", host]
    if port:
        args += ["--port", str(port)]
    args += ["--workers", str(workers or os.cpu_count() or 1)]
    state_dir = config.server.state_dir if config_path is not None else Path("/var/lib/tierlocal/gateway")
    text = render_gateway_unit(GatewayUnit(tuple(args), config_path, user, state_dir, tuple(pairs)))
    if needed:
        click.echo(f"note: no --credential for {', '.join(needed)}: those upstreams will be unreachable until the key is handed over", err=True)
    if dry_run:
        click.echo(text, nl=False)
        return
    path = write_unit(directory, "tierlocal-gateway.service", text)
    click.echo(f"wrote {path}")
    click.echo("then: systemctl daemon-reload && systemctl enable --now tierlocal-gateway", err=True)


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
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UsageError(f"systemctl show {unit} did not answer in 30 s", hint="is systemd busy? try `systemctl status` yourself") from None
    if shown.returncode != 0:
        reason = (shown.stderr.strip().splitlines() or ["no output"])[0]
        raise UsageError(
            f"systemctl show {unit} failed: {reason}", hint="systemd must be running (PID 1); without it, `tierlocal status` reads the server's own state"
        )
    properties = parse_systemctl_show(shown.stdout)
    if properties.get("LoadState") == "not-found":
        raise UsageError(f"{unit} is not installed", hint=f"tierlocal service install {what} …, then systemctl daemon-reload")
    if as_json:
        print_json({"unit": unit, "properties": properties})
    else:
        click.echo(describe_unit(unit, properties))

"""The ``tierlocal service`` commands: render and install systemd units."""

from __future__ import annotations

import pwd
from pathlib import Path

import click

from ._cli_common import OLLAMA_DEFAULT_PORT, ollama_port, serve_options
from .engines.llama_server import find_llama_server
from .errors import UsageError
from .serve import check_exposure
from .service import ServeUnit, render_ollama_dropin, render_serve_unit, write_unit

__all__ = ["service"]


@click.group()
def service() -> None:
    """systemd units for `tierlocal serve` (and, later, the gateway)."""


@service.command("install")
@click.argument("what", type=click.Choice(["serve"]))
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@serve_options
@click.option("--engine", type=click.Choice(["llama-server", "ollama"]), default="llama-server", show_default=True, help="ollama: write a drop-in for the installer's ollama.service instead of a unit.")
@click.option("--user", default="tierlocal", show_default=True, help="The account the service runs as.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("/etc/systemd/system"), show_default=True)
@click.option("--dry-run", is_flag=True, help="Print the unit instead of writing it.")
def install(
    what: str,
    model: Path,
    llama_server: str | None,
    ctx: str,
    parallel: str,
    host: str,
    port: int,
    gpus: tuple[str, ...],
    api_key_file: Path | None,
    engine: str,
    user: str,
    directory: Path,
    dry_run: bool,
) -> None:
    """Write tierlocal-serve.service: Type=notify (READY=1 once the load is verified),
    Restart=on-failure with start limits, KillMode=mixed, a dedicated user, ProtectSystem=strict,
    GPU device access, the key as a credential (never on a command line)."""
    del what
    model = model.resolve()
    if not model.is_file():
        raise UsageError(f"{model}: no such model file", hint="pull it first: tierlocal pull …, then give its path")
    if engine == "ollama":
        _install_ollama_dropin(model, ctx, parallel, host, port, gpus, directory, dry_run)
        return
    binary = find_llama_server(llama_server)
    if binary is None:
        raise UsageError("no llama-server binary found", hint="pass --llama-server PATH")
    if api_key_file is not None:
        check_exposure(host, api_key_file.resolve())
    elif host not in ("127.0.0.1", "localhost", "::1"):
        check_exposure(host, None)
    args = ["--llama-server", str(binary.resolve()), "--ctx", ctx, "--parallel", parallel, "--host", host, "--port", str(port)]
    for gpu in gpus:
        args += ["--gpu", gpu]
    unit = ServeUnit((str(model), *args), model, user, api_key_file.resolve() if api_key_file else None)
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


def _install_ollama_dropin(model: Path, ctx: str, parallel: str, host: str, port: int, gpus: tuple[str, ...], directory: Path, dry_run: bool) -> None:
    """ollama.service.d/tierlocal.conf: the plan's server settings for the installer's unit,
    which every Ollama install overwrites (so tierlocal never edits it)."""
    from .serve_ollama import check_ollama_exposure, plan_for_ollama

    check_ollama_exposure(host)
    port = ollama_port(port)
    check = plan_for_ollama(model, gpus, ctx, parallel)
    text = render_ollama_dropin(check, model, None if (host, port) == ("127.0.0.1", OLLAMA_DEFAULT_PORT) else f"{host}:{port}")
    if dry_run:
        click.echo(text, nl=False)
        return
    path = write_unit(directory / "ollama.service.d", "tierlocal.conf", text)
    click.echo(f"wrote {path}")
    click.echo("then: systemctl daemon-reload && systemctl restart ollama, and load the model with `tierlocal serve MODEL --engine ollama`", err=True)

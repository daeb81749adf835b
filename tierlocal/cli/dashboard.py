"""``tierlocal dashboard``: the gateway's /ui pages on loopback when no gateway runs."""

from __future__ import annotations

from pathlib import Path

import click

from .. import constants
from ..errors import UsageError

__all__ = ["dashboard"]


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway's TOML file: its keys, users and usage (default: built-in).",
)
@click.option("--port", type=click.IntRange(1, 65535), default=constants.DASHBOARD_PORT, show_default=True, help="Port on 127.0.0.1.")
def dashboard(config_path: Path | None, port: int) -> None:
    """Open the dashboard on http://127.0.0.1:PORT/ui — the machine and the running serve's plan
    against its load, live slots and tokens/s, spend per user and the break-even — without a
    gateway. Loopback only; sign in with a gateway key (the gateway's store: `tierlocal gateway
    keys add NAME`, or the `local` key it writes to STATE_DIR/local.key when none exists)."""
    from aiohttp import web

    from ..gateway.config import default_config, load_config
    from ..gateway.runner import ensure_key
    from ..gateway.store import open_store
    from ..gateway.ui import dashboard_app

    config = load_config(config_path) if config_path is not None else default_config()
    store = open_store(config)
    try:
        ensure_key(config, store)
        app = dashboard_app(config, store)
        click.echo(f"dashboard on http://127.0.0.1:{port}/ui (sign in with a gateway key; Ctrl-C stops it)", err=True)
        try:
            web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)
        except OSError as exc:
            raise UsageError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}", hint="choose another --port, or stop what holds it") from None
    finally:
        store.close()

"""The ``tierlocal`` command: parse options, call the library, render a table or ``--json``.

One module per command group (check, inspect and hw, plan, pull, serve and status, service,
engine, gateway and usage), each imported only when its command runs. This package is the only
place that imports click or rich. A ``TierlocalError`` becomes one line (and a hint) on stderr
and its exit code; ``TIERLOCAL_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence
from typing import ClassVar

import click

from .. import __version__, constants
from ..errors import TierlocalError

__all__ = ["cli", "main"]


class _LazyGroup(click.Group):
    """Commands are imported when used, not at every start (huggingface_hub, ollama and gguf
    cost a second of imports together)."""

    lazy: ClassVar[dict[str, str]] = {
        "check": "tierlocal.cli.check:check",
        "inspect": "tierlocal.cli.inspect:inspect",
        "hw": "tierlocal.cli.inspect:hw",
        "plan": "tierlocal.cli.plan:plan",
        "pull": "tierlocal.cli.pull:pull",
        "serve": "tierlocal.cli.serve:serve",
        "status": "tierlocal.cli.serve:status",
        "bench": "tierlocal.cli.bench:bench",
        "service": "tierlocal.cli.service:service",
        "engine": "tierlocal.cli.engine:engine",
        "gateway": "tierlocal.cli.gateway:gateway",
        "usage": "tierlocal.cli.gateway:usage",
        "catalog": "tierlocal.cli.catalog:catalog",
        "dashboard": "tierlocal.cli.dashboard:dashboard",
        "ui": "tierlocal.cli.ui:ui",
        "search": "tierlocal.cli.search:search",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, _, attribute = self.lazy[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module_name), attribute)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tierlocal")
def cli() -> None:
    """What fits on one GPU, and how to serve it.

    Set TIERLOCAL_DEBUG=1 for tracebacks on errors.
    """


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the CLI; a TierlocalError becomes one line (and a hint) on stderr."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="tierlocal", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as exc:  # a bad option or argument: one line, like every other error
        command = exc.ctx.command_path if exc.ctx is not None else "tierlocal"
        click.echo(f"error: {exc.format_message()}", err=True)
        click.echo(f"hint: see '{command} --help'", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TierlocalError as exc:
        if constants.debug_enabled():
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)

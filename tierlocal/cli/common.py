"""What more than one command shares: options, the machine a command plans for, the one rich
console, and JSON output."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import click
from rich.console import Console

from .. import constants
from ..hardware.detect import detect
from ..hardware.override import with_gpu_override
from ..hardware.types import Hardware

__all__ = ["console", "print_json", "gpu_option", "json_option", "ngl_option", "ngl_text", "GpuLayers", "machine", "serve_options", "ollama_port", "PIPE_WIDTH"]

#: Columns of the tables when stdout is not a terminal (a pipe, a file, CI).
PIPE_WIDTH = 120


def console(*, stderr: bool = False) -> Console:
    """The console every human output goes through: the terminal's width on a terminal, else
    PIPE_WIDTH columns; no syntax highlighting of numbers and paths."""
    terminal = Console(highlight=False, stderr=stderr)
    return terminal if terminal.is_terminal else Console(highlight=False, width=PIPE_WIDTH, stderr=stderr)


def print_json(payload: object) -> None:
    """Print one JSON document on stdout (stable key order as built)."""
    print(json.dumps(payload, indent=2, ensure_ascii=False))


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")

gpu_option = click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME|SIZE",
    help='Plan for this GPU instead of detecting: a size (24GiB), a name from recipes/gpus.toml ("RTX 4090"), or N× either (2xH100). Repeatable.',
)


def machine(gpus: Sequence[str]) -> Hardware:
    """This machine as detected, or with the GPUs ``--gpu`` describes."""
    return with_gpu_override(detect(), gpus)


class GpuLayers(click.ParamType):
    """``--ngl`` as llama-server spells it: a number of layers, ``all``, or ``auto`` (as many as
    fit, planned: llama-server's default). Converts to the layer count, NGL_ALL, or None."""

    name = "N|all|auto"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return None
        if text == "all":
            return constants.NGL_ALL
        if text.isdigit() and int(text) <= 10_000:
            return int(text)
        self.fail(f"{value!r} is not a layer count: give 0 to 10000, 'all' or 'auto'", param, ctx)


def ngl_text(ngl: int | None) -> str:
    """``--ngl`` back as typed: ``auto``, ``all`` or the number (for a unit's command line)."""
    return "auto" if ngl is None else "all" if ngl == constants.NGL_ALL else str(ngl)


ngl_option = click.option(
    "--ngl",
    type=GpuLayers(),
    help="Layers on the GPU: a number, 'all', or 'auto' (the most that fit, planned; the default). The plan prints the number it resolves to.",
)

_F = TypeVar("_F", bound=Callable[..., object])


def serve_options(command: _F) -> _F:
    """The options `serve` and `service install serve` share (one definition, no drift)."""
    for option in reversed(
        [
            click.option(
                "--llama-server",
                "llama_server",
                metavar="PATH",
                help="The llama-server binary (default: $TIERLOCAL_LLAMA_SERVER, PATH, tierlocal's engine dir).",
            ),
            click.option("--ctx", default=str(constants.DEFAULT_CTX), show_default=True, help="Context tokens in all, or 'max' for the largest that fits."),
            click.option("--parallel", default="1", show_default=True, help="Slots (each gets ctx/parallel), 'auto' (4 sharing one KV) or 'max'."),
            click.option("--host", default=constants.DEFAULT_HOST, show_default=True, help="Address to bind; anything but loopback needs --api-key-file."),
            click.option("--port", type=click.IntRange(1, 65535), default=constants.LLAMA_SERVER_PORT, show_default=True),
            gpu_option,
            ngl_option,
            click.option(
                "--api-key-file",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Keys clients must send (one per line, mode 0600); passed to llama-server by file, never on its command line.",
            ),
            click.option(
                "--chat-template",
                "chat_template",
                metavar="NAME|FILE",
                help="The prompt format: one of llama-server's built-in templates (gemma, llama3, chatml, … see llama-server --help) or a Jinja "
                "file. Default: the model's own; without one, the built-in for its architecture.",
            ),
        ]
    ):
        command = option(command)
    return command


def ollama_port(port: int) -> int:
    """``--port`` for the Ollama engine: Ollama's own port unless the user gave one (the
    option's default is llama-server's)."""
    if click.get_current_context().get_parameter_source("port") == click.core.ParameterSource.DEFAULT:
        return constants.OLLAMA_PORT
    return port

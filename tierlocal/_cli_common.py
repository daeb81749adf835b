"""Options and helpers shared by more than one command."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import click

from .hardware import Hardware, detect, with_gpu_override

__all__ = ["DEFAULT_CTX", "DEFAULT_MIN_TOKENS_PER_S", "gpu_option", "machine", "serve_options", "ollama_port"]

#: Context tokens per slot the catalog recommendation plans for.
DEFAULT_CTX = 8192
#: Slowest decode speed (tokens/s) the catalog recommendation accepts.
DEFAULT_MIN_TOKENS_PER_S = 5.0

gpu_option = click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME|SIZE",
    help="Plan for this GPU instead of detecting: a size (24GiB), a name from recipes/gpus.toml (\"RTX 4090\"), or N× either (2xH100). Repeatable.",
)


def machine(gpus: Sequence[str]) -> Hardware:
    """This machine as detected, or with the GPUs ``--gpu`` describes."""
    return with_gpu_override(detect(), gpus)


_F = TypeVar("_F", bound=Callable[..., object])


def serve_options(command: _F) -> _F:
    """The options `serve` and `service install serve` share (one definition, no drift)."""
    for option in reversed(
        [
            click.option("--llama-server", "llama_server", metavar="PATH", help="The llama-server binary (default: $TIERLOCAL_LLAMA_SERVER, PATH, tierlocal's engine dir)."),
            click.option("--ctx", default="8192", show_default=True, help="Context tokens in all, or 'max' for the largest that fits."),
            click.option("--parallel", default="1", show_default=True, help="Slots (each gets ctx/parallel), 'auto' (4 sharing one KV) or 'max'."),
            click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; anything but loopback needs --api-key-file."),
            click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True),
            gpu_option,
            click.option(
                "--api-key-file",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Keys clients must send (one per line, mode 0600); passed to llama-server by file, never on its command line.",
            ),
        ]
    ):
        command = option(command)
    return command


#: Ollama's own port.
OLLAMA_DEFAULT_PORT = 11434


def ollama_port(port: int) -> int:
    """``--port`` for the Ollama engine: Ollama's own port unless the user gave one (the
    option's default is llama-server's)."""
    if click.get_current_context().get_parameter_source("port") == click.core.ParameterSource.DEFAULT:
        return OLLAMA_DEFAULT_PORT
    return port

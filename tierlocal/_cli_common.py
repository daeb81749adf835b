"""Options and helpers shared by more than one command."""

from __future__ import annotations

from collections.abc import Sequence

import click

from .hardware import Hardware, detect, with_gpu_override

__all__ = ["DEFAULT_CTX", "DEFAULT_MIN_TOKENS_PER_S", "gpu_option", "machine"]

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

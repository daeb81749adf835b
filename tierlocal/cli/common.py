"""What more than one command shares: options, the machine a command plans for, the one rich
console, and JSON output."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from .. import constants
from ..hardware.detect import detect
from ..hardware.override import with_gpu_override, with_ram_override
from ..hardware.types import Hardware

if TYPE_CHECKING:
    from ..fit.projector import ProjectorSpec
    from ..serve.run import ServeOptions

__all__ = [
    "console",
    "print_json",
    "gpu_option",
    "json_option",
    "ngl_option",
    "ngl_text",
    "GpuLayers",
    "machine",
    "ram_options",
    "planning_options",
    "serve_options",
    "ollama_port",
    "PIPE_WIDTH",
]

#: Columns of the tables when stdout is not a terminal (a pipe, a file, CI).
PIPE_WIDTH = 120


#: Below this many columns (an 80-column SSH session) the wide tables use a compact layout.
COMPACT_WIDTH = 110


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


def read_projector(source: str) -> ProjectorSpec:
    """``--mmproj``'s projector (header only); a UsageError for a file that is not one."""
    from ..serve.run import read_projector as read

    return read(source)


def machine(gpus: Sequence[str], ram: str | None = None, ram_bandwidth: str | None = None) -> Hardware:
    """This machine as detected, or with the GPUs ``--gpu`` and the memory ``--ram`` /
    ``--ram-bandwidth`` describe."""
    return with_ram_override(with_gpu_override(detect(), gpus), ram, ram_bandwidth)


def ram_options(command: _F) -> _F:
    """``--ram`` and ``--ram-bandwidth``: plan another machine's system memory."""
    command = click.option(
        "--ram-bandwidth",
        "ram_bandwidth",
        metavar="RATE",
        help="That RAM's bandwidth (80GB/s); default: the planning assumption in recipes/gpus.toml [host].",
    )(command)
    return click.option(
        "--ram",
        metavar="SIZE",
        help="Plan for this much system RAM (32GiB) instead of what is available here: a VPS, or another machine; this CPU's calibration is then "
        "not used.",
    )(command)


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


def planning_options(command: _F) -> _F:
    """The options that change the plan's memory, as `check` and `serve` take them."""
    for option in reversed(
        [
            click.option(
                "--n-cpu-moe", type=click.IntRange(0, 10_000), help="MoE: keep the experts of the first N blocks on the CPU (default: planned)."
            ),
            click.option("--cache-type-k", default="f16", show_default=True, help="KV cache type for K (f16, q8_0, q4_0 ...)."),
            click.option("--cache-type-v", default="f16", show_default=True, help="KV cache type for V."),
            click.option(
                "--flash-attn",
                type=click.Choice(["on", "off", "auto"]),
                default="auto",
                show_default=True,
                help="Flash attention (auto = on, as llama-server decides on CPU and GPU).",
            ),
            click.option(
                "--ubatch", type=click.IntRange(1, 65536), default=constants.DEFAULT_UBATCH, show_default=True, help="Physical batch size (-ub)."
            ),
        ]
    ):
        command = option(command)
    return command


role_option = click.option(
    "--role",
    type=click.Choice(("chat", "code", "embeddings", "rerank")),
    default="chat",
    show_default=True,
    help="What the model serves: chat (or code); embeddings (/v1/embeddings, llama-server's --embeddings) or rerank (/v1/rerank, --reranking), "
    "planned with every token of a micro-batch as an output, as llama-server runs them.",
)


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
            click.option(
                "--ctx",
                show_default=f"{constants.DEFAULT_CTX}, or the model's trained context if shorter",
                help="Context tokens per slot (llama-server's -c is that × --parallel), or 'max' for the most that fit.",
            ),
            click.option(
                "--parallel",
                default="1",
                show_default=True,
                help="Slots, each with --ctx tokens of its own; 'auto' (4 sharing one KV of --ctx) or 'max'.",
            ),
            click.option(
                "--users",
                type=click.IntRange(1, 256),
                help="Users at once to plan for: that many slots (unless --parallel says otherwise) sharing one KV cache (-kvu, so every "
                "user's token is in each step), and each user's speed in the plan.",
            ),
            click.option(
                "--host", default=constants.DEFAULT_HOST, show_default=True, help="Address to bind; anything but loopback needs --api-key-file."
            ),
            click.option("--port", type=click.IntRange(1, 65535), default=constants.LLAMA_SERVER_PORT, show_default=True),
            gpu_option,
            ngl_option,
            click.option(
                "--api-key-file",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Keys clients must send (one per line, mode 0600); passed to llama-server by file, never on its command line.",
            ),
            click.option(
                "--mmproj",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="A multimodal projector (mmproj GGUF) to load beside the model: planned on the device llama-server puts it on, passed as "
                "--mmproj.",
            ),
            click.option(
                "--chat-template",
                "chat_template",
                metavar="NAME|FILE",
                help="The prompt format: one of llama-server's built-in templates (gemma, llama3, chatml, … see llama-server --help) or a Jinja "
                "file. Default: the model's own; without one, the built-in for its architecture.",
            ),
            role_option,
        ]
    ):
        command = option(command)
    return planning_options(command)


def ollama_port(port: int) -> int:
    """``--port`` for the Ollama engine: Ollama's own port unless the user gave one (the
    option's default is llama-server's)."""
    if click.get_current_context().get_parameter_source("port") == click.core.ParameterSource.DEFAULT:
        return constants.OLLAMA_PORT
    return port


#: The click parameters :func:`serve_options` adds, by the ServeOptions field they fill.
SERVE_OPTION_FIELDS = (
    "llama_server",
    "ctx",
    "parallel",
    "users",
    "host",
    "port",
    "gpus",
    "ngl",
    "api_key_file",
    "chat_template",
    "n_cpu_moe",
    "cache_type_k",
    "cache_type_v",
    "flash_attn",
    "ubatch",
    "mmproj",
    "role",
)


def serve_options_from(model: Path, served: dict[str, Any], **more: Any) -> ServeOptions:
    """ServeOptions for ``model`` from :func:`serve_options`' parameters (``served``) and the
    command's own (``more``)."""
    from ..serve.run import ServeOptions

    return ServeOptions(model=model, **{name: served[name] for name in SERVE_OPTION_FIELDS}, **more)


def serve_argv(options: ServeOptions) -> list[str]:
    """The serve options back as `tierlocal serve` takes them, defaults left out (a unit's
    command line): ``--ngl`` as typed, a template file by its absolute path."""
    args = [
        *(["--ctx", options.ctx] if options.ctx is not None else []),
        "--parallel",
        options.parallel,
        *(["--users", str(options.users)] if options.users else []),
        "--host",
        options.host,
        "--port",
        str(options.port),
    ]
    for gpu in options.gpus:
        args += ["--gpu", gpu]
    args += ["--ngl", ngl_text(options.ngl)] if options.ngl is not None else []  # resolved where the service starts
    if options.chat_template is not None:
        template = Path(options.chat_template)
        args += ["--chat-template", str(template.resolve()) if template.is_file() else options.chat_template]
    args += ["--n-cpu-moe", str(options.n_cpu_moe)] if options.n_cpu_moe is not None else []
    args += ["--cache-type-k", options.cache_type_k] if options.cache_type_k != "f16" else []
    args += ["--cache-type-v", options.cache_type_v] if options.cache_type_v != "f16" else []
    args += ["--flash-attn", options.flash_attn] if options.flash_attn != "auto" else []
    args += ["--ubatch", str(options.ubatch)] if options.ubatch != constants.DEFAULT_UBATCH else []
    args += ["--mmproj", str(options.mmproj.resolve())] if options.mmproj is not None else []
    args += ["--role", options.role] if options.role != "chat" else []
    return args

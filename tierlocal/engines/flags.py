"""llama-server's command line, built once from a plan.

What a binary accepts is read from its ``--help`` (llama.cpp renames flags between releases:
``--no-mmap`` became ``--load-mode``, ``-fa`` took a value, ``--fit`` appeared);
:func:`tierlocal.engines.llama_server.read_engine_flags` runs it, :func:`parse_help` reads it.
Pure: no process is started here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from ..errors import EngineError, UsageError
from ..fit.estimate import RunEstimate
from ..fit.host_memory import PROMPT_CACHE_DEFAULT_BYTES

__all__ = [
    "EngineFlags",
    "parse_help",
    "server_args",
    "planned_command",
    "launch_argv",
    "check_engine_args",
    "role_flags",
    "reasoning_flags",
    "PLANNED_OPTIONS",
]

# "-fa,   --flash-attn [on|off|auto]   set ..." : an option, an optional argument after one
# space (a choice in braces may hold commas: "--rope-scaling {none,linear,yarn}"), then ", " and
# the next alias; the description starts after two or more spaces.
_ALIAS = re.compile(r"(-{1,2}[A-Za-z0-9][\w.-]*)(?: (?:\{[^}\s]*\}|[^\s,-][^\s,]*))?(?:,\s+|(?=\s{2,})|$)")
_VERSION = re.compile(r"version: (\S+) \(build (\d+), commit (\S+)\)")
# "--chat-template ... list of built-in templates:\n  bailing, chatml, ...\n  (env: ...)"
_BUILTINS = re.compile(r"list of built-in templates:\s*\n(?P<names>(?:\s+[\w.,\s-]+?\n)+?)\s+\(env:")


#: llama-server options the plan (or serve) sets, and the serve option to use instead.
PLANNED_OPTIONS = {
    **dict.fromkeys(("-m", "--model", "-hf", "--hf-repo", "-mu", "--model-url"), "SOURCE"),
    **dict.fromkeys(("-c", "--ctx-size"), "--ctx"),
    **dict.fromkeys(("-np", "--parallel", "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"), "--parallel"),
    **dict.fromkeys(("-ngl", "--gpu-layers", "--n-gpu-layers", "-dev", "--device", "--fit", "-fit", "-ts", "--tensor-split"), "--ngl / --gpu"),
    **dict.fromkeys(("-fa", "--flash-attn"), "--flash-attn"),
    **dict.fromkeys(("-ctk", "--cache-type-k"), "--cache-type-k"),
    **dict.fromkeys(("-ctv", "--cache-type-v"), "--cache-type-v"),
    **dict.fromkeys(("-ub", "--ubatch-size"), "--ubatch"),
    **dict.fromkeys(("-ncmoe", "--n-cpu-moe", "-cmoe", "--cpu-moe"), "--n-cpu-moe"),
    **dict.fromkeys(("--host", "--port", "--path"), "--host / --port"),
    **dict.fromkeys(("--api-key", "--api-key-file"), "--api-key-file"),
    **dict.fromkeys(("--chat-template", "--chat-template-file", "--jinja", "--no-jinja"), "--chat-template"),
    **dict.fromkeys(("-t", "--threads"), "--threads"),
    **dict.fromkeys(("-mm", "--mmproj", "--mmproj-offload", "--no-mmproj-offload"), "--mmproj"),
    **dict.fromkeys(("-lv", "--verbosity", "--log-verbosity"), "(tierlocal reads the load log at -lv 4)"),
}
#: Options that change memory in ways the plan does not model: passed on, with a warning.
UNPLANNED_MEMORY_OPTIONS = (
    "-nkvo",
    "--no-kv-offload",
    "-ot",
    "--override-tensor",
    "-sm",
    "--split-mode",
    "-mg",
    "--main-gpu",
    "-mmu",
    "--mmproj-url",
    "--lora",
    "--control-vector",
    "-md",
    "--model-draft",
    "-ctxcp",
    "--ctx-checkpoints",
)


@dataclass(frozen=True)
class EngineFlags:
    """The options one binary knows, its version string, and the built-in chat template names
    its ``--chat-template`` accepts (empty: the help lists none)."""

    options: frozenset[str]
    flash_attn_takes_value: bool
    version: str
    chat_templates: frozenset[str] = frozenset()

    def knows(self, option: str) -> bool:
        return option in self.options


def parse_help(help_text: str, version_text: str = "") -> EngineFlags:
    """Options from ``llama-server --help`` (each line that starts with ``-``, every alias)."""
    options: set[str] = set()
    flash_takes_value = False
    for line in help_text.splitlines():
        names = []
        position = 0
        while match := _ALIAS.match(line, position):
            names.append(match.group(1))
            position = match.end()
            if not line[match.end() - 1 : match.end()].isspace() and not line[position:].startswith("-"):
                break
        options.update(names)
        if "--flash-attn" in names and re.search(r"--flash-attn \[?on\|off", line):
            flash_takes_value = True
    version = _VERSION.search(version_text)
    builtins = _BUILTINS.search(help_text)
    template_names = frozenset(name for name in re.split(r"[,\s]+", builtins.group("names")) if name) if builtins else frozenset()
    return EngineFlags(
        frozenset(options), flash_takes_value, f"{version.group(1)}-b{version.group(2)}-{version.group(3)}" if version else "unknown", template_names
    )


def server_args(
    estimate: RunEstimate,
    *,
    host_only: bool = False,
    flash_attn_takes_value: bool = True,
    template_args: tuple[str, ...] = (),
    cache_ram_bytes: int | None = None,
) -> list[str]:
    """The planned options after ``-m MODEL``: context, ``-dev none`` for a CPU-only plan on a
    machine with a GPU, slots (none for llama-server's auto), layers (and each GPU's share, ``-ts``,
    when several hold them), flash attention (as
    ``-fa on|off``, or a bare ``-fa`` for binaries whose flag takes no value), experts on the
    CPU, cache types and micro-batch when not the defaults, the multimodal projector (with
    ``--no-mmproj-offload`` when it is planned in system RAM), the prompt cache's cap
    (``--cache-ram`` MiB, when the RAM left is less than llama-server's 8 GiB default), then the
    chat template's options (:class:`tierlocal.engines.prompt_formats.TemplateChoice`)."""
    request, params = estimate.request, estimate.params
    args = ["-c", str(params.n_ctx_padded)]
    args += ["-dev", "none"] if host_only else []
    args += ["-np", str(params.n_seq_max)] if not params.kv_unified or request.kv_unified else []
    args += ["-kvu"] if request.kv_unified and params.kv_unified else []
    args += ["-ngl", str(request.ngl)]
    args += ["-ts", ",".join(str(share) for share in estimate.tensor_split)] if estimate.tensor_split and not host_only else []
    if flash_attn_takes_value:
        args += ["-fa", "on" if request.flash_attn else "off"]
    elif request.flash_attn:
        args += ["-fa"]
    args += ["--n-cpu-moe", str(request.n_cpu_moe)] if request.n_cpu_moe else []
    if request.cache_type_k != "f16" or request.cache_type_v != "f16":
        args += ["-ctk", request.cache_type_k, "-ctv", request.cache_type_v]
    if request.n_ubatch != constants.DEFAULT_UBATCH:
        args += ["-ub", str(request.n_ubatch)]
    if request.projector is not None:
        source = request.projector.source
        args += ["--mmproj", "<mmproj path after download>" if source.startswith(("http://", "https://", "hf://")) else source]
        args += ["--no-mmproj-offload"] if estimate.projector is not None and not estimate.projector.on_gpu else []
    if cache_ram_bytes is not None and cache_ram_bytes < PROMPT_CACHE_DEFAULT_BYTES:
        args += ["--cache-ram", str(cache_ram_bytes // 2**20)]
    return args + list(template_args)


def role_flags(role: str | None, *, pooled: bool) -> tuple[str, ...]:
    """The llama-server options that make it serve ``role`` (``chat`` and ``code`` need none):
    ``--reranking``; ``--embeddings``, and for a file that names no pooling (``pooled`` false: a
    generation model's) ``--pooling mean``, since llama-server's OpenAI embeddings refuse none."""
    if role == "rerank":
        return ("--reranking",)
    if role != "embeddings":
        return ()
    return ("--embeddings",) if pooled else ("--embeddings", "--pooling", "mean")


def reasoning_flags(mode: str | None, *, effort: str | None = None, switch: bool = True) -> tuple[str, ...]:
    """The llama-server options that ask for ``mode``: thinking at an effort (``thinking-low``;
    ``thinking`` of a model whose thinking is at ``effort``) is ``--reasoning-effort LEVEL``,
    which the chat template reads as ``reasoning_effort`` (gpt-oss; its template's default is
    medium); for a model with both modes (``switch``) ``--reasoning on`` (``thinking``) or ``off``
    (``standard``), which set the template's ``enable_thinking`` (common/arg.cpp of the pinned
    llama.cpp); none for None (the template's default)."""
    level = mode.removeprefix("thinking-") if mode and mode.startswith("thinking-") else effort if mode == "thinking" else None
    if level:
        return ("--reasoning-effort", level)
    if not switch:
        return ()
    return {"thinking": ("--reasoning", "on"), "standard": ("--reasoning", "off")}.get(mode or "", ())


def planned_command(
    model_path: str, estimate: RunEstimate, *, host_only: bool = False, template_args: tuple[str, ...] = (), cache_ram_bytes: int | None = None
) -> list[str]:
    """The command ``check`` prints: ``llama-server -m MODEL`` and the planned options."""
    return [
        "llama-server",
        "-m",
        model_path,
        *server_args(estimate, host_only=host_only, template_args=template_args, cache_ram_bytes=cache_ram_bytes),
    ]


def launch_argv(
    binary: Path,
    flags: EngineFlags,
    model: Path,
    estimate: RunEstimate,
    *,
    host_only: bool,
    host: str,
    port: int,
    api_key_file: Path | None,
    threads: int | None = None,
    template_args: tuple[str, ...] = (),
    engine_args: tuple[str, ...] = (),
    cache_ram_bytes: int | None = None,
) -> list[str]:
    """The planned run as ``binary`` takes it: the planned options in its spelling, the bind
    address, ``--fit off`` so llama.cpp does not re-plan what we planned, verbose load lines
    for the log parser, ``--metrics`` (token and queue counters), the file's name without
    ``.gguf`` as the model's name (``--alias``, unless given after ``--``), the key by file
    (never on the command line).

    Raises:
        EngineError: a key file is given and the binary cannot read one.
    """
    # Binaries from before Jinja templates have no --no-jinja (nor --jinja): the names are all they take.
    template_args = tuple(arg for arg in template_args if arg not in ("--no-jinja", "--jinja") or flags.knows(arg))
    argv = [
        str(binary),
        "-m",
        str(model),
        *server_args(
            estimate,
            host_only=host_only,
            flash_attn_takes_value=flags.flash_attn_takes_value,
            template_args=template_args,
            cache_ram_bytes=cache_ram_bytes if flags.knows("--cache-ram") else None,
        ),
    ]
    argv += ["--host", host, "--port", str(port)]
    if flags.knows("--fit"):
        argv += ["--fit", "off"]
    if flags.knows("-lv"):
        argv += ["-lv", "4"]
    if flags.knows("--metrics"):
        argv += ["--metrics"]  # tokens and queue counters for the dashboard's live page
    if threads:
        argv += ["-t", str(threads)]
    if flags.knows("--alias") and not {"-a", "--alias"} & set(_option_names(engine_args)):
        argv += ["--alias", model.stem]  # the name answers carry and /v1/models lists (else the file's path)
    if api_key_file is not None:
        if not flags.knows("--api-key-file"):
            raise EngineError(f"{binary} has no --api-key-file", hint="use a newer llama-server; tierlocal never puts the key on the command line")
        argv += ["--api-key-file", str(api_key_file)]
    return argv + list(engine_args)


def _option_names(args: tuple[str, ...]) -> list[str]:
    """The option names among ``args`` (``--x=1`` counts as ``--x``; negative numbers do not)."""
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-") and not arg.lstrip("-").replace(".", "", 1).isdigit()]


def check_engine_args(args: tuple[str, ...], flags: EngineFlags) -> list[str]:
    """Warnings for llama-server options given after ``--``: those that change memory in ways the
    plan does not model.

    Raises:
        UsageError: an option the plan sets (naming serve's own), or one this binary does not know.
    """
    warnings = []
    for name in _option_names(args):
        if name in PLANNED_OPTIONS:
            raise UsageError(f"{name} after -- is set by tierlocal's plan", hint=f"use serve's {PLANNED_OPTIONS[name]} instead")
        if flags.options and not flags.knows(name):
            raise UsageError(f"this llama-server ({flags.version}) has no option {name}", hint="see llama-server --help")
        if name in UNPLANNED_MEMORY_OPTIONS:
            warnings.append(f"{name} changes memory in a way the plan does not model: the verification may report a difference")
    return warnings

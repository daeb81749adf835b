"""`tierlocal serve --engine python`: the same plan through llama-cpp-python's OpenAI-compatible
server, for a machine where neither llama-server nor Ollama is installed
(``pip install 'tierlocal[python-engine]'``).

What differs from llama-server, and how the plan follows it: the server runs one sequence (no
parallel slots: ``--parallel 1`` only); it keeps full-size KV for sliding-window layers (the
llama.cpp library default, which llama-server turns off) and reserves logits for every token
of a micro-batch (n_ubatch × n_vocab floats of compute buffer: 512 MiB for a 262k vocabulary),
so the plan is made with both; it has no ``--n-cpu-moe``. It is started with the plan's context, GPU layers,
flash attention and cache types, ``--logits_all false`` (otherwise it holds a logits array of
context × vocabulary floats) and ``--verbose true``, whose output is llama.cpp's own load log —
so readiness, verification, the state file and `tierlocal status` work as for llama-server. The
API key reaches it in its environment (``API_KEY``), never on its command line.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import gguf

from .. import constants
from ..errors import AllocationFailed, UsageError
from ..fit.estimate import RunRequest
from ..plan.source import SourceCheck
from .exposure import check_exposure
from .run import OnReady, Say, ServeOptions, ServeSession, detected_machine, launch, plan_for, read_model, stop_on_signals, supervise_verified
from .state import clear_state
from .template import resolve_template

__all__ = ["serve_python", "python_engine_argv", "PYTHON_ENGINE"]

#: How the state file and logs name this engine.
PYTHON_ENGINE = "llama-cpp-python"
_NEEDED_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "pydantic_settings")


def _require_python_engine() -> str:
    """The engine's version; a clear error when its server is not installed here."""
    missing = [name for name in _NEEDED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"llama-cpp-python's server is not installed in this Python (missing: {', '.join(missing)})",
            hint="pip install 'tierlocal[python-engine]'",
        )
    return importlib.metadata.version("llama-cpp-python")


def _ggml_type(name: str) -> int:
    """A KV cache type's ggml id (what llama-cpp-python's --type_k/--type_v take)."""
    return int(gguf.GGMLQuantizationType[name.upper()].value)


def python_engine_argv(python: str, model: Path, check: SourceCheck, *, host: str, port: int, threads: int | None) -> list[str]:
    """The planned run as llama-cpp-python's server command line."""
    assert check.estimate is not None
    request, params = check.estimate.request, check.estimate.params
    argv = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        model.stem,
        "--n_ctx",
        str(params.n_ctx_padded),
        "--n_gpu_layers",
        str(check.estimate.layers_offloaded),
        "--flash_attn",
        "true" if request.flash_attn else "false",
        "--logits_all",
        "false",
        "--verbose",
        "true",
        "--host",
        host,
        "--port",
        str(port),
    ]
    if request.cache_type_k != "f16":
        argv += ["--type_k", str(_ggml_type(request.cache_type_k))]
    if request.cache_type_v != "f16":
        argv += ["--type_v", str(_ggml_type(request.cache_type_v))]
    if threads is not None:
        argv += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    chosen = check.template.prompt_format
    if check.template.source in ("builtin", "name") and chosen is not None and chosen.python_chat_format:
        argv += ["--chat_format", chosen.python_chat_format]
    return argv


def serve_python(options: ServeOptions, *, say: Say, on_ready: OnReady) -> int:
    """Run llama-cpp-python's server for ``options`` until SIGTERM/SIGINT; returns the exit code.

    Raises:
        UsageError: the server is not installed, more than one slot is asked for, no model
            file, an exposed address without a key, or a plan it cannot run (``--n-cpu-moe``).
        TierlocalError: the plan does not fit; the engine failed (EngineFailed).
    """
    version = _require_python_engine()
    if options.slots != "1":
        raise UsageError(
            f"--parallel {options.slots}: llama-cpp-python's server runs one request at a time",
            hint="use --parallel 1, or --engine llama-server for parallel slots",
        )
    if not options.model.is_file():
        raise UsageError(f"{options.model}: no such model file", hint="give a GGUF path, or a catalog name / hf:// source with --pull")
    key_file = check_exposure(options.host, options.api_key_file)
    machine = detected_machine(options)
    model = read_model(options.model)
    template = resolve_template(options.chat_template, model.summary, None, engine="python")
    note = template.note.replace("llama-server's built-in", "llama-cpp-python's chat format")
    say("chat template: " + note.replace("llama-server will fall back to ChatML", "llama-cpp-python will fall back to its llama-2 format"))
    if template.warning:
        say("warning: " + template.warning.replace("ChatML", "its llama-2 format"))
    check = plan_for(options, machine, RunRequest(swa_full=True, all_outputs=True), template=template, model=model)
    assert check.estimate is not None
    if check.estimate.request.n_cpu_moe:
        raise UsageError(
            f"the plan keeps the experts of {check.estimate.request.n_cpu_moe} layers on the CPU (--n-cpu-moe), which llama-cpp-python's server "
            "cannot do",
            hint="use --engine llama-server for this model",
        )
    argv = python_engine_argv(sys.executable, options.model, check, host=options.host, port=options.port, threads=options.threads)
    env = constants.child_environment()
    headers: dict[str, str] | None = None
    if key_file is not None:
        key = key_file.read_text().split()[0]
        env["API_KEY"] = key
        headers = {"Authorization": f"Bearer {key}"}
    history_key: dict[str, object] = {
        "model": str(options.model.resolve()),
        "file_bytes": options.model.stat().st_size,
        "engine": PYTHON_ENGINE,
        "engine_version": version,
        "ctx_per_slot": options.ctx,  # named for its meaning: loads recorded when --ctx was the total do not match
        "parallel": options.parallel,
        "gpus": list(options.gpus),
    }
    with stop_on_signals() as stop:
        session = ServeSession(options, model, machine, check, stop, say, on_ready, history_key)
        try:
            launched = launch(session, PYTHON_ENGINE, version, argv, env, "/v1/models", headers)
            if isinstance(launched, int):
                return launched
            if isinstance(launched, AllocationFailed):
                raise launched  # no re-plan for this engine yet
            return supervise_verified(session, launched, {"chat_template": {**template.to_json(), "header": check.chat_template.to_json()}})
        finally:
            clear_state(options.port)

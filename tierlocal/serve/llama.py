"""`tierlocal serve` with llama-server: the planned command line (engines/flags), launched,
verified and supervised (run.py); on a failed allocation at load, planned once more for the
memory the device really had."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from .. import constants
from ..cpu_figures import host_speed_here
from ..engines.flags import EngineFlags, check_engine_args, launch_argv, role_flags
from ..engines.llama_server import find_llama_server, llama_server_missing, read_engine_flags
from ..engines.loadlog import LoadReport
from ..errors import AllocationFailed, EngineFailed, TierlocalError, UsageError
from .exposure import check_exposure
from .history import gpu_correction
from .run import (
    Launched,
    OnReady,
    Say,
    ServeOptions,
    ServeSession,
    detected_machine,
    launch,
    plan_for,
    read_model,
    stop_on_signals,
    supervise_verified,
)
from .state import clear_state
from .template import rendered_prompt, resolve_template

__all__ = ["serve_llama"]


def serve_llama(options: ServeOptions, *, say: Say, on_ready: OnReady) -> int:
    """Run llama-server for ``options`` until SIGTERM/SIGINT; returns the exit code.

    Raises:
        UsageError: no binary, no model file, or an exposed address without a key.
        TierlocalError: the plan does not fit; the engine failed (EngineFailed).
    """
    binary = find_llama_server(options.llama_server)
    if binary is None:
        raise llama_server_missing(options.llama_server)
    if not options.model.is_file():
        raise UsageError(f"{options.model}: no such model file", hint="give a GGUF path, or a catalog name / hf:// source with --pull")
    key_file = check_exposure(options.host, options.api_key_file)
    flags = read_engine_flags(binary)
    for warning in check_engine_args(options.engine_args, flags):
        say(f"warning: {warning}")
    history_key: dict[str, object] = {
        "model": str(options.model.resolve()),
        "file_bytes": options.model.stat().st_size,
        "engine": str(binary.resolve()),
        "engine_version": flags.version,
        "ctx_per_slot": options.ctx,  # named for its meaning: loads recorded when --ctx was the total do not match
        "parallel": options.slots,
        **({"kv_unified": True} if options.users and options.users > 1 else {}),
        "gpus": list(options.gpus),
    }

    machine = detected_machine(options, llama_server=binary)
    correction = gpu_correction(history_key) if machine.gpu_name is not None else None
    if correction is not None and correction.bytes:
        machine = replace(machine, gpu_compute_correction_bytes=correction.bytes)
        say(
            f"correcting the GPU estimate by {correction.bytes / 2**20:+.1f} MiB: the median miss of {correction.loads} "
            "recorded load(s) of this model with this engine"
        )
    model = read_model(options.model)
    options = _pooled(options, model.summary.pooled_role, say)
    template = resolve_template(options.chat_template, model.summary, flags.chat_templates or None)
    check = plan_for(options, machine, template=template, host_speed=host_speed_here(flags.version, machine), model=model)
    say(f"chat template: {template.llama_server_note}")
    if template.tools:
        say(f"tool calls: {template.tools}")
    if check.context_note:
        say(f"warning: {check.context_note}")
    if template.warning:
        say(f"warning: {template.warning}")
    with stop_on_signals() as stop:
        session = ServeSession(options, model, machine, check, stop, say, on_ready, history_key)
        try:
            return _serve_attempts(session, binary, flags, key_file)
        finally:
            clear_state(options.port)


def _pooled(options: ServeOptions, pooled_role: str | None, say: Say) -> ServeOptions:
    """``options`` for a file whose header names a pooling (an embedding model's or a reranker's):
    served as that role unless another was asked for, since such a file does not chat."""
    if pooled_role is None or options.role != "chat":
        return options
    say(f"the file names a pooling: serving it as {pooled_role} (/v1/{'embeddings' if pooled_role == 'embeddings' else 'rerank'})")
    return replace(options, role=pooled_role)


def _serve_attempts(session: ServeSession, binary: Path, flags: EngineFlags, key_file: Path | None) -> int:
    """Run once; on an allocation failure at load, plan again for the memory llama.cpp saw
    free and run once more."""
    for attempt in (1, 2):
        outcome = _run_once(session, binary, flags, key_file)
        if isinstance(outcome, int):
            return outcome
        if attempt == 2:
            raise outcome
        replanned = _replan_for_free_memory(session, outcome)
        if replanned is None:
            raise outcome
        session, change = replanned
        session.say(f"retrying once: {change}")
    raise AssertionError("unreachable")


def _run_once(session: ServeSession, binary: Path, flags: EngineFlags, key_file: Path | None) -> int | AllocationFailed:
    options, check = session.options, session.check
    assert check.estimate is not None
    argv = launch_argv(
        binary,
        flags,
        options.model,
        check.estimate,
        host_only=check.host_only,
        host=options.host,
        port=options.port,
        api_key_file=key_file,
        threads=options.threads,
        template_args=check.template.engine_args,
        engine_args=(*role_args(options, session.model.summary.pooling_type), *options.engine_args),
        cache_ram_bytes=check.host_memory[0].grows_by_bytes if check.host_memory else None,
    )
    key = key_file.read_text().split()[0] if key_file is not None else None
    headers = {"Authorization": f"Bearer {key}"} if key else None
    launched = launch(session, "llama-server", flags.version, argv, constants.child_environment(), "/health", headers)
    if not isinstance(launched, Launched):
        return launched
    # The key file's path (never the key) lets the dashboard read /slots and /metrics too.
    extra: dict[str, object] = {"chat_template": _checked_template(session, launched), "api_key_file": None if key_file is None else str(key_file)}
    return supervise_verified(session, launched, extra)


def _checked_template(session: ServeSession, launched: Launched) -> dict[str, object]:
    """The template in use, with the prompt llama-server builds from one user message; an
    engine that renders the wrong format is stopped (EngineFailed)."""
    template = session.check.template
    try:
        prompt = rendered_prompt(launched.url, template, launched.headers)
    except EngineFailed:
        launched.child.stop()
        raise
    if prompt is None:
        session.say("this llama-server has no /apply-template: the chat template was not checked")
    return {**template.to_json(), "header": session.check.chat_template.to_json(), "rendered": prompt}


def _replan_for_free_memory(session: ServeSession, failed: AllocationFailed) -> tuple[ServeSession, str] | None:
    """A plan for the memory the device really had: the least of what llama.cpp saw free as
    it started, and what the plan put on the GPU less the buffer the device refused (it held
    at most that much), plus our margin and runtime allowance."""
    machine, planned = session.machine, session.check.estimate
    assert planned is not None and isinstance(failed.report, LoadReport)
    if machine.gpu_name is None or session.options.ngl is not None:  # no GPU, or layers the user chose
        return None
    gpu = planned.devices[0]
    refused = failed.report.failure("alloc_failed")
    refused_bytes = int(match.group(1)) if refused and (match := re.search(r"buffer of size (\d+)", refused.line)) else 0
    held_at_most = max(0, gpu.weights_bytes + gpu.kv_bytes + gpu.compute_bytes - refused_bytes)
    candidates = [machine.gpu_free_bytes, held_at_most + machine.margin_bytes + machine.gpu_overhead_bytes, *failed.report.devices.values()]
    free = min(candidates)
    if free >= machine.gpu_free_bytes:
        return None
    smaller = replace(machine, gpu_free_bytes=free)
    try:
        check = plan_for(session.options, smaller, model=session.model)
    except TierlocalError:
        return None
    assert check.estimate is not None
    change = (
        f"llama.cpp could not allocate {refused_bytes / 2**20:.0f} MiB on the GPU; planned again for "
        f"{free / 2**20:.0f} MiB free instead of {machine.gpu_free_bytes / 2**20:.0f} MiB: -ngl {check.estimate.request.ngl} "
        f"instead of {planned.request.ngl}"
    )
    return replace(session, machine=smaller, check=check), change


def role_args(options: ServeOptions, pooling_type: int | None) -> tuple[str, ...]:
    """The llama-server options that make it serve ``options.role``: a file that names no pooling
    (a generation model's, ``pooling_type`` None or 0) is pooled by the mean of its tokens, since
    llama-server's OpenAI embeddings refuse none — unless ``--pooling`` is given after ``--``."""
    return role_flags(options.role, pooled=bool(pooling_type) or "--pooling" in options.engine_args)

"""`tierlocal serve` with llama-server: plan, launch with exactly the planned arguments, wait
for health, verify the load against the plan, keep running until stopped.

The pieces are elsewhere (plan: _check_source; flags: engines/flags; process: supervise;
log: loadlog; comparison: verify); this module puts them in order and keeps the state file
that ``tierlocal status`` reads.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from . import constants
from .addresses import is_loopback
from ._check_source import SourceCheck, check_source, machine_for, parse_ctx, parse_parallel, source_check_json
from .catalog import load_host_defaults
from .engines.flags import plan_argv, read_engine_flags
from .engines.llama_server import find_llama_server
from .errors import TierlocalError, UsageError
from .estimate import Machine, RunRequest, estimate_run
from .gguf import read_headers
from .hardware import Hardware, detect, with_gpu_override
from .history import gpu_correction, history_path
from .loadlog import LoadLogParser, LoadReport, is_host_buffer
from .model import model_spec
from .sdnotify import notify
from .supervise import EngineChild, start_child
from .verify import Verification, verify_load

__all__ = ["ServeOptions", "EngineFailed", "Launched", "supervise_verified", "plan_for", "launch", "serve_llama", "check_exposure", "state_path", "actual_json", "stop_on_signals"]

#: Seconds of load allowed at least, plus one per this many bytes of model file.
LOAD_TIMEOUT_BASE_S = 120.0
LOAD_BYTES_PER_S = 50_000_000
#: Seconds systemd's start timeout is extended by, each time we report progress while loading.
EXTEND_TIMEOUT_S = 60


class EngineFailed(TierlocalError):
    """The engine died or never became healthy."""

    exit_code = 1


@dataclass(frozen=True)
class ServeOptions:
    """What the user asked for. ``ctx``/``parallel`` as typed (``max``/``auto`` allowed)."""

    model: Path
    llama_server: str | None = None
    ctx: str = "8192"
    parallel: str = "1"
    host: str = "127.0.0.1"
    port: int = 8080
    gpus: tuple[str, ...] = ()
    api_key_file: Path | None = None
    load_timeout_s: float | None = None
    threads: int | None = None


def check_exposure(host: str, api_key_file: Path | None) -> Path | None:
    """The key file to pass, or None on loopback. Any other address needs a key, from
    ``--api-key-file`` (mode 0600 or stricter) or systemd's credential ``api-key``."""
    if api_key_file is None and (credentials := constants.credentials_dir()) is not None:
        candidate = credentials / "api-key"
        api_key_file = candidate if candidate.is_file() else None
    if api_key_file is None:
        if is_loopback(host):
            return None
        raise UsageError(
            f"refusing to bind {host} without an API key: anyone who can reach it could use the model",
            hint="pass --api-key-file FILE (one key per line, mode 0600), or a systemd credential named api-key; or bind 127.0.0.1",
        )
    try:
        mode = api_key_file.stat().st_mode
    except OSError:
        raise UsageError(f"--api-key-file {api_key_file}: cannot read it", hint="create it with one key per line, chmod 600") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and constants.credentials_dir() is None:
        raise UsageError(f"--api-key-file {api_key_file} is readable by others (mode {stat.S_IMODE(mode):o})", hint=f"chmod 600 {api_key_file}")
    if not api_key_file.read_text().strip():
        raise UsageError(f"--api-key-file {api_key_file} is empty", hint="write one key per line")
    return api_key_file


def state_path(port: int) -> Path:
    """The state file of the server on ``port``."""
    return constants.run_dir() / f"serve-{port}.json"


def actual_json(report: LoadReport) -> dict[str, object]:
    """The documented ``actual`` object: what llama.cpp reported."""
    devices: dict[str, dict[str, int]] = {}
    for name, sizes in report.buffers.items():
        key = "host" if is_host_buffer(name) else name
        device = devices.setdefault(key, {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "output_bytes": 0})
        device["weights_bytes"] += sizes.weights
        device["kv_bytes"] += sizes.kv + sizes.recurrent
        device["compute_bytes"] += sizes.compute
        device["output_bytes"] += sizes.output
    return {
        "layers_offloaded": report.layers_offloaded or 0,
        "layers_total": report.layers_total,
        "devices": [{"name": name, **sizes} for name, sizes in devices.items()],
        "n_ctx": report.n_ctx,
        "n_ctx_per_slot": report.n_ctx_slot,
        "parallel": report.n_slots,
        "kv_unified": report.kv_unified,
        "engine_build": report.build,
    }


def _delta_json(verification: Verification) -> dict[str, object]:
    return {
        "layers": verification.layers_actual - verification.layers_planned,
        "n_ctx": None if verification.n_ctx_actual is None else verification.n_ctx_actual - verification.n_ctx_planned,
        "devices": [
            {"name": d.name, "planned_bytes": d.planned_bytes, "actual_bytes": d.actual_bytes, "error": None if d.error is None else round(d.error, 4)}
            for d in verification.devices
        ],
        "verified": verification.ok,
        "problems": verification.problems,
        "warnings": verification.warnings,
    }


def plan_for(options: ServeOptions, hardware: Hardware, machine: Machine, request: RunRequest | None = None) -> SourceCheck:
    """The plan for ``options`` on ``machine`` (``request``: engine-specific defaults), or an
    error when it does not fit."""
    headers = read_headers(str(options.model))
    check = check_source(
        str(options.model),
        headers,
        machine,
        ctx=parse_ctx(options.ctx),
        parallel=parse_parallel(options.parallel),
        request=request or RunRequest(),
    )
    if check.estimate is None or not check.estimate.fits:
        raise TierlocalError(
            f"{options.model}: does not fit this machine as asked ({check.reason or 'no plan'}); nothing was started",
            hint="lower --ctx or --parallel, or see `tierlocal check` for what fits",
        )
    return check


def _last_relevant_lines(child: EngineChild, report: LoadReport, count: int = 8) -> str:
    if report.failures:
        return " | ".join(failure.line for failure in report.failures[:3])
    lines = [line for line in child.lines() if line.strip()]
    return " | ".join(lines[-count:])


def serve_llama(options: ServeOptions, *, say: Callable[[str], None], on_ready: Callable[[dict[str, object]], None]) -> int:
    """Run llama-server for ``options`` until SIGTERM/SIGINT; returns the exit code."""
    binary = find_llama_server(options.llama_server)
    if binary is None:
        raise UsageError(
            "no llama-server binary found" + (f" at {options.llama_server}" if options.llama_server else ""),
            hint="pass --llama-server PATH, set TIERLOCAL_LLAMA_SERVER, or put llama-server on PATH",
        )
    if not options.model.is_file():
        raise UsageError(f"{options.model}: no such model file", hint="give a GGUF path, or a catalog name / hf:// source with --pull")
    key_file = check_exposure(options.host, options.api_key_file)
    flags = read_engine_flags(binary)
    hardware = with_gpu_override(detect(llama_server=binary), options.gpus)
    machine = machine_for(hardware, load_host_defaults())
    history_key: dict[str, object] = {
        "model": str(options.model.resolve()),
        "file_bytes": options.model.stat().st_size,
        "engine": str(binary.resolve()),
        "engine_version": flags.version,
        "ctx": options.ctx,
        "parallel": options.parallel,
        "gpus": list(options.gpus),
    }
    correction = gpu_correction(history_key) if machine.gpu_name is not None else None
    if correction is not None and correction.bytes:
        machine = replace(machine, gpu_compute_correction_bytes=correction.bytes)
        say(
            f"correcting the GPU estimate by {correction.bytes / 2**20:+.1f} MiB: the median miss of {correction.loads} "
            "recorded load(s) of this model with this engine"
        )
    check = plan_for(options, hardware, machine)

    with stop_on_signals() as stop:
        try:
            return _serve_attempts(options, binary, flags, key_file, check, hardware, machine, stop, say, on_ready, history_key)
        finally:
            state_path(options.port).unlink(missing_ok=True)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while inside; the previous handlers come back after."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_attempts(
    options: ServeOptions,
    binary: Path,
    flags: object,
    key_file: Path | None,
    check: SourceCheck,
    hardware: Hardware,
    machine: Machine,
    stop: threading.Event,
    say: Callable[[str], None],
    on_ready: Callable[[dict[str, object]], None],
    history_key: dict[str, object],
) -> int:
    """Run once; on an allocation failure at load, plan again for the memory llama.cpp saw
    free and run once more."""
    for attempt in (1, 2):
        outcome = _run_once(options, binary, flags, key_file, check, machine, stop, say, on_ready, history_key)
        if isinstance(outcome, int):
            return outcome
        if attempt == 2:
            raise outcome
        replanned = _replan_for_free_memory(options, hardware, machine, check, outcome)
        if replanned is None:
            raise outcome
        check, machine, change = replanned
        say(f"retrying once: {change}")
    raise AssertionError("unreachable")


class _AllocationFailed(EngineFailed):
    def __init__(self, message: str, report: LoadReport, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.report = report


def _replan_for_free_memory(
    options: ServeOptions, hardware: Hardware, machine: Machine, planned: SourceCheck, failed: _AllocationFailed
) -> tuple[SourceCheck, Machine, str] | None:
    """A plan for the memory the device really had: the least of what llama.cpp saw free as
    it started, and what the plan put on the GPU less the buffer the device refused (it held
    at most that much), plus our margin and runtime allowance."""
    assert planned.estimate is not None
    if machine.gpu_name is None:
        return None
    gpu = planned.estimate.devices[0]
    refused = failed.report.failure("alloc_failed")
    refused_bytes = int(match.group(1)) if refused and (match := re.search(r"buffer of size (\d+)", refused.line)) else 0
    held_at_most = max(0, gpu.weights_bytes + gpu.kv_bytes + gpu.compute_bytes - refused_bytes)
    candidates = [machine.gpu_free_bytes, held_at_most + machine.margin_bytes + machine.gpu_overhead_bytes, *failed.report.devices.values()]
    free = min(candidates)
    if free >= machine.gpu_free_bytes:
        return None
    smaller = replace(machine, gpu_free_bytes=free)
    try:
        check = plan_for(options, hardware, smaller)
    except TierlocalError:
        return None
    assert check.estimate is not None
    change = (
        f"llama.cpp could not allocate {refused_bytes / 2**20:.0f} MiB on the GPU; planned again for "
        f"{free / 2**20:.0f} MiB free instead of {machine.gpu_free_bytes / 2**20:.0f} MiB: -ngl {check.estimate.request.ngl} "
        f"instead of {planned.estimate.request.ngl}"
    )
    return check, smaller, change


def _run_once(
    options: ServeOptions,
    binary: Path,
    flags: object,
    key_file: Path | None,
    check: SourceCheck,
    machine: Machine,
    stop: threading.Event,
    say: Callable[[str], None],
    on_ready: Callable[[dict[str, object]], None],
    history_key: dict[str, object],
) -> int | _AllocationFailed:
    assert check.estimate is not None
    argv = plan_argv(binary, flags, check.command, host=options.host, port=options.port, api_key_file=key_file, threads=options.threads)  # type: ignore[arg-type]
    launched = launch("llama-server", flags.version, argv, constants.child_environment(), options, check, "/health", stop, say)  # type: ignore[attr-defined]
    if not isinstance(launched, Launched):
        return launched
    return supervise_verified(launched, options, check, machine, stop, say, on_ready, history_key)


@dataclass(frozen=True)
class Launched:
    """An engine child that answered its readiness URL: which engine, its version, the
    process, the parser fed its output, how it was started, where it serves and logs."""

    engine: str
    version: str
    child: EngineChild
    parser: LoadLogParser
    argv: list[str]
    url: str
    log_path: Path


def supervise_verified(
    launched: Launched,
    options: ServeOptions,
    check: SourceCheck,
    machine: Machine,
    stop: threading.Event,
    say: Callable[[str], None],
    on_ready: Callable[[dict[str, object]], None],
    history_key: dict[str, object],
) -> int:
    """Once an engine is ready: verify its load against the plan, write the state file
    `tierlocal status` reads, record the load, notify systemd, and supervise it until stopped."""
    assert check.estimate is not None
    child, parser, argv, url, log_path = launched.child, launched.parser, launched.argv, launched.url, launched.log_path
    report = parser.report()
    spec = model_spec(read_headers(str(options.model)))

    def speed_for_ngl(ngl: int) -> float | None:
        assert check.estimate is not None
        return estimate_run(spec, replace(check.estimate.request, ngl=ngl), machine).est_decode_tokens_per_s

    verification = verify_load(check.estimate, report, speed_for_ngl=speed_for_ngl)
    payload: dict[str, object] = {
        "url": url,
        "pid": os.getpid(),
        "engine": launched.engine,
        "engine_pid": child.pid,
        "engine_version": launched.version,
        "log": str(log_path),
        "argv": argv,
        "plan": source_check_json(check),
        "actual": actual_json(report),
        "delta": _delta_json(verification),
        "estimate_correction_bytes": machine.gpu_compute_correction_bytes,
    }
    state = state_path(options.port)
    temporary = state.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, state)
    gpu_delta = next((delta for delta in verification.devices if delta.name != "host"), None)
    if gpu_delta is not None and verification.layers_actual == verification.layers_planned:
        _record_load(history_key, payload, gpu_delta.planned_bytes, gpu_delta.actual_bytes, machine.gpu_compute_correction_bytes)
    notify("READY=1", f"STATUS=serving {options.model.name} on {url}" + ("" if verification.ok else " (plan not held: see tierlocal status)"))
    on_ready(payload)
    while not stop.is_set():
        if child.process.poll() is not None:
            child.wait_output()
            code = child.process.returncode
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            raise EngineFailed(f"{launched.engine} stopped unexpectedly ({how}): {_last_relevant_lines(child, parser.report())}", hint=f"see {log_path}")
        stop.wait(0.5)
    notify("STOPPING=1")
    say(f"stopping {launched.engine}")
    child.stop()
    return 0


def launch(
    engine: str,
    version: str,
    argv: list[str],
    env: dict[str, str],
    options: ServeOptions,
    check: SourceCheck,
    ready_path: str,
    stop: threading.Event,
    say: Callable[[str], None],
    headers: dict[str, str] | None = None,
) -> Launched | int | _AllocationFailed:
    """Start an engine with its output drained into the log and the load-log parser, and wait
    (bounded by the model's size, EXTEND_TIMEOUT_USEC to systemd meanwhile) until ``ready_path``
    answers 200. Returns the launched engine, 130 when stopped while loading, or the
    allocation failure to plan around; raises EngineFailed when it dies or never answers."""
    log_path = constants.run_dir() / f"serve-{options.port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    parser = LoadLogParser()
    child = start_child(argv, log_path, env=env, on_line=parser.feed)
    say(f"started {engine} (pid {child.pid}): {' '.join(argv)}")
    timeout = options.load_timeout_s or LOAD_TIMEOUT_BASE_S + check.file_bytes / LOAD_BYTES_PER_S
    last_extend = [0.0]

    def waiting(waited: float) -> None:
        if waited - last_extend[0] >= 10:
            last_extend[0] = waited
            notify(f"EXTEND_TIMEOUT_USEC={EXTEND_TIMEOUT_S * 1_000_000}", f"STATUS=loading {options.model.name} ({waited:.0f} s)")

    url = f"http://{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:{options.port}"
    readiness = child.wait_ready(url + ready_path, timeout, on_waiting=waiting, stop=stop, headers=headers)
    if not readiness.ready:
        report = parser.report()
        if readiness.exit_code is None:
            child.stop()
            if stop.is_set():
                say("stopped while loading")
                return 130
            raise EngineFailed(f"{engine} did not become ready within {timeout:.0f} s; stopped it", hint=f"see {log_path}; raise --load-timeout for a slow disk")
        details = _last_relevant_lines(child, report)
        if report.failure("alloc_failed"):
            return _AllocationFailed(f"{engine} could not allocate memory while loading: {details}", report, hint=f"see {log_path}")
        raise EngineFailed(f"{engine} exited with {readiness.exit_code} while loading: {details}", hint=f"see {log_path}")
    return Launched(engine, version, child, parser, argv, url, log_path)


def _record_load(key: dict[str, object], payload: dict[str, object], planned_gpu: int, actual_gpu: int, correction: int) -> None:
    """Append the verified load to the history the next plan of the same model and engine
    learns from (tierlocal/history.py)."""
    path = history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "key": key,
        "gpu": {"planned_bytes": planned_gpu, "actual_bytes": actual_gpu, "correction_bytes": correction},
        **{name: payload[name] for name in ("engine", "engine_version", "plan", "actual", "delta")},
    }
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")

"""One serve session's shared steps, whichever engine runs it: the plan for the
options (``tierlocal check``'s), starting a child with its output drained into the log and the
load-log parser, waiting until it answers, verifying the load against the plan, writing the state
file ``tierlocal status`` reads, recording the load, notifying systemd, and supervising until
SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .. import constants
from ..catalog import load_host_defaults
from ..engines.loadlog import LoadLogParser, LoadReport
from ..engines.process import EngineChild, start_child
from ..engines.prompt_formats import TemplateChoice
from ..errors import AllocationFailed, EngineFailed, TierlocalError, UsageError
from ..fetch.sources import read_headers
from ..fit.device_speed import DeviceSpeed
from ..fit.estimate import Machine, RunRequest, estimate_run
from ..fit.model import ModelSpec, model_spec
from ..fit.projector import ProjectorSpec, projector_spec
from ..gguf import ModelSummary, summarize
from ..gpu_figures import machine_gpu_speed
from ..hardware.detect import detect
from ..hardware.override import with_gpu_override
from ..plan.inputs import PlanAsk, PlanInputs
from ..plan.machine import machine_for
from ..plan.source import SourceCheck, check_model, parse_ctx, parse_parallel
from ..plan.verify import verify_load
from .history import record_load
from .probe import first_answer
from .state import ServeState, log_path, write_starting, write_state
from .systemd import notify
from .template import TEMPLATE_HINT

__all__ = [
    "read_projector",
    "ServeOptions",
    "ServeSession",
    "Launched",
    "plan_for",
    "detected_machine",
    "launch",
    "supervise_verified",
    "verify_ready",
    "stop_on_signals",
    "last_log_lines",
]

#: Say something, or report the ready engine (what its state file holds).
Say = Callable[[str], None]
OnReady = Callable[[ServeState], None]


@dataclass(frozen=True)
class ServeOptions:
    """What the user asked for. ``ctx``/``parallel`` as typed (``max``/``auto`` allowed; ``ctx``
    None: not given, the default up to the model's trained context); ``ollama_tag``: serve that
    Ollama tag as it is (its GGUF is ``model``)."""

    model: Path
    engine: str = "llama-server"
    llama_server: str | None = None
    ollama_binary: str | None = None
    ollama_tag: str | None = None
    ctx: str | None = None
    parallel: str = "1"
    host: str = constants.DEFAULT_HOST
    port: int = constants.LLAMA_SERVER_PORT
    gpus: tuple[str, ...] = ()
    #: Layers on the GPU as asked (None: planned; constants.NGL_ALL: every layer).
    ngl: int | None = None
    api_key_file: Path | None = None
    load_timeout_s: float | None = None
    threads: int | None = None
    #: ``--chat-template`` as typed: a built-in name or a Jinja file (None: tierlocal chooses).
    chat_template: str | None = None
    #: The planning options `check` takes (None/defaults: planned).
    n_cpu_moe: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    #: ``on``, ``off`` or ``auto`` (planned as on, passed as llama-server's -fa on).
    flash_attn: str = "auto"
    ubatch: int = constants.DEFAULT_UBATCH
    #: Other llama-server options, given after ``--`` (checked against the binary's --help).
    engine_args: tuple[str, ...] = ()
    #: A multimodal projector (mmproj GGUF) to load beside the model (``--mmproj``).
    mmproj: Path | None = None
    #: Users at once to plan for (``--users``): that many slots when ``parallel`` is left at 1,
    #: one KV cache they share (``-kvu``), and the plan's users table priced for them.
    users: int | None = None
    #: What the model serves: ``chat`` (and ``code``), ``embeddings`` (llama-server's
    #: ``--embeddings``) or ``rerank`` (``--reranking``); the last two are planned with every
    #: token of a micro-batch as an output, as llama-server runs them.
    role: str = "chat"

    @property
    def slots(self) -> str:
        """``--parallel`` as planned: the users' count when ``--users`` is given and --parallel left at 1."""
        return str(self.users) if self.users and self.parallel == "1" else self.parallel

    def run_request(self, base: RunRequest | None = None) -> RunRequest:
        """``base`` (an engine's defaults) with what the user asked for (the projector's
        header read from its file)."""
        base = base or RunRequest()
        return replace(
            base,
            projector=read_projector(str(self.mmproj)) if self.mmproj is not None else None,
            ngl=self.ngl,
            n_cpu_moe=self.n_cpu_moe,
            cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v,
            flash_attn=self.flash_attn != "off",
            n_ubatch=self.ubatch,
            swa_full=base.swa_full or "--swa-full" in self.engine_args,
            all_outputs=base.all_outputs or self.role in ("embeddings", "rerank"),
            kv_unified=True if self.users and self.users > 1 else base.kv_unified,
        )


@dataclass(frozen=True)
class ServedModel:
    """The model file as the planner takes it: the spec and summary of its header, read once per serve."""

    spec: ModelSpec
    summary: ModelSummary


def read_model(path: Path) -> ServedModel:
    """``path``'s header, read once: its spec and its summary.

    Raises:
        HeaderError: not a GGUF file the parser takes.
    """
    headers = read_headers(str(path))
    return ServedModel(model_spec(headers), summarize(headers))


@dataclass(frozen=True)
class ServeSession:
    """One serve run: what was asked, the model file's header, the machine and the plan for it,
    where to report, and the event SIGTERM/SIGINT set. ``history_key`` names this model × engine
    × request in the load history (None: the load is not recorded)."""

    options: ServeOptions
    model: ServedModel
    machine: Machine
    check: SourceCheck
    stop: threading.Event
    say: Say
    on_ready: OnReady
    history_key: dict[str, object] | None = None


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
    #: What a request to it must carry (the API key), if anything.
    headers: dict[str, str] | None = None


def read_projector(source: str) -> ProjectorSpec:
    """The projector an mmproj GGUF (path, URL or hf:// file; header only) describes.

    Raises:
        UsageError: it is not a projector, or its encoder sizes make no sense.
    """
    try:
        return projector_spec(read_headers(source))
    except ValueError as exc:
        raise UsageError(f"--mmproj: {exc}", hint="give the mmproj GGUF published with the model (general.architecture 'clip')") from exc


def plan_for(
    options: ServeOptions,
    machine: Machine,
    request: RunRequest | None = None,
    template: TemplateChoice | None = None,
    host_speed: DeviceSpeed | None = None,
    model: ServedModel | None = None,
) -> SourceCheck:
    """The plan for ``options`` on ``machine`` (``request``: engine-specific defaults;
    ``template``: the chat template chosen, None: the model's default; ``host_speed``: this
    CPU's calibration, for the speed estimate; ``model``: its header as read, None: read it).

    Raises:
        TierlocalError: it does not fit.
    """
    model = model or read_model(options.model)
    ask = PlanAsk(
        parse_ctx(options.ctx) if options.ctx is not None else constants.DEFAULT_CTX,
        parse_parallel(options.slots),
        options.run_request(request),
        options.users,
        up_to_training=options.ctx is None,
        # llama-server (Ollama's runner too) caps each slot at the trained context, unless told to stretch RoPE past it
        cap_at_training=options.engine != "python" and not stretches_rope(options.engine_args),
    )
    where = PlanInputs(machine, host_speed, machine_gpu_speed(machine))
    check = check_model(str(options.model), model.spec, model.summary, where, ask, template=template)
    if check.estimate is None or not check.estimate.fits:
        raise TierlocalError(
            f"{options.model}: does not fit this machine as asked ({check.reason or 'no plan'}); nothing was started",
            hint="lower --ctx or --parallel, or see `tierlocal check` for what fits",
        )
    return check


def stretches_rope(engine_args: tuple[str, ...]) -> bool:
    """Whether llama-server options stretch RoPE with YaRN and a scale (``--rope-scaling yarn
    --rope-scale F``), which raises its cap on a slot's context past the trained one."""
    words = " ".join(engine_args).replace("=", " ").split()
    return any(a == "--rope-scaling" and b == "yarn" for a, b in itertools.pairwise(words)) and "--rope-scale" in words


def detected_machine(options: ServeOptions, *, llama_server: Path | None = None) -> Machine:
    """The planner's view of this machine as detected (asking ``llama_server`` for its devices,
    if given), with the ``--gpu`` override — refused when it names more GPUs than the machine
    has, since nothing would be allocated on a GPU that is not there.

    Raises:
        UsageError: ``--gpu`` plans GPUs the engine would not find.
    """
    hardware = detect(llama_server=llama_server)
    present = len(hardware.gpus)
    overridden = with_gpu_override(hardware, options.gpus)
    if options.gpus and len(overridden.gpus) > present:
        seen = f"{present} GPU(s)" if present else "no GPU"
        raise UsageError(
            f"--gpu {' '.join(options.gpus)} plans {len(overridden.gpus)} GPU(s), and the engine here sees {seen}: nothing was started",
            hint="drop --gpu to plan for this machine (`tierlocal check --gpu …` plans another one), or build an engine for the GPU: tierlocal "
            "engine build",
        )
    return machine_for(overridden, load_host_defaults())


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


def last_log_lines(child: EngineChild, report: LoadReport, count: int = 8) -> str:
    """The known failure lines of the load log, else the child's last ``count`` lines."""
    if report.failures:
        return " | ".join(failure.line for failure in report.failures[:3])
    lines = [line for line in child.lines() if line.strip()]
    return " | ".join(lines[-count:])


def launch(
    session: ServeSession, engine: str, version: str, argv: list[str], env: dict[str, str], ready_path: str, headers: dict[str, str] | None = None
) -> Launched | int | AllocationFailed:
    """Start an engine with its output drained into the log and the load-log parser, and wait
    (bounded by the model's size, EXTEND_TIMEOUT_USEC to systemd meanwhile) until ``ready_path``
    answers 200. Returns the launched engine, 130 when stopped while loading, or the
    allocation failure to plan around.

    Raises:
        EngineFailed: it died or never answered.
    """
    options = session.options
    log = log_path(engine, options.port)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    parser = LoadLogParser()
    child = start_child(argv, log, env=env, on_line=parser.feed)
    session.say(f"started {engine} (pid {child.pid}): {' '.join(argv)}")
    url = f"http://{'127.0.0.1' if options.host in ('0.0.0.0', '::') else options.host}:{options.port}"
    starting = {"url": url, "pid": os.getpid(), "engine": engine, "engine_pid": child.pid, "log": str(log)}
    write_starting(options.port, {**starting, "phase": "loading the model"})
    timeout = options.load_timeout_s or constants.LOAD_TIMEOUT_BASE_S + session.check.file_bytes / constants.LOAD_BYTES_PER_S
    last_extend = [0.0]

    def waiting(waited: float) -> None:
        if waited - last_extend[0] >= 10:
            last_extend[0] = waited
            notify(f"EXTEND_TIMEOUT_USEC={constants.EXTEND_TIMEOUT_S * 1_000_000}", f"STATUS=loading {options.model.name} ({waited:.0f} s)")

    readiness = child.wait_ready(url + ready_path, timeout, on_waiting=waiting, stop=session.stop, headers=headers)
    if readiness.ready:
        write_starting(options.port, {**starting, "phase": "checking the load against the plan and waiting for a first answer"})
        return Launched(engine, version, child, parser, argv, url, log, headers)
    report = parser.report()
    if readiness.exit_code is None:
        child.stop()
        if session.stop.is_set():
            session.say("stopped while loading")
            return 130
        raise EngineFailed(
            f"{engine} did not become ready within {timeout:.0f} s; stopped it", hint=f"see {log}; raise --load-timeout for a slow disk"
        )
    details = last_log_lines(child, report)
    if report.failure("port_in_use"):
        raise EngineFailed(f"{engine} could not listen on {options.host}:{options.port}: another program holds it", hint="choose another --port")
    if report.failure("chat_template"):
        raise EngineFailed(f"{engine} could not use the chat template: {details}", hint=f"{TEMPLATE_HINT}; see {log}")
    if report.failure("alloc_failed"):
        return AllocationFailed(f"{engine} could not allocate memory while loading: {details}", report, hint=f"see {log}")
    raise EngineFailed(f"{engine} exited with {readiness.exit_code} while loading: {details}", hint=f"see {log}")


def supervise_verified(session: ServeSession, launched: Launched, extra: dict[str, object] | None = None) -> int:
    """Once an engine is ready: :func:`verify_ready`, notify systemd, report the state, and
    supervise the engine until stopped."""
    state = verify_ready(session, launched, extra)
    held = state.delta.get("verified") is True
    notify("READY=1", f"STATUS=serving {session.options.model.name} on {launched.url}" + ("" if held else " (plan not held: see tierlocal status)"))
    session.on_ready(state)
    return supervise(session, launched)


def verify_ready(session: ServeSession, launched: Launched, extra: dict[str, object] | None = None) -> ServeState:
    """Verify a ready engine's load against the plan, send it one short chat (it must answer),
    write the state file `tierlocal status` reads (with ``extra`` added) and record the load."""
    check, machine, options = session.check, session.machine, session.options
    assert check.estimate is not None
    planned = check.estimate
    report = launched.parser.report()
    spec = session.model.spec

    def speed_for_ngl(ngl: int) -> float | None:
        return estimate_run(spec, replace(planned.request, ngl=ngl), machine).est_decode_tokens_per_s

    verification = verify_load(planned, report, speed_for_ngl=speed_for_ngl)
    role = session.options.role
    first_answer_s = first_answer(launched.engine, launched.url, launched.child, planned, str(launched.log_path), headers=launched.headers, role=role)
    session.say(f"{launched.engine} answered a first short {'chat' if role in ('chat', 'code') else role + ' request'} in {first_answer_s:.1f} s")
    state = ServeState(
        url=launched.url,
        pid=os.getpid(),
        engine=launched.engine,
        engine_pid=launched.child.pid,
        log=str(launched.log_path),
        plan=check.to_json(),
        actual=report.to_json(),
        delta=verification.to_json(),
        first_answer_s=round(first_answer_s, 3),
        engine_version=launched.version,
        argv=tuple(launched.argv),
        estimate_correction_bytes=machine.gpu_compute_correction_bytes,
        details=extra or {},
    )
    write_state(options.port, state)
    gpu_delta = next((delta for delta in verification.devices if delta.name != "host"), None)
    if session.history_key is not None and gpu_delta is not None and verification.layers_actual == verification.layers_planned:
        record_load(session.history_key, state, gpu_delta.planned_bytes, gpu_delta.actual_bytes, machine.gpu_compute_correction_bytes)
    return state


def supervise(session: ServeSession, launched: Launched) -> int:
    """Keep the engine running until stopped (0); an engine that exits on its own is an error.

    Raises:
        EngineFailed: the engine stopped unexpectedly (with its last log lines).
    """
    child = launched.child
    while not session.stop.is_set():
        if child.process.poll() is not None:
            child.wait_output()
            code = child.process.returncode
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            raise EngineFailed(
                f"{launched.engine} stopped unexpectedly ({how}): {last_log_lines(child, launched.parser.report())}", hint=f"see {launched.log_path}"
            )
        session.stop.wait(0.5)
    notify("STOPPING=1")
    session.say(f"stopping {launched.engine}")
    child.stop()
    if child.killed:
        session.say(f"{launched.engine} did not stop within {constants.ENGINE_STOP_GRACE_S:.0f} s of SIGTERM; killed it")
    return 0

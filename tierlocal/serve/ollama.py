"""`tierlocal serve --engine ollama`: the same plan, realised through Ollama.

Server-wide settings (OLLAMA_NUM_PARALLEL, OLLAMA_CONTEXT_LENGTH, OLLAMA_MAX_QUEUE,
OLLAMA_KV_CACHE_TYPE, OLLAMA_FLASH_ATTENTION) can only be set on a server we start; a
running one at OLLAMA_HOST is used as it is, and tierlocal says which of the plan's
settings it could not apply. The model is created from the local GGUF through the blobs and
create API with num_ctx and num_gpu as its parameters, loaded, and checked with /api/ps
(context_length, size_vram) and — on a server we started — with llama-server's own load
lines, which Ollama 0.30+ forwards into its log.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import ollama

from .. import constants
from ..engines.loadlog import LoadLogParser
from ..engines.process import EngineChild, start_child
from ..engines.prompt_formats import PROBE_MESSAGE, TemplateChoice
from ..errors import EngineFailed, UsageError
from ..plan.source import SourceCheck
from .exposure import check_ollama_exposure
from .probe import crash_hint
from .run import OnReady, Say, ServeOptions, ServeSession, detected_machine, plan_for, read_model, stop_on_signals
from .state import ServeState, clear_state, log_path, write_starting, write_state
from .systemd import notify
from .template import TEMPLATE_HINT, resolve_template

__all__ = ["serve_ollama", "ollama_model_name", "plan_for_ollama"]


@dataclass(frozen=True)
class _Server:
    """The Ollama server a session talks to: its URL, the child we started (None: one that
    was already running), the parser fed its log, and the log's path."""

    url: str
    child: EngineChild | None
    parser: LoadLogParser
    log: Path

    def hint(self, otherwise: str) -> str:
        return f"see {self.log}" if self.child else otherwise


def ollama_model_name(model: Path) -> str:
    """The Ollama model name tierlocal creates for a GGUF file: its stem, in Ollama's alphabet."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", model.stem.lower()).strip("-._") or "model"
    return f"tierlocal-{stem}"[:80]


def plan_for_ollama(options: ServeOptions) -> SourceCheck:
    """The plan on this machine as detected (Ollama brings its own llama-server).

    Raises:
        TierlocalError: it does not fit.
    """
    return plan_for(options, detected_machine(options))


def serve_ollama(options: ServeOptions, *, say: Say, on_ready: OnReady) -> int:
    """Create, load and verify ``options.model`` in Ollama (or load ``options.ollama_tag`` as
    it is); keep a server we started running until SIGTERM/SIGINT. Returns the exit code.

    Raises:
        UsageError: a non-loopback address, no model file, no ollama binary to start.
        TierlocalError: the plan does not fit; Ollama failed (EngineFailed).
    """
    check_ollama_exposure(options.host)
    if not options.model.is_file():
        raise UsageError(f"{options.model}: no such model file", hint="give a GGUF path, or a catalog name / hf:// source with --pull")
    machine = detected_machine(options)
    model = read_model(options.model)
    template = None
    if options.ollama_tag is None:
        template = resolve_template(options.chat_template, model.summary, None, engine="ollama")
        say(f"chat template: {_ollama_note(template)}")
        if template.warning:
            say(f"warning: {template.warning}")
    check = plan_for(options, machine, template=template, model=model)
    if check.context_note:
        say(f"warning: {check.context_note}")
    with stop_on_signals() as stop:
        session = ServeSession(options, model, machine, check, stop, say, on_ready)
        server = _server(session)
        client = ollama.Client(host=server.url)
        try:
            return _create_load_verify(session, server, client)
        finally:
            client._client.close()
            if server.child is not None:
                say("stopping ollama serve")
                server.child.stop()
            clear_state(options.port)


def _find_ollama(explicit: str | None) -> Path:
    candidate = explicit or shutil.which("ollama", path=constants.search_path())
    if not candidate or not Path(candidate).is_file():
        raise UsageError("no ollama binary found" + (f" at {explicit}" if explicit else ""), hint="install Ollama, or pass --ollama PATH")
    return Path(candidate)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/version", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _server(session: ServeSession) -> _Server:
    """The Ollama at the session's address, or one started there with the plan's settings."""
    options, settings = session.options, session.check.ollama
    assert settings is not None
    url = f"http://{options.host}:{options.port}"
    env_plan = dict(settings.env)
    parser = LoadLogParser()
    log = log_path("ollama", options.port)
    if _answers(url):
        session.say(
            f"using the Ollama already at {url}; its server settings are its own, so these planned ones are not applied: "
            + ", ".join(f"{key}={value}" for key, value in env_plan.items())
        )
        return _Server(url, None, parser, log)
    binary = _find_ollama(options.ollama_binary)
    env = {**constants.child_environment(), **env_plan, "OLLAMA_HOST": f"{options.host}:{options.port}"}
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    child = start_child([str(binary), "serve"], log, env=env, on_line=parser.feed)
    session.say(f"started ollama serve (pid {child.pid}) on {url} with " + " ".join(f"{key}={value}" for key, value in env_plan.items()))
    write_starting(
        options.port,
        {
            "url": url,
            "pid": os.getpid(),
            "engine": "ollama",
            "engine_pid": child.pid,
            "log": str(log),
            "phase": "starting Ollama and loading the model",
        },
    )
    readiness = child.wait_ready(f"{url}/api/version", constants.OLLAMA_START_TIMEOUT_S, stop=session.stop)
    if not readiness.ready:
        child.stop()
        raise EngineFailed(f"ollama serve did not start: {' | '.join(child.lines()[-5:])}", hint=f"see {log}")
    return _Server(url, child, parser, log)


def _ollama_note(template: TemplateChoice) -> str:
    if template.prompt_format is not None and template.source != "header":
        return (
            template.note.replace("llama-server's built-in", "a Go TEMPLATE for")
            + "; its stop strings: "
            + ", ".join(template.prompt_format.ollama_stop)
        )
    return template.note.replace("llama-server", "Ollama")


def _create_and_load(session: ServeSession, server: _Server, client: ollama.Client, name: str) -> ollama.ProcessResponse.Model:
    """Create ``name`` from the GGUF (unless serving a tag as it is) with the chosen prompt
    format when the file has none, load it with the plan's num_ctx and num_gpu, and return
    what ``/api/ps`` says of it."""
    options, settings, template = session.options, session.check.ollama, session.check.template
    assert settings is not None
    num_ctx, num_gpu = settings.num_ctx, settings.num_gpu
    try:
        if options.ollama_tag is None:
            session.say(f"creating {name} from {options.model.name} (num_ctx {num_ctx}, num_gpu {num_gpu})")
            digest = client.create_blob(options.model)
            parameters: dict[str, object] = {"num_ctx": num_ctx, "num_gpu": num_gpu}
            go_template = None
            if template.prompt_format is not None and template.source != "header":
                go_template, parameters["stop"] = template.prompt_format.ollama_template, list(template.prompt_format.ollama_stop)
            client.create(model=name, files={options.model.name: digest}, template=go_template, parameters=parameters)
        else:
            session.say(f"loading the tag {name} as it is (num_ctx {num_ctx}, num_gpu {num_gpu} as load options)")
        client.generate(model=name, prompt="", keep_alive=-1, options={"num_ctx": num_ctx, "num_gpu": num_gpu})
        loaded = next(
            (
                entry
                for entry in client.ps().models
                if entry.model in (name, f"{name}:latest") or (":" not in name and str(entry.model).startswith(f"{name}:"))
            ),
            None,
        )
    except ollama.ResponseError as exc:
        raise EngineFailed(f"Ollama refused {name}: {exc.error}", hint=server.hint("see the Ollama server's log")) from None
    except (ConnectionError, httpx.HTTPError) as exc:
        raise EngineFailed(f"lost the Ollama server at {server.url}: {type(exc).__name__}", hint=server.hint("is it running?")) from None
    if loaded is None:
        raise EngineFailed(f"Ollama does not list {name} as loaded after loading it", hint=server.hint("see `ollama ps`"))
    return loaded


def _verify(check: SourceCheck, server: _Server, loaded: ollama.ProcessResponse.Model) -> tuple[list[str], list[str]]:
    """(problems, warnings): the loaded model against the plan, and — on a server we started —
    the llama-server load lines it forwarded."""
    assert check.estimate is not None and check.ollama is not None
    num_ctx, num_gpu = check.ollama.num_ctx, check.ollama.num_gpu
    vram = loaded.size_vram or 0
    problems, warnings = [], []
    if loaded.context_length != num_ctx:
        problems.append(f"planned num_ctx {num_ctx}, Ollama loaded {loaded.context_length}")
    if num_gpu == 0 and vram > 0:
        problems.append(f"planned no GPU layers, Ollama put {vram / 2**20:.0f} MiB in VRAM")
    if num_gpu > 0 and not vram:
        warnings.append("planned layers on the GPU, but Ollama reports nothing in VRAM: it runs from system RAM")
    if server.child is None:
        return problems, warnings
    report, estimate, params = server.parser.report(), check.estimate, check.estimate.params
    if report.layers_offloaded is not None and report.layers_offloaded != estimate.layers_offloaded:
        problems.append(f"planned {estimate.layers_offloaded} layers on the GPU, llama.cpp (under Ollama) offloaded {report.layers_offloaded}")
    if report.n_ctx is not None and report.n_ctx != params.n_ctx_padded:
        problems.append(f"planned a context of {params.n_ctx_padded} tokens, Ollama started llama-server with {report.n_ctx}")
    if report.n_seq_max is not None and report.n_seq_max != params.n_seq_max:
        problems.append(f"planned {params.n_seq_max} slots, Ollama started llama-server with {report.n_seq_max}")
    return problems, warnings


def _state(
    check: SourceCheck, server: _Server, name: str, loaded: ollama.ProcessResponse.Model, template: dict[str, object], first_answer_s: float
) -> ServeState:
    """The state file's contents (``tierlocal status``, ``serve --json``)."""
    assert check.estimate is not None
    problems, warnings = _verify(check, server, loaded)
    first = check.estimate.devices[0]
    planned_gpu = None if first.backend == "cpu" else first.weights_bytes + first.kv_bytes + first.compute_bytes
    actual = server.parser.report().to_json() if server.child is not None else {}
    actual.update({"ollama_model": name, "size_bytes": loaded.size, "size_vram_bytes": loaded.size_vram, "context_length": loaded.context_length})
    delta = {
        "planned_gpu_bytes": planned_gpu,
        "size_vram_bytes": loaded.size_vram,
        "verified": not problems,
        "problems": problems,
        "warnings": warnings,
    }
    return ServeState(
        url=server.url,
        pid=os.getpid(),
        engine="ollama",
        engine_pid=server.child.pid if server.child else None,
        log=str(server.log) if server.child else None,
        plan=check.to_json(),
        actual=actual,
        delta=delta,
        first_answer_s=first_answer_s,
        details={"chat_template": template},
    )


def _checked_template(session: ServeSession, server: _Server, client: ollama.Client, name: str) -> dict[str, object]:
    """The template Ollama holds for ``name``; one that is not the Go template tierlocal gave
    it is an error (EngineFailed)."""
    template = session.check.template
    try:
        held = client.show(name).template
    except (ollama.ResponseError, ConnectionError, httpx.HTTPError) as exc:
        raise EngineFailed(f"Ollama did not show {name}: {type(exc).__name__}", hint=server.hint("see the Ollama server's log")) from None
    if session.options.ollama_tag is not None:
        return {"source": "ollama-tag", "note": "the tag's own template, as Ollama holds it", "ollama_template": held}
    expected = template.prompt_format.ollama_template if template.prompt_format is not None and template.source != "header" else None
    if expected is not None and held != expected:
        raise EngineFailed(f"Ollama holds another template for {name} than the {template.family} one tierlocal created it with", hint=TEMPLATE_HINT)
    return {**template.to_json(), "header": session.check.chat_template.to_json(), "ollama_template": held}


def _first_answer(session: ServeSession, server: _Server, client: ollama.Client, name: str) -> float:
    """Seconds Ollama took to answer one short chat; ready means it answered.

    Raises:
        EngineFailed: it did not (with the flag to try when flash attention was on a device).
    """
    settings = session.check.ollama
    assert settings is not None
    # The load's own num_ctx/num_gpu: other options would make Ollama load the model again.
    options = {"num_ctx": settings.num_ctx, "num_gpu": settings.num_gpu, "num_predict": constants.FIRST_ANSWER_TOKENS, "temperature": 0}
    started = time.monotonic()
    try:
        client.chat(model=name, messages=[{"role": "user", "content": PROBE_MESSAGE}], options=options)
    except (ollama.ResponseError, ConnectionError, httpx.HTTPError) as exc:
        detail = exc.error if isinstance(exc, ollama.ResponseError) else type(exc).__name__
        assert session.check.estimate is not None
        raise EngineFailed(
            f"Ollama could not answer a first short chat with {name}: {detail}", hint=crash_hint(session.check.estimate, str(server.log))
        ) from None
    elapsed = time.monotonic() - started
    session.say(f"Ollama answered a first short chat in {elapsed:.1f} s")
    return round(elapsed, 3)


def _create_load_verify(session: ServeSession, server: _Server, client: ollama.Client) -> int:
    name = session.options.ollama_tag or ollama_model_name(session.options.model)
    loaded = _create_and_load(session, server, client, name)
    template = _checked_template(session, server, client, name)
    state = _state(session.check, server, name, loaded, template, _first_answer(session, server, client, name))
    write_state(session.options.port, state)
    notify("READY=1", f"STATUS=serving {name} through Ollama on {server.url}")
    session.on_ready(state)
    while not session.stop.is_set():
        if server.child is not None and server.child.process.poll() is not None:
            raise EngineFailed(f"ollama serve stopped unexpectedly (exit {server.child.process.returncode})", hint=f"see {server.log}")
        session.stop.wait(0.5)
    notify("STOPPING=1")
    return 0

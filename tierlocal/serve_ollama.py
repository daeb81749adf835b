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

import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import ollama

from . import constants
from ._check_source import SourceCheck, source_check_json
from .errors import UsageError
from .loadlog import LoadLogParser
from .addresses import is_loopback
from .serve import EngineFailed, plan_for, actual_json, state_path
from .sdnotify import notify
from .supervise import EngineChild, start_child

__all__ = ["OllamaServeOptions", "check_ollama_exposure", "serve_ollama", "ollama_model_name", "ollama_store_blob", "plan_for_ollama"]

#: Seconds to wait for `ollama serve` to answer /api/version.
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class OllamaServeOptions:
    """Where Ollama listens and which binary to start when none is running there."""

    host: str = "127.0.0.1"
    port: int = 11434
    ollama_binary: str | None = None
    #: Serve this Ollama tag as it is (its GGUF was planned) instead of creating a model.
    tag: str | None = None


def ollama_model_name(model: Path) -> str:
    """The Ollama model name tierlocal creates for a GGUF file: its stem, in Ollama's alphabet."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", model.stem.lower()).strip("-._") or "model"
    return f"tierlocal-{stem}"[:80]


#: The manifest layer that holds a model's GGUF.
_MODEL_LAYER = "application/vnd.ollama.image.model"
#: Longest manifest read, in bytes.
_MAX_MANIFEST_BYTES = 1 << 20


def ollama_store_blob(tag: str) -> Path:
    """The GGUF an Ollama tag names in the local store ($OLLAMA_MODELS): its manifest
    (manifests/HOST/NAMESPACE/NAME/TAG, defaults registry.ollama.ai, library, latest) lists the
    model layer, whose blob is blobs/sha256-DIGEST.

    Raises:
        UsageError: the tag is malformed or not in the store.
    """
    name, _, version = tag.partition(":")
    parts = name.split("/")
    if not name or len(parts) > 3 or any(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", part) for part in parts) or (version and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", version)):
        raise UsageError(f"ollama://{tag} is not an Ollama tag", hint="e.g. ollama://gemma3:270m or ollama://OWNER/NAME:TAG")
    if len(parts) == 1:
        parts = ["registry.ollama.ai", "library", *parts]
    elif len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    store = constants.ollama_models_dir()
    manifest = store.joinpath("manifests", *parts, version or "latest")
    try:
        with manifest.open("rb") as handle:
            layers = json.loads(handle.read(_MAX_MANIFEST_BYTES)).get("layers", [])
    except (OSError, ValueError, AttributeError):
        raise UsageError(f"ollama://{tag} is not in Ollama's store ({manifest} is missing or unreadable)", hint=f"pull it first: tierlocal pull ollama://{tag}") from None
    digest = next((layer.get("digest") for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == _MODEL_LAYER), None)
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UsageError(f"ollama://{tag}: its manifest has no model layer", hint="is it a model (not an embedding adapter or template only)?")
    blob = store / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise UsageError(f"ollama://{tag}: its model blob {blob} is missing", hint=f"pull it again: tierlocal pull ollama://{tag}")
    return blob


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


def check_ollama_exposure(host: str) -> None:
    """Ollama has no authentication: it is only ever bound to loopback."""
    if not is_loopback(host):
        raise UsageError(
            f"refusing to expose Ollama on {host}: Ollama has no API keys",
            hint="bind 127.0.0.1 and put `tierlocal gateway` (or a reverse proxy with auth) in front",
        )


def serve_ollama(
    check: SourceCheck,
    model: Path,
    options: OllamaServeOptions,
    *,
    stop: threading.Event,
    say: Callable[[str], None],
    on_ready: Callable[[dict[str, object]], None],
) -> int:
    """Create, load and verify ``model`` in Ollama per ``check``; keep a server we started
    running until ``stop``. Returns the exit code."""
    assert check.estimate is not None
    check_ollama_exposure(options.host)
    url = f"http://{options.host}:{options.port}"
    settings = check.ollama
    env_plan: dict[str, str] = dict(settings["env"])  # type: ignore[arg-type]
    child: EngineChild | None = None
    parser = LoadLogParser()
    log_path = constants.run_dir() / f"ollama-{options.port}.log"
    if _answers(url):
        say(f"using the Ollama already at {url}; its server settings are its own, so these planned ones are not applied: "
            + ", ".join(f"{key}={value}" for key, value in env_plan.items()))  # fmt: skip
    else:
        binary = _find_ollama(options.ollama_binary)
        env = {**constants.child_environment(), **env_plan, "OLLAMA_HOST": f"{options.host}:{options.port}"}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        child = start_child([str(binary), "serve"], log_path, env=env, on_line=parser.feed)
        say(f"started ollama serve (pid {child.pid}) on {url} with " + " ".join(f"{key}={value}" for key, value in env_plan.items()))
        readiness = child.wait_ready(f"{url}/api/version", START_TIMEOUT_S, stop=stop)
        if not readiness.ready:
            child.stop()
            raise EngineFailed(f"ollama serve did not start: {' | '.join(child.lines()[-5:])}", hint=f"see {log_path}")
    client = ollama.Client(host=url)
    try:
        return _create_load_verify(client, check, model, url, child, parser, log_path, stop=stop, say=say, on_ready=on_ready, tag=options.tag)
    finally:
        client._client.close()
        if child is not None:
            say("stopping ollama serve")
            child.stop()
        state_path(options.port).unlink(missing_ok=True)


def _create_load_verify(
    client: ollama.Client,
    check: SourceCheck,
    model: Path,
    url: str,
    child: EngineChild | None,
    parser: LoadLogParser,
    log_path: Path,
    *,
    stop: threading.Event,
    say: Callable[[str], None],
    on_ready: Callable[[dict[str, object]], None],
    tag: str | None = None,
) -> int:
    assert check.estimate is not None
    num_ctx, num_gpu = int(check.ollama["num_ctx"]), int(check.ollama["num_gpu"])  # type: ignore[call-overload]
    name = tag or ollama_model_name(model)
    try:
        if tag is None:
            say(f"creating {name} from {model.name} (num_ctx {num_ctx}, num_gpu {num_gpu})")
            digest = client.create_blob(model)
            client.create(model=name, files={model.name: digest}, parameters={"num_ctx": num_ctx, "num_gpu": num_gpu})
        else:
            say(f"loading the tag {tag} as it is (num_ctx {num_ctx}, num_gpu {num_gpu} as load options)")
        client.generate(model=name, prompt="", keep_alive=-1, options={"num_ctx": num_ctx, "num_gpu": num_gpu})
        loaded = next((entry for entry in client.ps().models if entry.model in (name, f"{name}:latest") or (":" not in name and entry.model.startswith(f"{name}:"))), None)
    except ollama.ResponseError as exc:
        raise EngineFailed(f"Ollama refused {name}: {exc.error}", hint=f"see {log_path}" if child else "see the Ollama server's log") from None
    except (ConnectionError, httpx.HTTPError) as exc:
        raise EngineFailed(f"lost the Ollama server at {url}: {type(exc).__name__}", hint=f"see {log_path}" if child else "is it running?") from None
    if loaded is None:
        raise EngineFailed(f"Ollama does not list {name} as loaded after loading it", hint=f"see {log_path}" if child else "see `ollama ps`")
    report = parser.report()
    problems, warnings = [], []
    if loaded.context_length != num_ctx:
        problems.append(f"planned num_ctx {num_ctx}, Ollama loaded {loaded.context_length}")
    planned_gpu = check.estimate.devices[0] if check.estimate.devices[0].backend != "cpu" else None
    if num_gpu == 0 and (loaded.size_vram or 0) > 0:
        problems.append(f"planned no GPU layers, Ollama put {loaded.size_vram / 2**20:.0f} MiB in VRAM")
    if num_gpu > 0 and not loaded.size_vram:
        warnings.append("planned layers on the GPU, but Ollama reports nothing in VRAM: it runs from system RAM")
    if child is not None and report.layers_offloaded is not None and report.layers_offloaded != check.estimate.layers_offloaded:
        problems.append(f"planned {check.estimate.layers_offloaded} layers on the GPU, llama.cpp (under Ollama) offloaded {report.layers_offloaded}")
    params = check.estimate.params
    if child is not None and report.n_ctx is not None and report.n_ctx != params.n_ctx_padded:
        problems.append(f"planned a context of {params.n_ctx_padded} tokens, Ollama started llama-server with {report.n_ctx}")
    if child is not None and report.n_seq_max is not None and report.n_seq_max != params.n_seq_max:
        problems.append(f"planned {params.n_seq_max} slots, Ollama started llama-server with {report.n_seq_max}")
    actual = actual_json(report) if child is not None else {}
    actual.update({"ollama_model": name, "size_bytes": loaded.size, "size_vram_bytes": loaded.size_vram, "context_length": loaded.context_length})
    payload: dict[str, object] = {
        "url": url,
        "pid": os.getpid(),
        "engine": "ollama",
        "engine_pid": child.pid if child else None,
        "log": str(log_path) if child else None,
        "plan": source_check_json(check),
        "actual": actual,
        "delta": {
            "planned_gpu_bytes": None if planned_gpu is None else planned_gpu.weights_bytes + planned_gpu.kv_bytes + planned_gpu.compute_bytes,
            "size_vram_bytes": loaded.size_vram,
            "verified": not problems,
            "problems": problems,
            "warnings": warnings,
        },
    }
    state = state_path(int(url.rsplit(":", 1)[1]))
    state.parent.mkdir(parents=True, exist_ok=True)
    temporary = state.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, state)
    notify("READY=1", f"STATUS=serving {name} through Ollama on {url}")
    on_ready(payload)
    while not stop.is_set():
        if child is not None and child.process.poll() is not None:
            raise EngineFailed(f"ollama serve stopped unexpectedly (exit {child.process.returncode})", hint=f"see {log_path}")
        stop.wait(0.5)
    notify("STOPPING=1")
    return 0


def plan_for_ollama(model: Path, gpus: tuple[str, ...], ctx: str, parallel: str) -> SourceCheck:
    """The plan on this machine as detected (Ollama brings its own llama-server)."""
    from ._check_source import machine_for
    from .catalog import load_host_defaults
    from .hardware import detect, with_gpu_override
    from .serve import ServeOptions

    hardware = with_gpu_override(detect(), gpus)
    return plan_for(ServeOptions(model=model, ctx=ctx, parallel=parallel), hardware, machine_for(hardware, load_host_defaults()))

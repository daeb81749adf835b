"""``tierlocal check SOURCE``: the per-device estimate and plan for one GGUF model on this
machine (or the one ``--gpu`` describes), as a table or the documented JSON object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table

from .catalog import HostDefaults
from .errors import UsageError
from .estimate import Machine, RunEstimate, RunRequest, max_context, max_parallel, plan_run
from .gguf import GGUFHeader, summarize
from .hardware import Hardware
from .model import model_spec
from .units import format_bytes

__all__ = ["SourceCheck", "check_source", "source_check_json", "render_source_check", "parse_ctx", "parse_parallel"]


@dataclass(frozen=True)
class SourceCheck:
    """A planned run of one model: the estimate, and what it came from."""

    source: str
    architecture: str
    params: int
    file_bytes: int
    estimate: RunEstimate | None
    reason: str | None
    command: list[str]
    ollama: dict[str, object]
    speed: dict[str, object]
    suggestion: dict[str, object] | None


def parse_ctx(text: str) -> int | None:
    """``--ctx``: tokens, or ``max`` (None) to solve for the largest that fits."""
    if text == "max":
        return None
    if not text.isdigit() or not 256 <= int(text) <= 1 << 24:
        raise UsageError(f"--ctx {text!r} is not a context size", hint="give tokens (256 to 16777216) or 'max'")
    return int(text)


def parse_parallel(text: str) -> int | str | None:
    """``--parallel``: slots, ``auto`` (llama-server's 4 unified slots: None) or ``max``."""
    if text in ("max",):
        return "max"
    if text == "auto":
        return None
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise UsageError(f"--parallel {text!r} is not a slot count", hint="give 1 to 256, 'auto' or 'max'")
    return int(text)


def machine_for(hardware: Hardware, host: HostDefaults) -> Machine:
    """The largest GPU (or none) and the host, with the planning assumptions."""
    gpu = max(hardware.gpus, key=lambda device: device.free_bytes) if hardware.gpus else None
    return Machine(
        gpu_name=gpu.name if gpu else None,
        gpu_backend=gpu.backend if gpu else None,
        gpu_total_bytes=gpu.total_bytes if gpu else 0,
        gpu_free_bytes=gpu.free_bytes if gpu else 0,
        gpu_bandwidth=gpu.bandwidth_bytes_per_s if gpu else None,
        host_total_bytes=hardware.ram_total_bytes,
        host_free_bytes=hardware.ram_available_bytes,
        host_bandwidth=host.assumed_ram_bandwidth_bytes_per_s,
        gpu_overhead_bytes=host.gpu_runtime_overhead_bytes if gpu else 0,
        margin_bytes=host.fit_margin_bytes,
        max_tensor_bytes=gpu.max_tensor_bytes if gpu else None,
    )


def _command(model_path: str, estimate: RunEstimate, *, host_only: bool = False) -> list[str]:
    request, params = estimate.request, estimate.params
    argv = ["llama-server", "-m", model_path, "-c", str(params.n_ctx_padded)]
    argv += ["-dev", "none"] if host_only else []
    argv += ["-np", str(params.n_seq_max)] if not params.kv_unified else []
    argv += ["-ngl", str(request.ngl), "-fa", "on" if request.flash_attn else "off"]
    argv += ["--n-cpu-moe", str(request.n_cpu_moe)] if request.n_cpu_moe else []
    if request.cache_type_k != "f16" or request.cache_type_v != "f16":
        argv += ["-ctk", request.cache_type_k, "-ctv", request.cache_type_v]
    if request.n_ubatch != 512:
        argv += ["-ub", str(request.n_ubatch)]
    return argv


def _ollama(estimate: RunEstimate) -> dict[str, object]:
    params, request = estimate.params, estimate.request
    env = {
        "OLLAMA_NUM_PARALLEL": str(params.n_seq_max),
        "OLLAMA_CONTEXT_LENGTH": str(params.n_ctx_seq),
        # Waiting requests beyond this get 503 at once (Ollama's default, 512, queues for minutes).
        "OLLAMA_MAX_QUEUE": str(max(8, 4 * params.n_seq_max)),
        "OLLAMA_FLASH_ATTENTION": "1" if request.flash_attn else "0",
    }
    if request.cache_type_k != "f16":
        env["OLLAMA_KV_CACHE_TYPE"] = request.cache_type_k
    settings: dict[str, object] = {"num_gpu": request.ngl, "num_ctx": params.n_ctx_seq, "env": env}
    if request.n_cpu_moe:
        settings["note"] = "Ollama has no --n-cpu-moe; it would offload whole layers instead"
    return settings


def _speed(estimate: RunEstimate, machine: Machine) -> dict[str, object]:
    """Decode speed by memory bandwidth, the GPU part and the part spilled to RAM apart."""
    gpu_read, host_read = estimate.gpu_read_bytes_per_token, estimate.host_read_bytes_per_token
    speed: dict[str, object] = {
        "gpu_read_bytes_per_token": gpu_read,
        "host_read_bytes_per_token": host_read,
        "gpu_bandwidth_bytes_per_s": machine.gpu_bandwidth,
        "host_bandwidth_bytes_per_s": machine.host_bandwidth,
        "host_bandwidth_assumed": True,
        "all_on_gpu_tokens_per_s": None,
    }
    if machine.gpu_bandwidth and machine.gpu_name is not None:
        speed["all_on_gpu_tokens_per_s"] = round(machine.gpu_bandwidth / max(gpu_read + host_read, 1), 1)
    return speed


def _cache_suggestion(estimate: RunEstimate, plan: Callable[[RunRequest], RunEstimate | None]) -> dict[str, object] | None:
    """q8_0 K and V (which need flash attention) when they change the answer: more layers on
    the GPU, a fit where f16 does not, or a longer context."""
    request = estimate.request
    if request.cache_type_k != "f16" or request.cache_type_v != "f16":
        return None
    quantised = plan(replace(request, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, ngl=None, n_cpu_moe=None))
    if quantised is None:
        return None
    better = (
        quantised.fits and not estimate.fits
        or quantised.layers_offloaded > estimate.layers_offloaded
        or quantised.params.n_ctx_padded > estimate.params.n_ctx_padded
    )
    if not better:
        return None
    return {
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
        "flash_attn": "on",
        "ctx": quantised.params.n_ctx_padded,
        "layers_offloaded": quantised.layers_offloaded,
        "fits": quantised.fits,
    }


def check_source(
    source: str,
    headers: list[GGUFHeader],
    machine: Machine,
    *,
    ctx: int | None,
    parallel: int | str | None,
    request: RunRequest,
) -> SourceCheck:
    """Plan ``source`` on ``machine``: honour what the user set, solve for ``max``."""
    spec = model_spec(headers)
    summary = summarize(headers)
    if parallel == "max":
        base, reason = replace(request, ctx=ctx or 4096, parallel=1), "not even one slot fits"
    elif ctx is None:
        base, reason = replace(request, parallel=parallel), "not even 256 tokens of context fit"
    else:
        base, reason = replace(request, ctx=ctx, parallel=parallel), "it needs more memory than the machine has free"

    def planner(target: Machine) -> Callable[[RunRequest], RunEstimate | None]:
        def plan(r: RunRequest) -> RunEstimate | None:
            if parallel == "max":
                return max_parallel(spec, r, target)
            if ctx is None:
                return max_context(spec, r, target)
            return plan_run(spec, r, target)

        return plan

    plan = planner(machine)
    estimate = plan(base)
    host_only = False
    if (estimate is None or not estimate.fits) and machine.gpu_name is not None and not request.ngl:
        # A GPU too small even for its compute buffer and runtime: run on the CPU alone
        # (llama-server's -dev none), rather than call a model that fits in RAM unfit.
        cpu_machine = replace(machine, gpu_name=None, gpu_backend=None, gpu_total_bytes=0, gpu_free_bytes=0, gpu_bandwidth=None, gpu_overhead_bytes=0, max_tensor_bytes=None)
        fallback = planner(cpu_machine)(base)
        if fallback is not None and fallback.fits:
            estimate, plan, machine, host_only = fallback, planner(cpu_machine), cpu_machine, True
    if estimate is not None and estimate.fits:
        reason = None
    model_path = source if not source.startswith(("http://", "https://", "hf://")) else "<path after tierlocal pull>"
    return SourceCheck(
        source=source,
        architecture=spec.architecture,
        params=summary.params,
        file_bytes=summary.file_bytes,
        estimate=estimate,
        reason=reason,
        command=_command(model_path, estimate, host_only=host_only) if estimate else [],
        ollama=_ollama(estimate) if estimate else {},
        speed=_speed(estimate, machine) if estimate else {},
        suggestion=_cache_suggestion(estimate, plan) if estimate else None,
    )


def source_check_json(check: SourceCheck) -> dict[str, object]:
    """The documented ``check SOURCE --json`` object (bytes, tokens/s)."""
    estimate = check.estimate
    payload: dict[str, object] = {
        "model": {"source": check.source, "architecture": check.architecture, "params": check.params, "layers": estimate.layers_total - 1 if estimate else None, "file_bytes": check.file_bytes},
        "fits": bool(estimate and estimate.fits),
        "reason": check.reason,
    }
    if estimate is None:
        return payload
    request, params = estimate.request, estimate.params
    payload["request"] = {
        "ctx": params.n_ctx_padded,
        "ctx_per_slot": params.n_ctx_seq,
        "parallel": params.n_seq_max,
        "kv_unified": params.kv_unified,
        "ngl": request.ngl,
        "n_cpu_moe": request.n_cpu_moe or 0,
        "cache_type_k": request.cache_type_k,
        "cache_type_v": request.cache_type_v,
        "flash_attn": "on" if request.flash_attn else "off",
        "n_ubatch": request.n_ubatch,
    }
    payload["devices"] = [
        {
            "name": device.name,
            "backend": device.backend,
            "total_bytes": device.total_bytes,
            "free_bytes": device.free_bytes,
            "weights_bytes": device.weights_bytes,
            "kv_bytes": device.kv_bytes,
            "compute_bytes": device.compute_bytes,
            "output_bytes": device.output_bytes,
            "overhead_bytes": device.overhead_bytes,
            "total_needed_bytes": device.total_needed_bytes,
        }
        for device in estimate.devices
    ]
    payload["layers_offloaded"] = estimate.layers_offloaded
    payload["layers_total"] = estimate.layers_total
    payload["est_decode_tokens_per_s"] = None if estimate.est_decode_tokens_per_s is None else round(estimate.est_decode_tokens_per_s, 1)
    payload["speed"] = check.speed
    payload["command"] = check.command
    payload["ollama"] = check.ollama
    payload["suggestion"] = check.suggestion
    return payload


def render_source_check(check: SourceCheck) -> None:
    """One table per device, the verdict and the command line."""
    console = Console(highlight=False, width=None if Console().is_terminal else 120)
    estimate = check.estimate
    if estimate is None:
        console.print(f"[bold]{check.source}[/bold]: does not fit — {check.reason}.")
        return
    params = estimate.params
    console.print(
        f"[bold]{check.source}[/bold] ({check.architecture}): {params.n_ctx_padded:,} tokens of context, "
        f"{params.n_seq_max} slot(s){' sharing one KV cache' if params.kv_unified else ''}, "
        f"{estimate.layers_offloaded}/{estimate.layers_total} layers on the GPU"
        + (f", experts of the first {estimate.request.n_cpu_moe} blocks on the CPU" if estimate.request.n_cpu_moe else "")
    )
    table = Table()
    for column in ("device", "weights", "KV cache", "compute", "output", "overhead", "needed", "free"):
        table.add_column(column, justify="left" if column == "device" else "right")
    for device in estimate.devices:
        table.add_row(
            device.name, *(format_bytes(v) for v in (device.weights_bytes, device.kv_bytes, device.compute_bytes, device.output_bytes, device.overhead_bytes, device.total_needed_bytes, device.free_bytes))
        )
    console.print(table)
    speed = f"~{estimate.est_decode_tokens_per_s:,.1f} tok/s (memory-bandwidth bound)" if estimate.est_decode_tokens_per_s else "speed unknown"
    verdict = "fits" if estimate.fits else f"does not fit: {check.reason}"
    console.print(f"Verdict: {verdict}; {speed}.")
    spilled = estimate.layers_total - estimate.layers_offloaded
    all_on_gpu = check.speed.get("all_on_gpu_tokens_per_s")
    if spilled and estimate.layers_offloaded and estimate.est_decode_tokens_per_s and all_on_gpu:
        console.print(f"[bold]{spilled} layers run from system RAM[/bold]: expect ~{estimate.est_decode_tokens_per_s:,.1f} tok/s instead of ~{all_on_gpu:,.0f} with every layer on the GPU.")
    if check.suggestion:
        hint = check.suggestion
        console.print(
            f"Suggestion: -ctk q8_0 -ctv q8_0 -fa on gives {hint['layers_offloaded']}/{estimate.layers_total} layers on the GPU "
            f"at {hint['ctx']:,} tokens{'' if hint['fits'] else ' (still does not fit)'}."
        )
    console.print("Command: " + " ".join(check.command))
    ollama = check.ollama
    env = " ".join(f"{k}={v}" for k, v in ollama["env"].items())  # type: ignore[union-attr]
    note = f" ({ollama['note']})" if "note" in ollama else ""
    console.print(f"Ollama: num_gpu {ollama['num_gpu']}, num_ctx {ollama['num_ctx']}; {env}{note}")

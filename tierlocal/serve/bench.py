"""`tierlocal bench`: speed as the running engine shows it. Against a `tierlocal serve`'s
llama-server: prompt processing (prefill) and decode tokens/s, and time to first token, at a
few prompt lengths, from llama-server's own ``/completion`` timings; the engine's peak memory
(the host's ``VmHWM``; what each device allocated at load). Each result is appended to
``$TIERLOCAL_HOME/bench.jsonl`` under its model file, engine build and device, and later
estimates for the same three show it beside theirs. I/O: HTTP to the engine, /proc, the file."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import constants
from ..errors import EngineFailed, UsageError
from .records import append_record, read_records
from .state import ServeState

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "BenchRun",
    "PromptRun",
    "bench_server",
    "bench_device",
    "bench_key",
    "record_bench",
    "measured_speed",
    "bench_path",
    "llama_server_plan",
    "PROMPT_LENGTHS",
]

#: Prompt lengths measured (tokens), those that fit the slot's context.
PROMPT_LENGTHS = (128, 512, 2048)
#: Tokens generated per measurement.
DECODE_TOKENS = 32


@dataclass(frozen=True)
class PromptRun:
    """One measurement: ``prompt_tokens`` processed at ``prefill_tokens_per_s``, then
    ``decode_tokens`` generated at ``decode_tokens_per_s``; ``first_token_s`` = prompt time +
    one decode step (llama-server's own timings)."""

    prompt_tokens: int
    prefill_tokens_per_s: float
    decode_tokens: int
    decode_tokens_per_s: float
    first_token_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
            "decode_tokens": self.decode_tokens,
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "first_token_s": round(self.first_token_s, 3),
        }


@dataclass(frozen=True)
class BenchRun:
    """What `tierlocal bench` measured on one server, beside what the plan estimated."""

    url: str
    model: str
    engine_version: str
    device: str
    runs: tuple[PromptRun, ...]
    #: The plan's memory-bandwidth bound (``check --json``'s ``bound_decode_tokens_per_s``).
    bound_decode_tokens_per_s: float | None
    host_peak_bytes: int | None
    device_bytes: dict[str, int] = field(default_factory=dict)
    #: The plan's speed estimate (``check --json``'s ``speed.estimate``), if any.
    calibrated: dict[str, object] | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        """The median decode rate over the prompt lengths."""
        return statistics.median(run.decode_tokens_per_s for run in self.runs)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill at the longest prompt measured (the steady rate, least overhead)."""
        return self.runs[-1].prefill_tokens_per_s

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "model": self.model,
            "engine_version": self.engine_version,
            "device": self.device,
            "runs": [run.to_json() for run in self.runs],
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
            "bound_decode_tokens_per_s": self.bound_decode_tokens_per_s,
            "host_peak_bytes": self.host_peak_bytes,
            "device_bytes": self.device_bytes,
            "estimate": self.calibrated,
        }


def _prompt(tokens: int) -> str:
    """About ``tokens`` tokens of plain text (llama-server reports the exact count)."""
    return " ".join(["the"] * max(1, tokens - 1))


def _one(client: httpx2.Client, url: str, tokens: int) -> PromptRun:
    body = {"prompt": _prompt(tokens), "n_predict": DECODE_TOKENS, "cache_prompt": False, "temperature": 0, "ignore_eos": True}
    response = client.post(f"{url}/completion", json=body)
    if response.status_code != 200:
        raise EngineFailed(
            f"the engine answered {response.status_code} to a {tokens}-token prompt: {response.text[:200]}", hint="see `tierlocal status`"
        )
    timings = response.json().get("timings") or {}
    try:
        prompt_n, prompt_ms = int(timings["prompt_n"]), float(timings["prompt_ms"])
        predicted_n, predicted_ms = int(timings["predicted_n"]), float(timings["predicted_ms"])
    except (KeyError, TypeError, ValueError):
        raise EngineFailed("the engine's /completion gave no timings", hint="tierlocal bench measures llama-server") from None
    step_ms = predicted_ms / max(predicted_n, 1)
    return PromptRun(prompt_n, prompt_n / (prompt_ms / 1000), predicted_n, predicted_n / (predicted_ms / 1000), (prompt_ms + step_ms) / 1000)


def _peak_bytes(pid: object) -> int | None:
    """The engine process's VmHWM (this machine only)."""
    if not isinstance(pid, int):
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def llama_server_plan(state: ServeState) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan a running `tierlocal serve` of llama-server was started with (its ``check --json``
    object) and that plan's ``request``.

    Raises:
        UsageError: the serve runs another engine.
    """
    if state.engine != "llama-server":
        raise UsageError(f"tierlocal bench measures llama-server; this server runs {state.engine}", hint="serve the model with --engine llama-server")
    return state.plan, state.request


def bench_server(state: ServeState, *, say: Callable[[str], None]) -> BenchRun:
    """Measure the running `tierlocal serve` whose state file is ``state``.

    Raises:
        UsageError: it is not a llama-server.
        EngineFailed: it does not answer as llama-server does.
    """
    plan, request = llama_server_plan(state)
    per_slot = int(request.get("ctx_per_slot") or 2048)
    lengths = [length for length in PROMPT_LENGTHS if length + DECODE_TOKENS + 16 <= per_slot] or [max(16, per_slot // 4)]
    url = state.url
    runs = []
    import httpx2  # the HTTP client loads when a server is measured, not when a record is read

    with httpx2.Client(timeout=constants.FIRST_ANSWER_TIMEOUT_S * 2) as client:
        _one(client, url, 16)  # warm-up: first-use allocations are not speed
        for length in lengths:
            started = time.monotonic()
            runs.append(_one(client, url, length))
            say(
                f"{runs[-1].prompt_tokens} prompt tokens: prefill {runs[-1].prefill_tokens_per_s:.1f} tok/s, decode "
                f"{runs[-1].decode_tokens_per_s:.1f} tok/s ({time.monotonic() - started:.1f} s)"
            )
    devices = {
        str(d["name"]): sum(int(d.get(k) or 0) for k in ("weights_bytes", "kv_bytes", "compute_bytes", "output_bytes"))
        for d in state.actual.get("devices") or []
        if isinstance(d, dict)
    }
    return BenchRun(
        url,
        state.model_file,
        state.engine_version or "unknown",
        bench_device(plan),
        tuple(runs),
        plan.get("bound_decode_tokens_per_s") if isinstance(plan.get("bound_decode_tokens_per_s"), int | float) else None,
        _peak_bytes(state.engine_pid),
        devices,
        _calibrated(plan),
    )


def _calibrated(plan: dict[str, object]) -> dict[str, object] | None:
    speed = plan.get("speed")
    calibrated = speed.get("estimate") if isinstance(speed, dict) else None
    return calibrated if isinstance(calibrated, dict) else None


def bench_device(plan: dict[str, object]) -> str:
    """The device a plan (``check --json``'s object) runs on: the GPU's name when layers are
    offloaded, else ``cpu``."""
    devices = plan.get("devices") if isinstance(plan.get("devices"), list) else []
    assert isinstance(devices, list)
    first = devices[0] if devices and isinstance(devices[0], dict) else {}
    return str(first.get("name")) if first.get("backend") not in (None, "cpu") and plan.get("layers_offloaded") else "cpu"


def bench_path() -> Path:
    return constants.home_dir() / "bench.jsonl"


def bench_key(model: str, engine_version: str, device: str) -> dict[str, object]:
    """What a measurement is filed under: the model file (path and size), engine build, device."""
    path = Path(model)
    size = path.stat().st_size if path.is_file() else None
    return {"model": str(path.resolve()) if path.is_file() else model, "file_bytes": size, "engine_version": engine_version, "device": device}


def record_bench(run: BenchRun) -> None:
    append_record(bench_path(), {"key": bench_key(run.model, run.engine_version, run.device), **run.to_json()})


def measured_speed(key: dict[str, object], path: Path | None = None) -> dict[str, object] | None:
    """The latest recorded measurement filed under ``key`` (None: none)."""
    for record in reversed(read_records(path or bench_path())):
        if record.get("key") == key and record.get("kind") != "users":  # `bench --users` files its own
            return {name: record.get(name) for name in ("time", "decode_tokens_per_s", "prefill_tokens_per_s", "runs")}
    return None

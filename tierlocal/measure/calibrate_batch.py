"""`tierlocal hw --calibrate`'s batched probe: what a further user of the same decode step costs on
this CPU. A probe of a weight type the engine multiplies row by row (a gemv per row of the batch:
Q6_K on x86) is loaded by the real llama-server with ``-np 4 -kvu``; one request alone, then four
at once (each prompt of its own), give one step's seconds for one and for four sequences; the
share of a mat-vec that each further row pays (:data:`tierlocal.fit.cpu_kernels.CPU_ROW_COMPUTE_SHARE`
until now) is the one that makes the concurrency model's four-sequence step match the measured
ratio. Other CPUs than x86 share the reads of every type: nothing to time there.

A second probe, deep and narrow (186 layers of 256, Q8_0: a type llama.cpp multiplies as a batch,
tinyBLAS), times the same way what each further sequence pays per matrix row beyond its FLOPs
(:attr:`~tierlocal.fit.device_speed.DeviceSpeed.sequence_row_s`): on a 2-core VPS three
sequences of a 36-layer 640-wide Q8_0 model took 1.61x one sequence's step where FLOPs at the
prefill rate said 1.27x, while a 2,048-wide one took 1.31x (1.27x): short rows use the kernel's
tiles poorly.

I/O: a temporary probe file, the engine as a child process, HTTP on loopback, threads."""

from __future__ import annotations

import statistics
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..engines.process import start_child
from ..errors import EngineFailed
from ..fit.concurrency import batch_costs
from ..fit.cpu_kernels import cpu_kernels
from ..fit.device_speed import DeviceSpeed
from ..fit.estimate import RunRequest
from ..fit.model import model_spec
from ..gguf.synthetic import ProbeShape, write_probe_gguf
from .calibrate import LOAD_TIMEOUT_S, SCRATCH_PREFIX, _free_port
from .probes import PROBES

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "BATCH_PROBE",
    "ROW_PROBE",
    "BATCH_SEQUENCES",
    "row_share_from",
    "measure_row_share",
    "sequence_row_s_from",
    "measure_sequence_row_s",
]

#: The batched probe: a wide Q6_K model (Q6_K is neither repacked nor tinyBLAS on x86).
BATCH_PROBE = ProbeShape("batch-Q6_K", 8, 2048, 4 * 2048, 16, 4, 128, 4096, "Q6_K")
#: The per-row probe: many narrow Q8_0 layers, so a further sequence's cost per short row shows.
ROW_PROBE = next(probe.shape for probe in PROBES if probe.shape.name == "narrow-deep")
#: The range a measured cost per row is kept within (s).
_ROW_RANGE = (0.0, 1e-6)
#: Sequences decoding at once in the batched request.
BATCH_SEQUENCES = 3
#: Prompt tokens of each request (each its own) and tokens each generates.
_PROMPT, _TOKENS = 32, 64
#: The range a measured share is kept within (a busy machine can read anything).
_SHARE_RANGE = (0.05, 1.5)


def _decode_s(client: httpx2.Client, url: str, first: int) -> float:
    """Seconds per decoded token of one request whose prompt starts with token ``first``."""
    body = {
        "prompt": [first, *(3 + i % 64 for i in range(_PROMPT - 1))],
        "n_predict": _TOKENS,
        "cache_prompt": False,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = client.post(f"{url}/completion", json=body)
    if response.status_code != 200:
        raise EngineFailed(f"the engine answered {response.status_code} to the batched probe: {response.text[:200]}")
    timings = response.json().get("timings") or {}
    try:
        return float(timings["predicted_ms"]) / 1000 / int(timings["predicted_n"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise EngineFailed("the engine's /completion gave no timings", hint="calibration needs llama-server") from None


def _steps(binary: Path, model: Path, log_dir: Path) -> tuple[float, float]:
    """(seconds of a decode step of one sequence, of :data:`BATCH_SEQUENCES` at once)."""
    port, ctx = _free_port(), BATCH_SEQUENCES * 512
    argv = [str(binary), "-m", str(model), "-c", str(ctx), "-np", str(BATCH_SEQUENCES), "-kvu", "--host", "127.0.0.1", "--port", str(port)]
    child = start_child([*argv, "--no-webui"], log_dir / f"{model.stem}.log")
    try:
        if not child.wait_ready(f"http://127.0.0.1:{port}/health", LOAD_TIMEOUT_S).ready:
            raise EngineFailed(f"llama-server did not load the batched probe: {' | '.join(child.lines()[-3:])[:300]}")
        import httpx2  # the HTTP client loads when probes run

        url = f"http://127.0.0.1:{port}"
        with httpx2.Client(timeout=600.0) as client:
            _decode_s(client, url, 100)  # warm-up
            alone = statistics.median(_decode_s(client, url, 200 + run) for run in range(3))
            together: list[float] = []
            errors: list[BaseException] = []

            def one(first: int) -> None:
                try:
                    together.append(_decode_s(client, url, first))
                except BaseException as exc:  # reported below, in the calling thread
                    errors.append(exc)

            threads = [threading.Thread(target=one, args=(300 + index,)) for index in range(BATCH_SEQUENCES)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
        return alone, statistics.median(together)
    finally:
        child.stop()


def _matching(
    spec_path: Path, host_with: Callable[[float], DeviceSpeed], cpu_arch: str, repacked: frozenset[str], ratio: float, unit: float
) -> float:
    """The value ``v`` for which the model's step of :data:`BATCH_SEQUENCES` sequences on
    ``host_with(v)`` is ``ratio`` times its one-sequence step (the step is linear in it: read at
    0 and at ``unit``); ``-1.0`` when ``v`` does not move the step."""
    from ..fetch.sources import read_headers  # only when probes run: the hub client is a slow import

    spec = model_spec(read_headers(str(spec_path)))
    request = RunRequest(ctx=BATCH_SEQUENCES * 512, parallel=BATCH_SEQUENCES, ngl=0, kv_unified=True)
    kernels = cpu_kernels(cpu_arch, repacked)

    def steps(value: float) -> tuple[float, float]:
        costs = batch_costs(spec, request, {"host": host_with(value), "gpu": None}, cpu=kernels, prompt=_PROMPT)
        assert costs is not None
        return costs.decode_step_s(1), costs.decode_step_s(BATCH_SEQUENCES)

    one, none = steps(0.0)
    _, moved = steps(unit)
    return unit * (ratio * one - none) / (moved - none) if moved > none else -1.0


def row_share_from(spec_path: Path, host: DeviceSpeed, cpu_arch: str, repacked: frozenset[str], alone_s: float, together_s: float) -> float:
    """The further-row share that makes the model's step of :data:`BATCH_SEQUENCES` sequences, as
    a multiple of its one-sequence step, what the engine's was, within :data:`_SHARE_RANGE`."""
    share = _matching(spec_path, lambda value: replace(host, batch_row_share=value), cpu_arch, repacked, together_s / alone_s, 1.0)
    return min(max(share, _SHARE_RANGE[0]), _SHARE_RANGE[1])


def measure_row_share(binary: Path, host: DeviceSpeed, cpu_arch: str, repacked: frozenset[str], *, say: Callable[[str], None]) -> float | None:
    """Time the batched probe and return this CPU's further-row share (None: not x86, where no
    type is multiplied row by row)."""
    if cpu_kernels(cpu_arch, repacked).kind(BATCH_PROBE.weight_type) != "per-row":
        return None
    ratio, share = _timed(binary, BATCH_PROBE, lambda path, alone, together: row_share_from(path, host, cpu_arch, repacked, alone, together))
    say(f"batched decode: {BATCH_SEQUENCES} sequences at once take {ratio:.2f}× one sequence's step; a further row pays {share:.2f} of a mat-vec")
    return share


def _timed(binary: Path, shape: ProbeShape, solve: Callable[[Path, float, float], float]) -> tuple[float, float]:
    """Write ``shape``, time one sequence's step and :data:`BATCH_SEQUENCES` at once, and return
    their ratio and what ``solve(probe path, alone s, together s)`` makes of them."""
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}batch-") as scratch:
        path = write_probe_gguf(Path(scratch) / f"{shape.name}.gguf", shape)
        alone, together = _steps(binary, path, Path(scratch))
        return together / alone, solve(path, alone, together)


def sequence_row_s_from(spec_path: Path, host: DeviceSpeed, cpu_arch: str, repacked: frozenset[str], alone_s: float, together_s: float) -> float:
    """The cost per row of a further sequence that makes the model's step of
    :data:`BATCH_SEQUENCES` sequences, as a multiple of its one-sequence step, what the engine's
    was, within :data:`_ROW_RANGE` (s)."""
    per_row = _matching(spec_path, lambda value: replace(host, sequence_row_s=value), cpu_arch, repacked, together_s / alone_s, 1e-8)
    return min(max(per_row, _ROW_RANGE[0]), _ROW_RANGE[1])


def measure_sequence_row_s(binary: Path, host: DeviceSpeed, cpu_arch: str, repacked: frozenset[str], *, say: Callable[[str], None]) -> float:
    """Time the per-row probe alone and :data:`BATCH_SEQUENCES` at once, and return what a
    further sequence pays per row of a batched type on this CPU (s)."""
    ratio, per_row = _timed(binary, ROW_PROBE, lambda path, alone, together: sequence_row_s_from(path, host, cpu_arch, repacked, alone, together))
    say(
        f"batched decode, {ROW_PROBE.n_layer} narrow layers: {BATCH_SEQUENCES} sequences at once take {ratio:.2f}× one "
        f"sequence's step; a further sequence pays {per_row * 1e9:.1f} ns a row beyond its FLOPs"
    )
    return per_row

"""`tierlocal hw --calibrate`: this CPU's effective figures for llama.cpp, measured once with
the engine and cached.

Probe models (sparse GGUFs, :mod:`tierlocal.gguf.synthetic`) are loaded one at a time by the
real llama-server on the CPU with its default threads, as `tierlocal serve` runs it; each answers
a prompt of known length and generates a few tokens, and llama-server's own ``/completion``
timings give seconds per prompt token and per decoded token. Wide and medium probes, two per
weight type, fix that type's rates and its cost per matrix row; a deep narrow probe, a tiny one,
a large vocabulary and a long prompt fix the fixed costs and attention
(:func:`tierlocal.fit.speed.fit_device_speed`). A short memory-read probe gives the host's
bandwidth. The result is filed under the CPU model, its cores and the engine build in
``$TIERLOCAL_HOME/calibration.json``.

The probes are :mod:`tierlocal.measure.probes`.

I/O: temporary files, the engine as a child process, HTTP on loopback, the cache file."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ..engines.process import start_child
from ..errors import CalibrationFailed, EngineFailed, UsageError
from ..fit.calibration import TimedRun, fit_device_speed
from ..fit.device_speed import DeviceSpeed
from ..fit.model import model_spec
from ..fit.speed import run_features
from ..gguf.synthetic import write_probe_gguf
from .probes import PROBE_TYPES, PROBES, Probe

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "PROBE_TYPES",
    "PROBES",
    "Probe",
    "calibrate_cpu",
    "fastest_runs",
    "memory_read_bytes_per_s",
    "other_work_percent",
    "OtherWork",
    "remove_stale_scratch",
]

#: Tokens generated per timed request.
DECODE_TOKENS = 32
#: Prompt tokens of the warm-up request before a probe's timed ones: a batch, so it runs the
#: batched matrix kernels the timed prompts run, and the decode after it the one-row ones; the
#: engine has reserved its buffers and touched every weight at load already. A full-length
#: warm-up was about 40% of `--quick`'s time.
WARMUP_TOKENS = 64
#: Longest the engine may take to load a probe (s).
LOAD_TIMEOUT_S = 120.0
#: Longest a calibration may run (s), two rounds of two timed runs per probe and one round of
#: one (--quick): about three times what a 2-core VPS takes. Past it, if other work used the CPU
#: meanwhile, the machine is too busy to measure; if not, the CPU is slow and the calibration
#: carries on (an idle 2-core VPS once needed 12 minutes for one round of three).
TIME_LIMIT_S = 24 * 60.0
QUICK_TIME_LIMIT_S = 9 * 60.0
#: Share of the CPU other work may use before calibrating (psutil, over one second) without a
#: warning that the timings will read slow.
BUSY_CPU_PERCENT = 25.0
#: Scratch directories: tierlocal-calibrate-PID-…; those of a process that is gone are removed.
SCRATCH_PREFIX = "tierlocal-calibrate-"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _timed(client: httpx2.Client, url: str, prompt: int) -> tuple[float, float]:
    """(seconds per prompt token, seconds per decoded token) of one request."""
    body = {"prompt": [3 + i % 64 for i in range(prompt)], "n_predict": DECODE_TOKENS, "cache_prompt": False, "temperature": 0, "ignore_eos": True}
    response = client.post(f"{url}/completion", json=body)
    if response.status_code != 200:
        raise EngineFailed(f"the engine answered {response.status_code} to a probe: {response.text[:200]}")
    timings = response.json().get("timings") or {}
    try:
        return float(timings["prompt_ms"]) / 1000 / int(timings["prompt_n"]), float(timings["predicted_ms"]) / 1000 / int(timings["predicted_n"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise EngineFailed("the engine's /completion gave no timings", hint="calibration needs llama-server") from None


def time_probe(binary: Path, model: Path, prompt: int, *, log_dir: Path, repeats: int = 3, warmup: int | None = None) -> tuple[float, float]:
    """Load ``model`` in ``binary`` and time ``repeats`` requests of ``prompt`` tokens after a
    warm-up request of ``warmup`` tokens (default :data:`WARMUP_TOKENS`, or the prompt's length
    when shorter); the median of each figure.

    Raises:
        EngineFailed: the engine did not load the probe or did not answer.
    """
    port = _free_port()
    ctx = -(-(prompt + DECODE_TOKENS + 64) // 256) * 256
    argv = [str(binary), "-m", str(model), "-c", str(ctx), "-np", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    child = start_child(argv, log_dir / f"{model.stem}.log")
    try:
        readiness = child.wait_ready(f"http://127.0.0.1:{port}/health", LOAD_TIMEOUT_S)
        if not readiness.ready:
            tail = " | ".join(child.lines()[-3:])
            raise EngineFailed(
                f"llama-server did not load the probe {model.name}: {tail[:300]}", hint="check the engine with `tierlocal engine status`"
            )
        url = f"http://127.0.0.1:{port}"
        import httpx2  # the HTTP client loads when probes run, not with every command

        with httpx2.Client(timeout=600.0) as client:
            _timed(client, url, warmup or min(prompt, WARMUP_TOKENS))  # a warm-up: first-use allocations and a cold CPU are not speed
            results = [_timed(client, url, prompt) for _ in range(repeats)]
        return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)
    finally:
        child.stop()


def memory_read_bytes_per_s(size_bytes: int = 256 << 20, repeats: int = 3) -> float:
    """Bytes/s one thread reads from RAM (numpy's sum over a buffer larger than any cache)."""
    import numpy as np

    buffer = np.ones(size_bytes // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return size_bytes / best


def other_work_percent(interval_s: float = 1.0) -> float:
    """How much of the CPU is busy right now (percent of all cores, over ``interval_s``)."""
    return float(psutil.cpu_percent(interval=interval_s))


class OtherWork:
    """The share of the CPU other processes used since it was made (percent of all cores): the
    machine's busy time — steal included, a VPS's neighbours — less this process's and its
    finished children's (the probe engines). Read between probes, when no engine runs."""

    def __init__(self) -> None:
        self._started, self._busy, self._own = time.monotonic(), _busy_s(), _own_s()

    def percent(self) -> float:
        wall_s = (time.monotonic() - self._started) * (os.cpu_count() or 1)
        other_s = (_busy_s() - self._busy) - (_own_s() - self._own)
        return max(0.0, 100.0 * other_s / wall_s) if wall_s > 0 else 0.0


def _busy_s() -> float:
    times = psutil.cpu_times()
    return float(sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal")))


def _own_s() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)


@dataclass
class _Deadline:
    """When a calibration stops: past ``limit_s``, but only while other work slows it — on an
    idle CPU that is merely slow it carries on (said once) rather than fail blaming other work."""

    limit_s: float
    work: OtherWork
    say: Callable[[str], None]
    at: float = 0.0
    waived: bool = False

    def __post_init__(self) -> None:
        self.at = time.monotonic() + self.limit_s

    def check(self, index: int, count: int) -> None:
        """Before probe ``index`` of ``count``: go on, or stop past the limit if other work slowed the probes.

        Raises:
            CalibrationFailed: the limit passed while other work used more than :data:`BUSY_CPU_PERCENT` of the CPU.
        """
        if self.waived or time.monotonic() <= self.at:
            return
        other = self.work.percent()
        if other > BUSY_CPU_PERCENT:
            raise CalibrationFailed(
                f"calibration ran past its time limit ({self.limit_s / 60:.0f} min) at probe {index} of {count} while other work used "
                f"{other:.0f}% of the CPU; nothing was filed",
                hint="run `tierlocal hw --calibrate` again when the machine is idle, or with --quick (one timed run per probe, about half the time)",
            )
        self.waived = True
        self.say(
            f"this CPU takes longer than the {self.limit_s / 60:.0f}-minute limit (other work used only {other:.0f}% of it, so it is not "
            f"slowed): carrying on at probe {index} of {count} (`--quick` times each probe once, in about half the time)"
        )


def remove_stale_scratch(directory: Path | None = None) -> list[Path]:
    """Remove the scratch directories of calibrations whose process is gone (killed, or the
    machine restarted); returns what was removed."""
    import shutil

    base = directory or Path(tempfile.gettempdir())
    removed = []
    for path in base.glob(f"{SCRATCH_PREFIX}*"):
        pid = path.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def calibrate_cpu(
    binary: Path,
    engine_version: str,
    *,
    say: Callable[[str], None],
    probes: tuple[Probe, ...] = PROBES,
    repeats: int = 2,
    rounds: int = 2,
    time_limit_s: float | None = None,
) -> tuple[DeviceSpeed, list[dict[str, object]]]:
    """Time every probe in ``rounds`` rounds (``repeats`` timed requests each, the median kept),
    keep each probe's fastest prefill and decode of the rounds, and fit this CPU's figures.
    Returns them and the raw timings. Other work on a shared machine only ever slows a timing,
    and for minutes at a time: on a 2-core VPS one probe's decode read 8.9 GB/s in one round and
    11.3 an hour later, beside an 8B model's 11.5-12.8, so a probe timed once can put a weight
    type a quarter slow. Says first when other work keeps the CPU busy (the timings will read
    slow), and stops past ``time_limit_s`` (default :data:`TIME_LIMIT_S`,
    :data:`QUICK_TIME_LIMIT_S` with one run per probe) if other work used the CPU meanwhile; on
    an idle CPU it says so and carries on.

    Timings skewed by other work on the machine can leave a weight type's rate undetermined
    (the fit drives it to zero): then every probe is timed once more and the fit sees the
    fastest of all rounds.

    Raises:
        EngineFailed: the engine failed a probe.
        CalibrationFailed: two rounds of timings still do not determine every rate, or the time
            limit passed.
    """
    busy = other_work_percent()
    if busy > BUSY_CPU_PERCENT:
        say(f"warning: other work keeps {busy:.0f}% of the CPU busy: the timings will read slow (calibrate on an idle machine for figures that hold)")
    quick = repeats == 1 and rounds == 1
    limit = time_limit_s if time_limit_s is not None else (QUICK_TIME_LIMIT_S if quick else TIME_LIMIT_S)
    deadline = _Deadline(limit, OtherWork(), say)
    runs: list[TimedRun] = []
    raw: list[dict[str, object]] = []
    how = "tierlocal hw --calibrate" + (", one timed run per probe" if quick else "")
    note = f"calibrated {time.strftime('%Y-%m-%d')} with {binary.name} {engine_version} ({how})"
    for round_ in range(1, rounds + 1):
        if rounds > 1:
            say(f"round {round_} of {rounds} (each probe's fastest round is kept: other work only slows a timing)")
        _time_probes(binary, probes, repeats, runs, raw, say, deadline)
    try:
        return fit_device_speed(fastest_runs(runs), device="cpu", note=note), raw
    except ValueError as exc:
        say(f"{exc} (a busy machine?); timing the probes once more")
    _time_probes(binary, probes, repeats, runs, raw, say, deadline)
    try:
        return fit_device_speed(fastest_runs(runs), device="cpu", note=note), raw
    except ValueError as exc:
        hint = "other work on this machine skews them; run `tierlocal hw --calibrate` again when it is idle"
        raise CalibrationFailed(f"the timings do not fit: {exc}", hint=hint) from None


def fastest_runs(runs: list[TimedRun]) -> list[TimedRun]:
    """One run per probe, in first-timed order: its fastest decode and its fastest prefill of
    the rounds it was timed in."""
    fastest: dict[str, TimedRun] = {}
    for run in runs:
        kept = fastest.get(run.name)
        fastest[run.name] = (
            run
            if kept is None
            else replace(kept, decode_s=min(kept.decode_s, run.decode_s), prefill_s_per_token=min(kept.prefill_s_per_token, run.prefill_s_per_token))
        )
    return list(fastest.values())


def _time_probes(
    binary: Path,
    probes: tuple[Probe, ...],
    repeats: int,
    runs: list[TimedRun],
    raw: list[dict[str, object]],
    say: Callable[[str], None],
    deadline: _Deadline,
) -> None:
    """Time every probe, appending to ``runs`` and ``raw``, in a scratch directory removed on
    every way out (a SIGTERM is turned into an exit here; a kill -9 leaves it to the next run's
    :func:`remove_stale_scratch`).

    Raises:
        CalibrationFailed: ``deadline`` passed while other work slowed the probes.
    """
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch, _exit_on_sigterm():
        directory = Path(scratch)
        for index, probe in enumerate(probes, 1):
            deadline.check(index, len(probes))
            started = time.monotonic()
            path = write_probe_gguf(directory / f"{probe.shape.name}.gguf", probe.shape)
            from ..fetch.sources import read_headers  # only when probes run: the hub client is a slow import

            spec = model_spec(read_headers(str(path)))
            prefill_s, decode_s = time_probe(binary, path, probe.prompt, log_dir=directory, repeats=repeats)
            features = run_features(spec, depth=probe.prompt + DECODE_TOKENS // 2, prompt=probe.prompt)
            runs.append(
                TimedRun(
                    probe.shape.name,
                    features.decode["host"],
                    features.prefill["host"],
                    features.once["host"],
                    probe.prompt,
                    decode_s,
                    prefill_s,
                    decode_fitted=probe.decode_fitted,
                )
            )
            raw.append(
                {"probe": probe.shape.name, "prompt": probe.prompt, "prefill_s_per_token": prefill_s, "decode_s_per_token": decode_s}
            )  # every round
            say(
                f"[{index}/{len(probes)}] {probe.shape.name}: prefill {1 / prefill_s:,.1f} tok/s, decode {1 / decode_s:,.1f} tok/s "
                f"({time.monotonic() - started:.0f} s)"
            )
            path.unlink()


@contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """SIGTERM as SystemExit while inside, so the scratch directory and the engine are cleaned
    up (Python's default for SIGTERM is to die at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def require_engine(binary: Path | None) -> Path:
    """The engine calibration runs.

    Raises:
        UsageError: none was found.
    """
    if binary is None:
        raise UsageError(
            "calibration times the engine, and no llama-server was found", hint="run `tierlocal engine build`, or set TIERLOCAL_LLAMA_SERVER"
        )
    return binary

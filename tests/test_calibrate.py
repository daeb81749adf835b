"""`tierlocal hw --calibrate` on the real CPU llama-server: the probes load and answer, the fitted
figures are filed under this CPU and engine build, and `check` then estimates the Gemma model's
decode and prefill within reach of what the same engine does with it (the held-out model: no
probe is Gemma). bench/speed_accuracy.py runs the whole comparison over six shapes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.doc_json import assert_documented
from tierlocal.errors import CalibrationFailed, EngineFailed
from tierlocal.gguf.synthetic import ProbeShape, write_probe_gguf
from tierlocal.measure import calibrate
from tierlocal.measure.calibrate import PROBE_TYPES, PROBES, calibrate_cpu, time_probe

#: The probe of fewest weights (4 blocks of 256): for the tests that need a real probe, not the fit.
_SMALLEST = next(probe for probe in PROBES if probe.shape.name == "narrow-4")


@pytest.mark.serial  # it times the engine: other tests running beside it read as a slow CPU
def test_calibrate_files_this_cpu_and_check_estimates_gemma_from_it(assets: Assets, gemma: Path, isolated_env: Path, tmp_path: Path) -> None:
    env = {"TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu)}
    # The engine's own rate on Gemma, once now and twice after calibrating (below): a timing
    # spread over the test's minutes, of which the best counts.
    timings = [time_probe(assets.llama_server_cpu, gemma, 512, log_dir=tmp_path)]
    before = json.loads(run_cli("check", str(gemma), "--json", env=env).stdout)
    # nothing measured yet: priced from published runs of CPUs like this one (issue 47: it was the bandwidth bound alone)
    assert before["speed_basis"] == "derived" and before["speed"]["estimate"]["sources"]["host"].startswith("derived: not calibrated: priced")

    done = run_cli("hw", "--calibrate", "--quick", "--json", env=env, timeout=900)  # one timed run per probe: CI's minutes
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert_documented("calibrate", result)
    assert f"[{len(PROBES)}/{len(PROBES)}]" in done.stderr  # progress, one line per probe
    assert result["key"]["engine_version"] and result["key"]["cores"] >= 1
    assert set(result["speed"]["decode_bytes_per_s"]) >= set(PROBE_TYPES)
    assert all(rate > 1e8 for rate in result["speed"]["decode_bytes_per_s"].values())  # faster than 100 MB/s, slower than
    assert all(rate < 1e12 for rate in result["speed"]["decode_bytes_per_s"].values())  # 1 TB/s: a CPU
    assert result["memory_read_bytes_per_s"] > 1e8
    # Issue 48: three sequences decoding at once on a Q6_K probe (x86 multiplies Q6_K row by row)
    # give what a further sequence pays of a mat-vec; check prices users at once with it.
    assert "batched decode: 3 sequences at once take" in done.stderr
    assert 0.05 < result["speed"]["batch_row_share"] < 1.5
    # and on the deep narrow Q8_0 probe, what a further sequence pays per short row (tinyBLAS)
    assert "batched decode, 186 narrow layers: 3 sequences at once take" in done.stderr
    assert 0.0 <= result["speed"]["sequence_row_s"] <= 1e-6
    filed = json.loads((isolated_env / "calibration.json").read_text())
    assert filed[-1]["key"] == result["key"] and len(filed[-1]["probes"]) == len(PROBES)

    after = json.loads(run_cli("check", str(gemma), "--json", env=env).stdout)
    calibrated = after["speed"]["estimate"]
    assert calibrated["sources"]["host"].startswith("measured: calibrated") and "one timed run per probe" in calibrated["sources"]["host"]
    assert set(calibrated["first_token_s"]) == {"128", "512", "2048"}
    assert calibrated["first_token_s"]["128"] < calibrated["first_token_s"]["512"] < calibrated["first_token_s"]["2048"]
    human = run_cli("check", str(gemma), env=env).stdout
    assert "prefill" in " ".join(human.split()) and "measured: calibrated" in " ".join(human.split())
    # Issue 47: with no llama-server found, the calibration (filed under the engine build) went
    # unused without a word, and the pick fell back to the bandwidth ceiling.
    no_engine = {"PATH": str(tmp_path / "no-engine-here")}
    lost = json.loads(run_cli("check", str(gemma), "--json", env=no_engine).stdout)
    assert lost["speed_basis"] == "derived" and lost["calibration_note"].startswith("this CPU was calibrated on "), lost["calibration_note"]
    assert "no llama-server was found here to match it" in lost["calibration_note"]
    said_lost = " ".join(run_cli("check", env=no_engine).stdout.split())  # the catalog's notes say it too
    assert "no llama-server was found here to match it" in said_lost
    assert json.loads(run_cli("check", str(gemma), "--json", env=env).stdout)["calibration_note"] is None  # found: used, nothing to say

    # tierlocal bench on a Gemma server: measured beside the calibrated estimate
    bench = run_cli("bench", str(gemma), "--ctx", "4096", env=env, timeout=600)
    assert bench.returncode == 0, bench.stderr[-2000:]
    said = " ".join(bench.stdout.split())
    assert "tok/s measured," in said and "estimated (" in said and "estimated at 512 tokens" in said
    record = json.loads((isolated_env / "bench.jsonl").read_text().splitlines()[-1])
    assert record["estimate"]["decode_tokens_per_s"] == calibrated["decode_tokens_per_s"]

    # The engine's own rate, the best of three loads (one before calibrating): other work on a
    # shared machine only ever slows a timing (CI read 1.4-1.5x slower than the same test
    # alone, where it holds, in three of seven full runs with two loads after calibrating).
    timings += [time_probe(assets.llama_server_cpu, gemma, 512, log_dir=tmp_path) for _ in range(2)]
    prefill_s, decode_s = min(t[0] for t in timings), min(t[1] for t in timings)
    seen = f"timings {timings}, load average {os.getloadavg()}"
    # Held out, on a shared 2-core machine: within 40% here (the bench holds 25% / 35% in one
    # quiet run); the bandwidth-only figure beside it is ~9x over.
    assert calibrated["decode_tokens_per_s"] * decode_s == pytest.approx(1.0, abs=0.4), seen
    assert calibrated["prefill_tokens_per_s"] * prefill_s == pytest.approx(1.0, abs=0.4), seen
    # The headline is the best figure there is; the bound stays in its own field.
    assert after["speed_basis"] == "calibrated" and after["est_decode_tokens_per_s"] == calibrated["decode_tokens_per_s"]
    assert after["est_prefill_tokens_per_s"] == calibrated["prefill_tokens_per_s"]
    assert after["bound_decode_tokens_per_s"] * decode_s > 3  # what the estimate replaced
    # Once `tierlocal bench` has measured this file here, that is the headline.
    measured = json.loads(run_cli("check", str(gemma), "--json", env=env).stdout)
    assert measured["speed_basis"] == "measured" and measured["est_decode_tokens_per_s"] == pytest.approx(record["decode_tokens_per_s"], abs=0.05)


def test_a_probe_the_engine_cannot_load_is_a_clear_error(assets: Assets, tmp_path: Path) -> None:
    shape = ProbeShape("broken", 2, 256, 768, 2, 2, 128, 4096, "Q8_0")
    path = write_probe_gguf(tmp_path / "broken.gguf", shape)
    with path.open("r+b") as handle:  # cut the tensor data short: llama.cpp refuses the file
        handle.truncate(path.stat().st_size // 2)
    with pytest.raises(EngineFailed, match=r"did not load the probe broken\.gguf"):
        time_probe(assets.llama_server_cpu, path, 64, log_dir=tmp_path)


def test_timings_that_do_not_fit_are_taken_again_then_a_clear_error(assets: Assets, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine can skew the timings until the fit leaves a rate undetermined (CI saw
    "no rate for Q8_0" while other engines ran): the probes are timed once more and fitted
    with both rounds; a second failure is a one-line error, not a traceback. The fit is made to
    fail here; the timings are the real engine's (the smallest probe, one request: CI's seconds;
    the widest took a minute of CPU)."""
    fitted: list[int] = []

    def never_fits(runs, **kwargs):  # type: ignore[no-untyped-def]
        fitted.append(len(list(runs)))
        raise ValueError("the probes do not determine a rate for Q8_0")

    said: list[str] = []
    monkeypatch.setattr(calibrate, "fit_device_speed", never_fits)
    with pytest.raises(CalibrationFailed, match="the timings do not fit: the probes do not determine a rate for Q8_0") as failed:
        calibrate_cpu(assets.llama_server_cpu, "test", say=said.append, probes=(_SMALLEST,), repeats=1, rounds=1)
    assert fitted == [1, 1]  # the second fit sees the probe's fastest timing of both rounds
    assert any("timing the probes once more" in line for line in said) and sum(line.startswith("[1/1]") for line in said) == 2
    assert failed.value.hint and "idle" in failed.value.hint


def test_quick_without_calibrate_is_a_usage_error() -> None:
    done = run_cli("hw", "--quick")
    assert done.returncode == 2 and "--quick shortens --calibrate" in done.stderr


def test_calibrate_without_an_engine_says_how_to_get_one(isolated_env: Path, tmp_path: Path) -> None:
    done = run_cli("hw", "--calibrate", env={"PATH": str(tmp_path)})
    assert done.returncode != 0
    assert "no llama-server was found" in done.stderr and "tierlocal engine build" in done.stderr
    assert not (isolated_env / "calibration.json").exists()


def _scratch_dirs(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"tierlocal-calibrate-{pid}-*"))


@pytest.mark.serial  # it loads the CPU on purpose
def test_a_busy_machine_is_said_and_a_run_past_its_limit_stops_and_cleans_up(assets: Assets) -> None:
    """`hw --calibrate --quick` ran 9.5 minutes on a busy machine without a word about the load
    and left its scratch files behind. Two busy loops (real load) are running here."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    said: list[str] = []
    try:
        with pytest.raises(CalibrationFailed, match=r"calibration ran past its time limit \(0 min\) at probe 2 of 2 while other work used") as failed:
            # 50 ms: the smallest probe's load and timing alone take longer (under half a second
            # at times: CI once saw both probes done inside a 0.5 s limit)
            calibrate_cpu(assets.llama_server_cpu, "test", say=said.append, probes=(_SMALLEST, _SMALLEST), repeats=1, rounds=1, time_limit_s=0.05)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert said[0].startswith("warning: other work keeps ") and "the timings will read slow" in said[0]
    assert failed.value.hint and "idle" in failed.value.hint and "--quick" in failed.value.hint
    # the burners, measured (they share the cores with the probe engine: CI read 50%)
    assert int(str(failed.value).split("other work used ")[1].split("%")[0]) > calibrate.BUSY_CPU_PERCENT
    assert _scratch_dirs(os.getpid()) == []


_BURN = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"


@pytest.mark.serial  # it times CPU shares
def test_other_work_is_what_the_calibration_did_not_run_itself() -> None:
    """Issue 47: an idle 2-core VM was told "other work on this machine slows the probes". The
    share is measured: the machine's busy time less the calibration's own and its finished
    engines'. A burner that is the calibration's child counts as its own; the same burner
    outside its process tree (daemonized) counts as other work: one core of all of them more.
    Other tests' set-up may load the machine meanwhile (the other workers start up while this
    serial test runs first: on 2 cores that read as half a core in one window and not the next),
    so the pair of windows is measured up to three times and one clean pair must show it."""
    one_core = 100 / (os.cpu_count() or 1)
    pairs = []
    for _ in range(3):
        own = calibrate.OtherWork()
        subprocess.run([sys.executable, "-c", _BURN], check=True)
        as_own = own.percent()
        other = calibrate.OtherWork()
        subprocess.run(["sh", "-c", f'setsid {sys.executable} -c "{_BURN}" </dev/null >/dev/null 2>&1 &'], check=True)  # reparented: not ours
        time.sleep(1.7)
        pairs.append((as_own, other.percent()))
        if pairs[-1][1] - as_own > 0.6 * one_core:
            break
    assert pairs[-1][1] - pairs[-1][0] > 0.6 * one_core, pairs


@pytest.mark.serial  # it needs the CPU idle, as far as the tests beside it let it be
def test_a_slow_cpu_that_is_not_slowed_by_other_work_carries_on(assets: Assets) -> None:
    """Past its limit, a calibration whose CPU other work did not use says the CPU is slow and
    goes on to the fit; it stops only naming a share of other work above a quarter (the busy
    test above makes that share with burners)."""
    said: list[str] = []
    try:
        calibrate_cpu(assets.llama_server_cpu, "test", say=said.append, probes=(_SMALLEST, _SMALLEST), repeats=1, rounds=1, time_limit_s=0.05)
    except CalibrationFailed as failed:
        if "time limit" in str(failed):  # other tests' set-up used the CPU meanwhile: said, with the share, and over a quarter
            assert float(str(failed).split("other work used ")[1].split("%")[0]) > calibrate.BUSY_CPU_PERCENT, failed
            return
        # two probes alone cannot fit every rate: the fit may refuse them, after the clock let it go on
    slow = [line for line in said if line.startswith("this CPU takes longer than")]
    assert len(slow) == 1 and "carrying on at probe 2 of 2" in slow[0] and "--quick" in slow[0], said
    assert float(slow[0].split("other work used only ")[1].split("%")[0]) <= calibrate.BUSY_CPU_PERCENT


def test_a_stopped_calibration_leaves_nothing_behind(assets: Assets, isolated_env: Path) -> None:
    """SIGTERM mid-run: the engine and the scratch directory go; a directory a kill -9 left is
    removed by the next run."""
    stale = Path(tempfile.gettempdir()) / "tierlocal-calibrate-999999999-left"
    stale.mkdir(exist_ok=True)
    env = {**os.environ, "TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tierlocal", "hw", "--calibrate", "--quick", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("calibrating "):  # said once stale directories are removed, before the first probe
            break
    assert any(f"removed {stale}" in line for line in lines) and not stale.exists()
    # SIGTERM while the first probe's engine runs (not once its timing is done: the widest
    # probe took a minute of CPU, and between probes no engine was left to check on).
    deadline = time.monotonic() + 120
    engines: list[psutil.Process] = []
    while not engines and time.monotonic() < deadline and process.poll() is None:
        engines = [child for child in psutil.Process(process.pid).children(recursive=True) if child.name() == "llama-server"]
        time.sleep(0.1)
    assert engines, "no llama-server started for the first probe"
    assert _scratch_dirs(process.pid)
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    process.stderr.close()
    assert process.returncode != 0 and _scratch_dirs(process.pid) == []
    assert not [engine for engine in engines if engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE]
    assert not (isolated_env / "calibration.json").exists()

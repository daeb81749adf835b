"""Speed: tierlocal's calibrated estimate beside what the real CPU llama-server does, and beside
the bandwidth-only figure `check` showed before calibration.

First this CPU is calibrated exactly as `tierlocal hw --calibrate` does it (probe models only;
none of the models below is used in the fit), or the cached calibration is reused with
--reuse. Then each model is loaded by the prepared CPU build, a prompt is processed and 32
tokens generated, and llama-server's own timings give prefill and decode tokens/s. Models: the
real Gemma 3 270M and sparse GGUFs of published shapes (tests/support/sparse_models.py): dense
small/large, MoE, MLA MoE and a hybrid (LFM2: short-convolution blocks beside attention).

The sparse models' weights are zeros, so a MoE router sends every token to the same experts:
their prefill is that of a batch the experts share, which real routing spreads thinner.

With --prior the CPU is not calibrated: it is priced as `check` prices a CPU before calibration,
from published llama-bench runs of CPUs of its instruction set at its core count
(recipes/cpu_speed.toml, tierlocal/fit/cpu_prior.py).

    .venv/bin/python -m bench.speed_accuracy [--reuse | --prior] [--prompt N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.support.assets import load_assets
from tests.support.sparse_models import DEEPSEEK_V2_LITE, LFM2_1_2B, LLAMA3_8B, QWEN3_8B, QWEN3_30B_A3B, write_sparse_gguf
from tierlocal.engines.llama_server import read_engine_flags
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.device_speed import DeviceSpeed
from tierlocal.fit.estimate import Machine, RunRequest, estimate_run
from tierlocal.fit.model import model_spec
from tierlocal.fit.speed import estimate_speed
from tierlocal.measure.calibrate import DECODE_TOKENS, calibrate_cpu, time_probe
from tierlocal.measure.calibration_cache import calibration_key, load_calibration, save_calibration

GIB = 2**30
SHAPES = {
    "llama-3-8b": ("dense large", LLAMA3_8B),
    "qwen3-8b": ("dense large", QWEN3_8B),
    "lfm2-1.2b": ("hybrid", LFM2_1_2B),
    "deepseek-v2-lite": ("MLA MoE", DEEPSEEK_V2_LITE),
    "qwen3-30b-a3b": ("MoE", QWEN3_30B_A3B),
}
#: The bandwidth-only figure assumed this for system RAM (recipes/gpus.toml [host]).
ASSUMED_RAM_BYTES_PER_S = 40_000_000_000


def _prior() -> DeviceSpeed:
    """What check prices this CPU with before calibration."""
    from tierlocal.catalog import load_host_defaults
    from tierlocal.cpu_figures import host_speed_here
    from tierlocal.hardware.detect import detect
    from tierlocal.plan.machine import machine_for

    speed = host_speed_here(None, machine_for(detect(), load_host_defaults()))
    if speed is None:
        raise SystemExit("no published runs of CPUs like this one (recipes/cpu_speed.toml): nothing to compare")
    print(f"the prior: {speed.note}")
    return speed


def _speed(binary: Path, version: str, reuse: bool) -> DeviceSpeed:
    key = calibration_key(version)
    if reuse and (cached := load_calibration(key)) is not None:
        print(f"reusing the cached calibration for {key}")
        return cached
    print("calibrating this CPU on probe models (tierlocal hw --calibrate) …", flush=True)
    speed, raw = calibrate_cpu(binary, version, say=lambda line: print("  " + line, flush=True))
    save_calibration(key, speed, raw, memory_bytes_per_s=None)
    return speed


def _row(name: str, kind: str, path: Path, binary: Path, speed: DeviceSpeed, prompt: int, scratch: Path) -> dict[str, object]:
    spec = model_spec(read_headers(str(path)))
    machine = Machine(None, None, 0, 0, None, 64 * GIB, 64 * GIB, ASSUMED_RAM_BYTES_PER_S, 0, 0)
    estimate = estimate_run(spec, RunRequest(ctx=4096, parallel=1), machine)
    depth = prompt + DECODE_TOKENS // 2
    predicted = estimate_speed(spec, estimate, speed, depth=depth, prefill_prompt=prompt, prompts=(prompt,))
    slow = (predicted.prefill_tokens_per_s or 1) < prompt / 5  # a prompt longer than 5 s: one timed run
    started = time.monotonic()
    prefill_s, decode_s = time_probe(binary, path, prompt, log_dir=scratch, repeats=1 if slow else 3, warmup=16 if slow else None)
    return {
        "model": name,
        "shape": kind,
        "prompt": prompt,
        "decode_measured": 1 / decode_s,
        "decode_predicted": predicted.decode_tokens_per_s,
        "decode_bandwidth_only": estimate.est_decode_tokens_per_s,
        "prefill_measured": 1 / prefill_s,
        "prefill_predicted": predicted.prefill_tokens_per_s,
        "first_token_measured_s": prompt * prefill_s + decode_s,
        "first_token_predicted_s": dict(predicted.first_token_s).get(prompt),
        "uncalibrated_types": list(predicted.uncalibrated_types),
        "seconds": round(time.monotonic() - started, 1),
    }


def _print(rows: list[dict[str, object]]) -> None:
    print()
    print(
        f"{'model':18} {'shape':12} | {'decode tok/s: actual':>20} {'predicted':>9} {'ratio':>6} {'bw-only':>8} {'ratio':>6} | "
        f"{'prefill: actual':>15} {'predicted':>9} {'ratio':>6} | {'TTFT s: actual':>14} {'pred':>6}"
    )
    for row in rows:
        d_m, d_p, d_b = (float(row[k]) for k in ("decode_measured", "decode_predicted", "decode_bandwidth_only"))  # type: ignore[arg-type]
        p_m, p_p = float(row["prefill_measured"]), float(row["prefill_predicted"])  # type: ignore[arg-type]
        print(
            f"{row['model']:18} {row['shape']:12} | {d_m:20.1f} {d_p:9.1f} {d_p / d_m:6.2f} {d_b:8.1f} {d_b / d_m:6.2f} | "
            f"{p_m:15.1f} {p_p:9.1f} {p_p / p_m:6.2f} | {float(row['first_token_measured_s']):14.2f} "
            f"{float(row['first_token_predicted_s'] or 0):6.2f}"  # type: ignore[arg-type]
        )
    decode = [abs(float(r["decode_predicted"]) / float(r["decode_measured"]) - 1) for r in rows]  # type: ignore[arg-type]
    prefill = [abs(float(r["prefill_predicted"]) / float(r["prefill_measured"]) - 1) for r in rows]  # type: ignore[arg-type]
    print(f"\nworst decode error {max(decode):.0%} (target 25%), worst prefill error {max(prefill):.0%} (target 35%)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", action="store_true", help="use the cached calibration when there is one")
    parser.add_argument("--prior", action="store_true", help="no calibration: the published-runs prior check uses before one")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per measurement (default 256)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    assets = load_assets()
    if assets is None:
        print("test assets are not prepared: run bash tests/run.sh (or python tests/assets/prepare.py) first", file=sys.stderr)
        return 2
    binary = assets.llama_server_cpu
    version = read_engine_flags(binary).version
    speed = _prior() if args.prior else _speed(binary, version, args.reuse)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tierlocal-speed-") as scratch_name:
        scratch = Path(scratch_name)
        models = [("gemma-3-270m", "dense small", assets.gemma_gguf)]
        models += [(name, kind, write_sparse_gguf(scratch / f"{name}.gguf", arch)) for name, (kind, arch) in SHAPES.items()]
        for name, kind, path in models:
            rows.append(_row(name, kind, path, binary, speed, args.prompt, scratch))
            print(
                f"  {name}: decode {rows[-1]['decode_measured']:.1f} tok/s, prefill {rows[-1]['prefill_measured']:.1f} tok/s "
                f"({rows[-1]['seconds']} s)",
                flush=True,
            )
            if path != assets.gemma_gguf:
                path.unlink()
    _print(rows)
    if args.json:
        args.json.write_text(json.dumps({"calibration": speed.to_json(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

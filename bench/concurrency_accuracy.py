"""Many users on this CPU: tierlocal's estimate for N concurrent users beside what the real
llama-server does with N real streaming clients, and beside what the single-stream figure says.

Each model is served by the prepared CPU build with ``-np`` slots (as many as the largest user
count) sharing one KV cache (``-kvu``, as `tierlocal serve --users` runs it), and the clients of
`tierlocal bench --users` (tierlocal/serve/bench_users.py) start N requests together, each a
prompt of its own (no shared cached prefix), each generating the same number of tokens.
The estimate (tierlocal/fit/concurrency.py) prices the same run on this CPU's
calibration (`tierlocal hw --calibrate`, cached; run it first) or, with --prior, on the
published-runs prior; "anchored" is the estimate scaled to the measured single user, as `check`
shows it once `tierlocal bench` has measured one stream. Models: the real Gemma 3 270M and sparse GGUFs of dense shapes (zero
weights send every MoE token to the same experts, so MoE is checked on published rows instead).

    .venv/bin/python -m bench.concurrency_accuracy [--users 1,2,4] [--prompt 256] [--tokens 48] [--models gemma,qwen3-1.7b,llama-3-8b]
        [--json FILE] [--reprice FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.support.assets import load_assets
from tests.support.sparse_models import LLAMA3_8B, QWEN3_1_7B, write_sparse_gguf
from tierlocal.engines.llama_server import read_engine_flags
from tierlocal.engines.process import start_child
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.concurrency import batch_costs, users_speed
from tierlocal.fit.cpu_kernels import CpuKernels, cpu_kernels
from tierlocal.fit.estimate import Machine, RunEstimate, RunRequest, estimate_run
from tierlocal.fit.host_memory import repack_rules
from tierlocal.fit.model import model_spec
from tierlocal.fit.speed import estimate_speed
from tierlocal.measure.calibration_cache import calibration_key, load_calibration
from tierlocal.serve.bench_users import bench_users, parse_users

GIB = 2**30
SPARSE = {"qwen3-1.7b": ("dense 1.7B", QWEN3_1_7B), "llama-3-8b": ("dense 8B", LLAMA3_8B)}
CTX_PER_SLOT = 1024


def _serve(binary: Path, model: Path, slots: int, port: int, scratch: Path):  # type: ignore[no-untyped-def]
    argv = [
        str(binary),
        "-m",
        str(model),
        "-c",
        str(CTX_PER_SLOT * slots),
        "-np",
        str(slots),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        "-kvu",
    ]
    child = start_child(argv, scratch / f"{model.stem}.log")
    if not child.wait_ready(f"http://127.0.0.1:{port}/health", 300).ready:
        child.stop()
        raise SystemExit(f"llama-server did not load {model}")
    return child


def _estimate(path: Path, slots: int) -> tuple[object, RunEstimate]:
    spec = model_spec(read_headers(str(path)))
    machine = Machine(None, None, 0, 0, None, 64 * GIB, 64 * GIB, 40_000_000_000, 0, 0)
    return spec, estimate_run(spec, RunRequest(ctx=CTX_PER_SLOT * slots, parallel=slots, kv_unified=True), machine)


def _kernels() -> CpuKernels:
    """This CPU's batch kernels, as `check` finds them."""
    from tierlocal.catalog import load_host_defaults
    from tierlocal.hardware.detect import detect
    from tierlocal.plan.machine import machine_for

    machine = machine_for(detect(), load_host_defaults())
    return cpu_kernels(machine.cpu_arch, frozenset(repack_rules(machine.cpu_arch, machine.cpu_features)))


def _rows(name: str, kind: str, path: Path, binary: Path, speed, counts, prompt: int, tokens: int, scratch: Path) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    slots = max(counts)
    child = _serve(binary, path, slots, 18200 + slots, scratch)
    try:
        started = time.monotonic()
        points = bench_users(
            f"http://127.0.0.1:{18200 + slots}", counts, prompt_tokens=prompt, tokens=tokens, say=lambda line: print("   ", line, flush=True)
        )
    finally:
        child.stop()
    measured = [
        {
            "model": name,
            "shape": kind,
            "users": point.users,
            "per_user_measured": point.per_user_decode_tokens_per_s,
            "aggregate_measured": point.aggregate_decode_tokens_per_s,
            "first_token_measured_s": point.first_token_quantile(0.5),
            "prompt_tokens": point.to_json()["prompt_tokens"],
            "seconds": round(time.monotonic() - started, 1),
        }
        for point in points
    ]
    return _priced(measured, path, speed, slots, prompt, tokens)


def _priced(rows: list[dict[str, object]], path: Path, speed, slots: int, prompt: int, tokens: int) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """``rows`` (measured) with the current model's estimate beside each, and the single-stream figure's."""
    spec, estimate = _estimate(path, slots)
    costs = batch_costs(spec, estimate.request, {"host": speed, "gpu": None}, cpu=_kernels(), prompt=prompt)
    single = estimate_speed(spec, estimate, speed, depth=prompt + tokens // 2, prefill_prompt=prompt, prompts=(prompt,))
    assert costs is not None
    out = []
    for row in rows:
        predicted = users_speed(costs, int(row["users"]), slots, prompt=int(row.get("prompt_tokens") or prompt), tokens=tokens)  # type: ignore[call-overload]
        out.append(
            {
                **row,
                "per_user_predicted": predicted.per_user_decode_tokens_per_s,
                "per_user_single_stream": single.decode_tokens_per_s,
                "aggregate_predicted": predicted.aggregate_decode_tokens_per_s,
                "first_token_predicted_s": predicted.first_token_p50_s,
                "first_token_single_stream_s": dict(single.first_token_s).get(prompt),
            }
        )
    return out


def _reprice(saved: Path, speed, assets, scratch: Path) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """The measured rows of an earlier run (``--json``'s file), priced again with the current model."""
    data = json.loads(saved.read_text())
    rows, out = data["rows"], []
    slots, prompt, tokens = max(int(u) for u in data["users"]), int(data["prompt"]), int(data.get("tokens", 48))
    for name in dict.fromkeys(str(row["model"]) for row in rows):
        path = assets.gemma_gguf if name == "gemma" else write_sparse_gguf(scratch / f"{name}.gguf", SPARSE[name][1])
        out += _priced([row for row in rows if row["model"] == name], path, speed, slots, prompt, tokens)
    return out


def _print(rows: list[dict[str, object]]) -> None:
    print(
        f"\n{'model':12} {'users':>5} | {'per-user tok/s: actual':>22} {'predicted':>9} {'ratio':>6} {'1-stream':>8} {'ratio':>6} | "
        f"{'first token s: actual':>21} {'predicted':>9} {'ratio':>6} {'1-stream':>8} {'ratio':>6}"
    )
    for r in rows:
        d_m, d_p, d_s = (float(r[k]) for k in ("per_user_measured", "per_user_predicted", "per_user_single_stream"))  # type: ignore[arg-type]
        t_m, t_p, t_s = (float(r[k] or 0) for k in ("first_token_measured_s", "first_token_predicted_s", "first_token_single_stream_s"))  # type: ignore[arg-type]
        print(
            f"{r['model']:12} {r['users']:>5} | {d_m:22.1f} {d_p:9.1f} {d_p / d_m:6.2f} {d_s:8.1f} {d_s / d_m:6.2f} | "
            f"{t_m:21.2f} {t_p:9.2f} {t_p / t_m:6.2f} {t_s:8.2f} {t_s / t_m:6.2f}"
        )
    for model in dict.fromkeys(str(r["model"]) for r in rows):
        mine = [r for r in rows if r["model"] == model]
        one = next(r for r in mine if r["users"] == min(int(x["users"]) for x in mine))  # type: ignore[call-overload]
        speed = float(one["per_user_measured"]) / float(one["per_user_predicted"])  # type: ignore[arg-type]
        wait = float(one["first_token_measured_s"]) / float(one["first_token_predicted_s"])  # type: ignore[arg-type]
        anchored = [
            f"{r['users']}: {float(r['per_user_predicted']) * speed / float(r['per_user_measured']):.2f} / "  # type: ignore[arg-type]
            f"{float(r['first_token_predicted_s']) * wait / float(r['first_token_measured_s']):.2f}"  # type: ignore[arg-type]
            for r in mine
        ]
        print(f"anchored at one user, {model} (users: per-user decode / first token, predicted ÷ actual): " + ", ".join(anchored))
    decode = [abs(float(r["per_user_predicted"]) / float(r["per_user_measured"]) - 1) for r in rows]  # type: ignore[arg-type]
    first = [abs(float(r["first_token_predicted_s"]) / float(r["first_token_measured_s"]) - 1) for r in rows]  # type: ignore[arg-type]
    print(f"\nworst per-user decode error {max(decode):.0%} (target 20%), worst first-token error {max(first):.0%} (target 30%)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,2,4", help="user counts (default 1,2,4)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per user (default 256)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per user (default 48)")
    parser.add_argument("--models", default="gemma,qwen3-1.7b,llama-3-8b", help="which models (default all three)")
    parser.add_argument("--prior", action="store_true", help="price this CPU with the published-runs prior, not its calibration")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--reprice", type=Path, metavar="FILE", help="no engine: price the measured rows of an earlier --json file again")
    args = parser.parse_args(argv)
    assets = load_assets()
    if assets is None:
        print("test assets are not prepared: run bash tests/run.sh (or python tests/assets/prepare.py) first", file=sys.stderr)
        return 2
    binary = assets.llama_server_cpu
    if args.prior:
        from bench.speed_accuracy import _prior

        speed = _prior()
    elif (speed := load_calibration(calibration_key(read_engine_flags(binary).version))) is None:
        print("this CPU is not calibrated for this engine build: run `tierlocal hw --calibrate` first (or give --prior)", file=sys.stderr)
        return 2
    counts, wanted = parse_users(args.users), args.models.split(",")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="tierlocal-users-") as scratch_name:
        scratch = Path(scratch_name)
        if args.reprice:
            rows = _reprice(args.reprice, speed, assets, scratch)
            saved = json.loads(args.reprice.read_text())
            counts, args.prompt, args.tokens = tuple(saved["users"]), saved["prompt"], saved.get("tokens", args.tokens)
        models = [("gemma", "dense 270M", assets.gemma_gguf)] if "gemma" in wanted and not args.reprice else []
        sparse = [] if args.reprice else [name for name in SPARSE if name in wanted]
        models += [(name, SPARSE[name][0], write_sparse_gguf(scratch / f"{name}.gguf", SPARSE[name][1])) for name in sparse]
        for name, kind, path in models:
            print(f"{name}: {len(counts)} user counts, {max(counts)} slots", flush=True)
            rows += _rows(name, kind, path, binary, speed, counts, args.prompt, args.tokens, scratch)
    _print(rows)
    if args.json:
        record = {"calibration": speed.to_json(), "users": list(counts), "prompt": args.prompt, "tokens": args.tokens, "rows": rows}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

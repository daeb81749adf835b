"""Predicted vs actual memory per component and device, against the real llama-server.

Runs the prepared Vulkan build of llama-server (Mesa's software device with
GGML_VK_VISIBLE_DEVICES=0, so partial offload is real) over a matrix of -c, -np, -ngl and
cache types on the real Gemma 3 model and on sparse GGUFs of real architectures
(tests/support/sparse_models.py: Llama-3-8B, Qwen3-8B, Qwen3-30B-A3B, DeepSeek-V2-Lite, LFM2-1.2B,
Granite-4.0-H-350M, Qwen3-Next-80B-A3B's width in 4 blocks, Nemotron-Nano-9B-v2's first 16 blocks, Mamba-2.8B, Falcon-H1-1.5B,
Kimi-Linear-48B-A3B's first 4 blocks, RWKV7-Goose-Pile-168M, RWKV-6-World-1.6B, AI21-Jamba-1.5-Mini's
first 8 blocks, and Kimi K3 at full width in 2 blocks on the CPU build), parses the buffer sizes it
reports in its load log, and prints them beside tierlocal's estimate and, where Go is
available, gguf-parser-go v0.28.1's (bench/gguf_parser_peer, built once into the test cache),
with the error of each against llama.cpp.

    .venv/bin/python -m bench.estimate_accuracy [--json] [--projectors-only]

Multimodal projectors (--mmproj): sparse Gemma 3 SigLIP projectors (tests/support/sparse_projectors.py)
loaded beside the real Gemma 3 270M, on the CPU build with flash attention on and off and on the
Vulkan device (where scores too large for its buffers run on the CPU): weights and compute per
buffer against tierlocal/fit/projector.py and gguf-parser-go's projector estimate.

Needs the test assets (bash tests/run.sh, or python tests/assets/prepare.py). Components not
estimated (the CPU build's compute buffer beside Vulkan loads) are printed as actual only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import httpx2

from tests.assets import prepare
from tests.support.engines import LLVMPIPE_MAX_TENSOR_BYTES, free_port
from tests.support.sparse_models import (
    DEEPSEEK_V2_LITE,
    FALCON_H1_1_5B,
    GRANITE_4_H_350M,
    JAMBA_MINI_8L,
    KIMI_K3_2L,
    KIMI_LINEAR_4L,
    LFM2_1_2B,
    LLAMA3_8B,
    MAMBA_2_8B,
    NEMOTRON_H_9B_16L,
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN3_NEXT_4L,
    RWKV6_1B6,
    RWKV7_168M,
    write_sparse_gguf,
)
from tests.support.sparse_projectors import GEMMA3_SIGLIP_TO_270M, write_sparse_projector
from tierlocal.fetch.sources import read_headers
from tierlocal.fit.estimate import Machine, RunRequest, estimate_run
from tierlocal.fit.memory import compute_buffer_bytes, gpu_layers, host_compute_bytes, kv_cache, output_buffer_bytes, server_context, weights_split
from tierlocal.fit.model import model_spec
from tierlocal.fit.projector import projector_spec, projector_usage
from tierlocal.fit.search import plan_run

MIB = 1024 * 1024
LINES = {
    "weights": re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"(?:llama_kv_cache:\s+(\S+) KV|llama_memory_recurrent:\s+(\S+) RS) buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB"),
}
# (model, -c, -np (None = auto), cache type, -ngl[, --n-cpu-moe])
MATRIX: list[tuple] = [
    ("gemma-3-270m", 2048, 1, "f16", 0),
    ("gemma-3-270m", 4096, 1, "f16", 5),
    ("gemma-3-270m", 4096, 2, "f16", 10),
    ("gemma-3-270m", 8192, None, "f16", 19),
    ("gemma-3-270m", 3000, 3, "f16", 19),
    ("gemma-3-270m", 16384, 1, "q8_0", 12),
    ("gemma-3-270m", 32768, 1, "q4_0", 19),
    ("llama-3-8b", 4096, 1, "f16", 0),
    ("llama-3-8b", 8192, 2, "q8_0", 9),
    ("qwen3-8b", 8192, None, "f16", 5),
    ("qwen3-30b-a3b", 16384, 1, "f16", 3),
    ("lfm2-1.2b", 8192, 2, "f16", 9),
    ("qwen3-30b-a3b", 4096, 1, "f16", 99, 46),
    ("granite-4.0-h-350m", 8192, 2, "f16", 0),
    ("qwen3-next-4-blocks", 8192, 2, "f16", 0),
    ("nemotron-h-9b-16-blocks", 8192, 2, "f16", 0),
    ("mamba-2.8b", 8192, 2, "f16", 0),
    ("falcon-h1-1.5b", 8192, 2, "f16", 0),
    ("kimi-linear-4-blocks", 8192, 2, "f16", 0),
    ("rwkv7-168m", 8192, 2, "f16", 0),
    ("rwkv6-1b6", 8192, 2, "f16", 0),
    ("jamba-mini-8-blocks", 8192, 2, "f16", 0),
]
# DeepSeek-V2-Lite (MLA) runs on the CPU build only: llvmpipe compiles its shaders for minutes.


# The compute buffer on the CPU build (where its formula is calibrated): (model, -c, -ub, -fa)
COMPUTE_MATRIX = [
    ("gemma-3-270m", 4096, 128, "on"),
    ("gemma-3-270m", 16384, 512, "on"),
    ("gemma-3-270m", 4096, 512, "off"),
    ("llama-3-8b", 4096, 512, "on"),
    ("llama-3-8b", 16384, 128, "off"),
    ("qwen3-8b", 16384, 512, "on"),
    ("qwen3-30b-a3b", 4096, 512, "on"),
    ("qwen3-30b-a3b", 16384, 128, "off"),
    ("deepseek-v2-lite", 4096, 512, "on"),
    ("deepseek-v2-lite", 16384, 128, "off"),
    ("lfm2-1.2b", 8192, 512, "on"),
    ("granite-4.0-h-350m", 8192, 512, "on"),
    ("qwen3-next-4-blocks", 8192, 512, "on"),
    ("nemotron-h-9b-16-blocks", 8192, 512, "on"),
    ("mamba-2.8b", 8192, 512, "on"),
    ("falcon-h1-1.5b", 8192, 512, "on"),
    ("kimi-linear-4-blocks", 8192, 512, "on"),
    ("kimi-k3-2-blocks", 8192, 512, "on"),
    ("rwkv6-1b6", 8192, 512, "on"),
    ("jamba-mini-8-blocks", 8192, 512, "on"),
]


def _load_log(
    binary: Path, model: Path, ctx: int, parallel: int | None, cache_type: str, ngl: int, extra: tuple[str, ...] = (), *, warmup: bool = False
) -> str:
    """The load log (a projector reserves its compute buffer only in the warm-up)."""
    port = free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-t", "2", "-lv", "4"]
    argv += [] if warmup else ["--no-warmup"]
    argv += [] if parallel is None else ["-np", str(parallel)]
    argv += ["-ngl", str(ngl), "-ctk", cache_type, "-ctv", cache_type]
    argv += list(extra) or ["-fa", "auto" if cache_type == "f16" else "on"]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"})
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx2.HTTPError:
                    pass
                time.sleep(0.25)
        finally:
            process.terminate()
            process.wait(timeout=30)
        log.seek(0)
        return log.read()


PEER_SOURCE = Path(__file__).resolve().parent / "gguf_parser_peer"
# llama.cpp's own per-device totals, printed at exit: "| - Vulkan0 (...) | total = free + ( self = model + context + compute) + ..."
BREAKDOWN_DEVICE = re.compile(r"common_memory_breakdown_print: \|\s+- (\S+) \(.*?\|\s+\d+ =\s+\d+ \+ \(\s*(\d+) =")
BREAKDOWN_HOST = re.compile(r"common_memory_breakdown_print: \|\s+- Host\s+\|\s+(\d+) =")
#: A machine that holds llvmpipe's device as the GPU, for the planner's own per-device totals.
LLVMPIPE = Machine("Vulkan0", "vulkan", 2048 * MIB, 2048 * MIB, None, 24 * 1024 * MIB, 20 * 1024 * MIB, 40 * 10**9, 0, 0, LLVMPIPE_MAX_TENSOR_BYTES)


#: The same device with a 5% margin (the estimator's stated accuracy) and no allowance for the
#: runtime: the planner packs it as full as it dares, so an underestimate would show as a
#: failed allocation or a device total over 2048 MiB.
LLVMPIPE_PLANNED = replace(LLVMPIPE, margin_bytes=2048 * MIB // 20)
# Planned loads: (model, -c, -np, cache type): the planner chooses -ngl (and --n-cpu-moe).
PLANNED = [
    ("gemma-3-270m", 32768, 1, "f16"),
    ("llama-3-8b", 8192, 2, "q8_0"),
    ("qwen3-8b", 8192, 1, "f16"),
    ("qwen3-30b-a3b", 16384, 1, "f16"),
    ("lfm2-1.2b", 8192, 2, "f16"),
]


# Projectors beside Gemma 3 270M: (name, image px, layers, build, -fa)
PROJECTOR_MATRIX = [
    ("siglip-896-27l", 896, 27, "cpu", "on"),
    ("siglip-896-27l", 896, 27, "cpu", "off"),
    ("siglip-448-4l", 448, 4, "cpu", "on"),
    ("siglip-448-4l", 448, 4, "cpu", "off"),
    ("siglip-448-4l", 448, 4, "vulkan", "off"),
    ("siglip-896-4l", 896, 4, "vulkan", "off"),
    ("siglip-896-27l", 896, 27, "vulkan", "off"),
]
CLIP_WEIGHTS = re.compile(r"load_hparams: model size:\s+([\d.]+) MiB")
CLIP_COMPUTE = re.compile(r"reserve_compute_meta:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")


def _projector_rows(assets: dict[str, str], sparse_dir: Path, peer: Path | None) -> list[dict[str, object]]:
    """Each PROJECTOR_MATRIX load: weights and compute per buffer, predicted and actual (MiB)."""
    rows: list[dict[str, object]] = []
    gemma = Path(assets["gemma_gguf"])
    for name, image, layers, build, flash_attn in PROJECTOR_MATRIX:
        shape = replace(GEMMA3_SIGLIP_TO_270M, name=name, image_size=image, n_layer=layers)
        path = sparse_dir / f"{name}.gguf"
        if not path.exists():
            write_sparse_projector(path, shape)
        spec = projector_spec(read_headers(str(path)))
        on_gpu = build == "vulkan"
        usage = projector_usage(spec, on_gpu=on_gpu, flash_attn=flash_attn == "on", max_tensor_bytes=LLVMPIPE_MAX_TENSOR_BYTES if on_gpu else None)
        binary = Path(assets["llama_server_vulkan" if on_gpu else "llama_server_cpu"])
        log = _load_log(binary, gemma, 2048, 1, "f16", 99 if on_gpu else 0, ("-fa", flash_attn, "--mmproj", str(path)), warmup=True)
        weights = CLIP_WEIGHTS.findall(log)
        compute = {device: float(mib) for device, mib in CLIP_COMPUTE.findall(log)}
        peer_weights = peer_compute = None
        if peer is not None:
            done = subprocess.run(
                [str(peer), str(path), "2048", "1", "99", "f16", "1" if flash_attn == "on" else "0"], capture_output=True, text=True, check=False
            )
            if done.returncode == 0:
                device = json.loads(done.stdout)[-1]
                peer_weights = sum(device["weight"][part] for part in ("input", "compute", "output")) / MIB
                peer_compute = (device["computation"]["graph"] + device["computation"]["input"]) / MIB
        device_name = "Vulkan0" if on_gpu else "CPU"
        case = f"gemma-3-270m + {name} -fa {flash_attn} ({build} build)"
        figures = [("weights", device_name, usage.weights_bytes / MIB, float(weights[-1]) if weights else 0.0, peer_weights)]
        figures.append(("compute", device_name, usage.compute_bytes / MIB, compute.get(device_name, 0.0), None if on_gpu else peer_compute))
        if on_gpu:
            figures.append(("compute", "CPU", usage.host_compute_bytes / MIB, compute.get("CPU", 0.0), None))
            figures.append(("total", "both", (usage.device_bytes + usage.host_compute_bytes) / MIB, float(weights[-1]) + sum(compute.values()), None))
        for component, device, ours, real, theirs in figures:
            rows.append(
                {
                    "case": case,
                    "component": f"mm-{component}",
                    "device": device,
                    "predicted_mib": round(ours, 2),
                    "actual_mib": real,
                    "error": _error(ours, real),
                    "gguf_parser_mib": None if theirs is None else round(theirs, 2),
                    "gguf_parser_error": None if theirs is None else _error(theirs, real),
                }
            )
    return rows


def _planned_loads(binary: Path, models: dict[str, Path], specs: dict[str, object]) -> list[dict[str, object]]:
    """Load each PLANNED case with the -ngl / --n-cpu-moe the planner chose for llvmpipe."""
    results = []
    for model_key, ctx, parallel, cache_type in PLANNED:
        request = RunRequest(ctx=ctx, parallel=parallel, ngl=None, n_cpu_moe=None, cache_type_k=cache_type, cache_type_v=cache_type, flash_attn=True)
        planned = plan_run(specs[model_key], request, LLVMPIPE_PLANNED)  # type: ignore[arg-type]
        ngl, n_cpu_moe = planned.request.ngl or 0, planned.request.n_cpu_moe or 0
        extra = ("--fit", "off", "-fa", "on") + (("--n-cpu-moe", str(n_cpu_moe)) if n_cpu_moe else ())
        log = _load_log(binary, models[model_key], ctx, parallel, cache_type, ngl, extra)
        offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
        device_total = {device: int(mib) for device, mib in BREAKDOWN_DEVICE.findall(log)}.get("Vulkan0")
        results.append(
            {
                "case": f"{model_key} -c {ctx} -np {parallel} -ctk/-ctv {cache_type}",
                "planned": f"-ngl {ngl}" + (f" --n-cpu-moe {n_cpu_moe}" if n_cpu_moe else ""),
                "predicted_gpu_mib": round(planned.devices[0].total_needed_bytes / MIB),
                "offloaded": f"{offloaded.group(1)}/{offloaded.group(2)}" if offloaded else "none",
                "vulkan0_total_mib": device_total,
                "loaded": "failed to allocate" not in log and "model loaded" in log,
            }
        )
    return results


def _peer_binary() -> Path | None:
    """gguf-parser-go's estimator as a command, built once with Go into the test cache."""
    binary = prepare.cache_root() / "gguf-parser-peer" / "gguf_parser_peer"
    if binary.is_file():
        return binary
    if not shutil.which("go"):
        return None
    binary.parent.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=PEER_SOURCE, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        print(f"gguf-parser-go peer did not build; comparing without it:\n{built.stderr[-2000:]}", file=sys.stderr)
        return None
    return binary


def _peer_estimate(peer: Path, model: Path, ctx: int, parallel: int | None, cache_type: str, ngl: int) -> dict[tuple[str, str], float]:
    """gguf-parser-go's weights and KV per device, keyed like the llama.cpp figures (MiB)."""
    flash = "1" if cache_type != "f16" else "0"
    done = subprocess.run(
        [str(peer), str(model), str(ctx), str(parallel or 4), str(ngl), cache_type, flash], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {}
    devices = json.loads(done.stdout)
    figures: dict[tuple[str, str], float] = {}
    for index, (weights_device, kv_device) in enumerate((("CPU_Mapped", "CPU"), ("Vulkan0", "Vulkan0"))):
        if index >= len(devices):
            break
        device = devices[index]
        weight = device["weight"]
        figures[("weights", weights_device)] = (weight["input"] + weight["compute"] + weight["output"]) / MIB
        figures[("kv", kv_device)] = (device["kvCache"]["key"] + device["kvCache"]["value"]) / MIB
    return figures


def _by_device(pattern: re.Pattern[str], log: str) -> dict[str, float]:
    """Sum the MiB per device; the last group is the size, the first non-empty one the device."""
    sizes: dict[str, float] = defaultdict(float)
    for groups in pattern.findall(log):
        *devices, mib = groups
        sizes[next(device for device in devices if device)] += float(mib)
    return dict(sizes)


def predicted_host_kv(kv: object, on_gpu: tuple[bool, ...]) -> int:
    return sum(size for size, offloaded in zip(kv.layer_bytes, on_gpu, strict=False) if not offloaded)  # type: ignore[attr-defined]


def _error(value: float, real: float) -> float:
    if real:
        return (value - real) / real
    return 0.0 if value < 0.01 else float("inf")


def _print_row(row: dict[str, object]) -> None:
    ours = "-" if row["predicted_mib"] is None else f"{row['predicted_mib']:.2f}"
    ours_error = "n/a" if row["error"] is None else f"{row['error']:+.2%}"
    theirs = "-" if row["gguf_parser_mib"] is None else f"{row['gguf_parser_mib']:.2f}"
    theirs_error = "n/a" if row["gguf_parser_error"] is None else f"{row['gguf_parser_error']:+.1%}"
    print(
        f"{row['case']:58} {row['component']:10} {row['device']:12} {row['actual_mib']:>10.2f} {ours:>10} {ours_error:>8} {theirs:>11} "
        f"{theirs_error:>9}"
    )


HEADER = f"{'case':58} {'component':10} {'device':12} {'llama.cpp':>10} {'tierlocal':>10} {'error':>8} {'gguf-parser':>11} {'error':>9}"


def main() -> None:
    assets = json.loads(prepare.manifest_path().read_text())
    binary = Path(assets["llama_server_vulkan"])
    sparse_dir = Path(tempfile.mkdtemp(prefix="tierlocal-bench-"))
    if "--projectors-only" in sys.argv[1:]:
        projector_rows = _projector_rows(assets, sparse_dir, _peer_binary())
        shutil.rmtree(sparse_dir)
        if "--json" in sys.argv[1:]:
            print(json.dumps({"components": projector_rows}, indent=2))
            return
        print(HEADER)
        for row in projector_rows:
            _print_row(row)
        return
    models = {"gemma-3-270m": Path(assets["gemma_gguf"])}
    for key, arch in (
        ("llama-3-8b", LLAMA3_8B),
        ("qwen3-8b", QWEN3_8B),
        ("qwen3-30b-a3b", QWEN3_30B_A3B),
        ("deepseek-v2-lite", DEEPSEEK_V2_LITE),
        ("lfm2-1.2b", LFM2_1_2B),
        ("granite-4.0-h-350m", GRANITE_4_H_350M),
        ("qwen3-next-4-blocks", QWEN3_NEXT_4L),
        ("nemotron-h-9b-16-blocks", NEMOTRON_H_9B_16L),
        ("mamba-2.8b", MAMBA_2_8B),
        ("falcon-h1-1.5b", FALCON_H1_1_5B),
        ("kimi-linear-4-blocks", KIMI_LINEAR_4L),
        ("rwkv7-168m", RWKV7_168M),
        ("rwkv6-1b6", RWKV6_1B6),
        ("jamba-mini-8-blocks", JAMBA_MINI_8L),
        ("kimi-k3-2-blocks", KIMI_K3_2L),
    ):
        models[key] = write_sparse_gguf(sparse_dir / f"{key}.gguf", arch)
    specs = {key: model_spec(read_headers(str(path))) for key, path in models.items()}
    peer = _peer_binary()
    rows = []
    for model_key, ctx, parallel, cache_type, ngl, *moe in MATRIX:
        n_cpu_moe = moe[0] if moe else 0
        model, spec = models[model_key], specs[model_key]
        params = server_context(spec, ctx=ctx, parallel=parallel, cache_type_k=cache_type, cache_type_v=cache_type)
        kv = kv_cache(spec, params)
        on_gpu = gpu_layers(spec, ngl)
        weights = weights_split(spec, ngl, n_cpu_moe=n_cpu_moe, max_tensor_bytes=LLVMPIPE_MAX_TENSOR_BYTES)
        predicted = {
            ("weights", "Vulkan0"): weights.gpu_bytes / MIB,
            ("weights", "CPU_Mapped"): weights.cpu_mapped_bytes / MIB,
            ("kv", "Vulkan0"): sum(b for b, g in zip(kv.layer_bytes, on_gpu, strict=False) if g) / MIB,
            ("kv", "CPU"): sum(b for b, g in zip(kv.layer_bytes, on_gpu, strict=False) if not g) / MIB,
            ("output", "host"): output_buffer_bytes(spec, params) / MIB,
        }
        # gguf-parser-go takes no --n-cpu-moe: it is compared on the other cases.
        peer_figures = _peer_estimate(peer, model, ctx, parallel, cache_type, ngl) if peer and not n_cpu_moe else {}
        moe_args = ("--n-cpu-moe", str(n_cpu_moe), "-fa", "auto") if n_cpu_moe else ()
        log = _load_log(binary, model, ctx, parallel, cache_type, ngl, moe_args)
        actual = {(component, device): mib for component, pattern in LINES.items() for device, mib in _by_device(pattern, log).items()}
        actual[("output", "host")] = sum(mib for (component, _), mib in list(actual.items()) if component == "output")
        # Per-device totals as llama.cpp prints them (integer MiB): the estimator's own plan
        # for the GPU (weights + KV + compute, with its partial-offload allowance) and the host
        # (mapped weights + KV/state + host compute; the logits buffer is not in the breakdown).
        flash = True  # -fa auto turns flash attention on for every model here; q8_0/q4_0 run with -fa on
        planned = estimate_run(
            spec,
            RunRequest(ctx=ctx, parallel=parallel, ngl=ngl, n_cpu_moe=n_cpu_moe, cache_type_k=cache_type, cache_type_v=cache_type, flash_attn=flash),
            LLVMPIPE,
        )
        gpu_device = planned.devices[0]
        predicted[("total", "Vulkan0")] = (gpu_device.weights_bytes + gpu_device.kv_bytes + gpu_device.compute_bytes) / MIB
        predicted[("compute", "Vulkan0")] = gpu_device.compute_bytes / MIB
        predicted[("compute", "Vulkan_Host")] = host_compute_bytes(spec, params, flash_attn=flash) / MIB
        predicted[("total", "Host")] = (
            weights.cpu_mapped_bytes + predicted_host_kv(kv, on_gpu) + host_compute_bytes(spec, params, flash_attn=flash)
        ) / MIB
        for device, self_mib in BREAKDOWN_DEVICE.findall(log):
            actual[("total", device)] = float(self_mib)
        for self_mib in BREAKDOWN_HOST.findall(log):
            actual[("total", "Host")] = float(self_mib)
        case = f"{model_key} -c {ctx} -np {parallel or 'auto'} -ctk/-ctv {cache_type} -ngl {ngl}" + (f" --n-cpu-moe {n_cpu_moe}" if n_cpu_moe else "")
        for (component, device), value in sorted(predicted.items()):
            real = actual.get((component, device), 0.0)
            error = _error(value, real)
            peer_value = peer_figures.get((component, device))
            rows.append(
                {
                    "case": case,
                    "component": component,
                    "device": device,
                    "predicted_mib": round(value, 2),
                    "actual_mib": real,
                    "error": error,
                    "gguf_parser_mib": None if peer_value is None else round(peer_value, 2),
                    "gguf_parser_error": None if peer_value is None else _error(peer_value, real),
                }
            )
        for (component, device), real in sorted(actual.items()):
            if component == "compute" and (component, device) not in predicted:
                rows.append(
                    {
                        "case": case,
                        "component": component,
                        "device": device,
                        "predicted_mib": None,
                        "actual_mib": real,
                        "error": None,
                        "gguf_parser_mib": None,
                        "gguf_parser_error": None,
                    }
                )
    cpu_binary = Path(assets["llama_server_cpu"])
    for model_key, ctx, n_ubatch, flash_attn in COMPUTE_MATRIX:
        spec = specs[model_key]
        params = server_context(spec, ctx=ctx, parallel=1, n_ubatch=n_ubatch)
        predicted = compute_buffer_bytes(spec, params, flash_attn=flash_attn == "on") / MIB
        log = _load_log(cpu_binary, models[model_key], ctx, 1, "f16", 0, ("-ub", str(n_ubatch), "-fa", flash_attn, "--no-repack"))
        real = _by_device(LINES["compute"], log).get("CPU", 0.0)
        case = f"{model_key} -c {ctx} -ub {n_ubatch} -fa {flash_attn} (CPU build)"
        rows.append(
            {
                "case": case,
                "component": "compute",
                "device": "CPU",
                "predicted_mib": round(predicted, 2),
                "actual_mib": real,
                "error": _error(predicted, real),
                "gguf_parser_mib": None,
                "gguf_parser_error": None,
            }
        )
    rows += _projector_rows(assets, sparse_dir, peer)
    planned_loads = _planned_loads(binary, models, specs)
    shutil.rmtree(sparse_dir)
    if "--json" in sys.argv[1:]:
        print(json.dumps({"components": rows, "planned_loads": planned_loads}, indent=2))
        return
    print(HEADER)
    for row in rows:
        _print_row(row)
    estimated = [
        row
        for row in rows
        if row["error"] is not None and row["component"] not in ("total", "mm-total") and not str(row["case"]).endswith("(vulkan build)")
    ]
    worst = max(abs(row["error"]) for row in estimated)
    totals = [row for row in rows if row["component"] == "total" and row["error"] is not None]
    for device in ("Vulkan0", "Host"):
        errors = sorted(row["error"] for row in totals if row["device"] == device and row["actual_mib"] > 0)
        if errors:
            print(f"per-device total, {device}: {len(errors)} loads, error {errors[0]:+.1%} … {errors[-1]:+.1%} (llama.cpp's integer-MiB breakdown)")
    print(
        f"\n{len(estimated)} estimated components over {len(MATRIX) + len(COMPUTE_MATRIX)} loads; tierlocal's worst error {worst:.3%} (MiB as "
        "llama.cpp prints them, 2 decimals)"
    )
    compared = [row for row in rows if row["gguf_parser_error"] is not None and row["actual_mib"] > 0]
    if compared:
        median = sorted(abs(row["gguf_parser_error"]) for row in compared)[len(compared) // 2]
        worst_peer = max(abs(row["gguf_parser_error"]) for row in compared)
        print(f"gguf-parser-go v0.28.1 on the {len(compared)} nonzero components it reports: median error {median:.1%}, worst {worst_peer:.1%}")
        print(
            "  (it has no -np auto: given 4 slots; it knows no device binding limit, so the output matrix it places on\n"
            "   the GPU stays on the CPU here on llvmpipe — part of its partial-offload weight error is that device limit)"
        )
    print("\nPlanned -ngl on llvmpipe (2048 MiB, 5% margin, --fit off); Vulkan0 totals in MiB:")
    print(f"  {'case':44} {'plan':24} {'predicted':>9} {'llama.cpp':>9} {'offloaded':>9} loaded")
    for load in planned_loads:
        print(
            f"  {load['case']:44} {load['planned']:24} {load['predicted_gpu_mib']:>9} {load['vulkan0_total_mib'] or '-':>9} "
            f"{load['offloaded']:>9} {'yes' if load['loaded'] else 'NO'}"
        )
    print("Compute buffers: calibrated formulas (tierlocal/fit/memory.py): the CPU backend's, and on the Vulkan device the partial-offload rule.")


if __name__ == "__main__":
    main()

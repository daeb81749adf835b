"""Each tool's decode or prefill estimate for a published llama-bench row's model on its card,
asked the way a user of that tool gets it (bench/gpu_speed.py prints them side by side).

- tierlocal: ``tierlocal check ENTRY --gpu CARD --json`` for the catalog entry of the row's
  model and quantisation, wholly on the GPU (``via check``); a file the catalog lacks (F16,
  Q4_0) priced with the same card figures check uses, on that file's bytes (``via fit``).

- LlamaFit 0.1.1: ``llamafit --profile FILE --json plan MODEL --quant Q --context 512`` with a
  hardware profile (its schema_version 1) naming the card and its memory; bandwidth and
  compute come from LlamaFit's own table (``speed.gen_tps``, ``speed.pp_tps``). A unified
  machine is described as a card with its GPU share of memory: 0.1.1 plans the GPU only for a
  card that states its VRAM. A card its table lacks gets its fallback figure, kept as its answer
  and marked.
- llmfit 1.1.17: ``llmfit --no-dashboard --ram R plan MODEL --context 512 --quant Q --json``
  with a stand-in ``nvidia-smi`` first on PATH answering its query
  (``--query-gpu=addressing_mode,memory.total,memory.free,name``) with the card's driver name
  and memory; the full-offload path's ``estimated_tps``. An Apple chip is read from
  /proc/cpuinfo, so a fake one is bind-mounted in a private mount namespace (``unshare -m``;
  root). It states prefill only from a hardware profile that gives TFLOPs, which cannot name
  the card, so no llmfit prefill figure is asked for.

Context 512: both charge the KV cache of the context to each token; llama-bench's rows are at
a few hundred tokens. Neither peer is a dependency: each runs from its own venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tierlocal.catalog import find_gpu, find_unified
from tierlocal.fit.gpu_speed import PublishedRow
from tierlocal.gpu_figures import gpu_speed_for

__all__ = ["Figure", "tierlocal_figure", "llamafit_figure", "llmfit_figure", "quant_of"]

GIB = 1024**3
#: The catalog entry of a published row's model and quantisation (llama-bench's names).
CATALOG = {
    ("llama 8B", "Q4_K - Medium"): ("llama-3.1-8b", "Q4_K_M"),
    ("llama 70B", "Q4_K - Medium"): ("llama-3.3-70b", "Q4_K_M"),
    ("gpt-oss 20B", "MXFP4 MoE"): ("gpt-oss-20b", "MXFP4_MOE"),
    ("gpt-oss 120B", "MXFP4 MoE"): ("gpt-oss-120b", "MXFP4_MOE"),
}
#: A unified-memory machine's RAM, as the rows' pages name the machine they ran on.
UNIFIED_RAM_GB = {"Apple M1 Max": 64, "Apple M2 Ultra": 192, "Apple M3 Max": 64, "DGX Spark (GB10)": 128}


@dataclass(frozen=True)
class Figure:
    """One tool's decode or prefill tokens/s for a row, and how it was had."""

    tokens_per_s: float | None
    via: str = ""


def quant_of(row: PublishedRow) -> str:
    """The row's quantisation as llama-bench names it (``Q4_K - Medium``, ``F16``, ``MXFP4 MoE``)."""
    return row.model.removeprefix(row.shape.name).strip()


def gpu_argument(card: str) -> str:
    """``--gpu`` for a row's card: a unified-memory machine with its RAM."""
    ram = UNIFIED_RAM_GB.get(card)
    return f"{card.removeprefix('Apple ')} {ram}GB" if ram else card


@cache
def _check(entry: str, card: str) -> dict[str, Any] | None:
    argv = [sys.executable, "-m", "tierlocal", "check", entry, "--gpu", gpu_argument(card), "--min-speed", "0", "--json"]
    argv += [] if card in UNIFIED_RAM_GB else ["--ram", "512GiB"]  # room for every entry on the card
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def tierlocal_figure(row: PublishedRow) -> Figure:
    """What tierlocal estimates for ``row``: check's catalog answer wholly on the GPU, else the
    card's fitted figures on the row's bytes."""
    decode = row.test.startswith("tg")
    mapped = CATALOG.get((row.shape.name, quant_of(row)))
    payload = _check(mapped[0], row.gpu) if mapped else None
    for candidate in payload.get("candidates", []) if payload else []:
        if mapped and candidate["quant"] == mapped[1] and candidate["where"] == "GPU":
            value = candidate["est_decode_tokens_per_s" if decode else "est_prefill_tokens_per_s"]
            return Figure(value, f"check ({candidate['speed_basis']})")
    speed = gpu_speed_for(row.gpu, None)
    if speed is None:
        return Figure(None, "no figures")
    if decode:
        rate = speed.decode_bytes_per_s["F16" if row.half else "*"]
        overhead = speed.token_overhead_s + speed.layer_overhead_s * row.shape.n_layer
        return Figure(1 / (row.read_bytes / rate + overhead), f"fit ({speed.source})")
    prefill = speed.prefill_flops_per_s.get("F16" if row.half else "*")
    return Figure(prefill / row.flops if prefill else None, f"fit ({speed.source})")


CONTEXT = 512
#: A row's (shape, quantisation) as each peer's catalog names the model, and the quant flag.
LLAMAFIT_MODELS = {
    ("llama 8B", "Q4_K - Medium"): ("llama-3.1-8b-instruct", "Q4_K_M"),
    ("llama 70B", "Q4_K - Medium"): ("llama-3.3-70b-instruct", "Q4_K_M"),  # its catalog has 3.3, the same shape
    ("gpt-oss 20B", "MXFP4 MoE"): ("gpt-oss-20b", "MXFP4"),
    ("gpt-oss 120B", "MXFP4 MoE"): ("gpt-oss-120b", "MXFP4"),
}
LLMFIT_MODELS = {
    ("llama 8B", "Q4_K - Medium"): ("meta-llama/Llama-3.1-8B-Instruct", "Q4_K_M"),
    ("llama 8B", "F16"): ("meta-llama/Llama-3.1-8B", "F16"),
    ("llama 70B", "Q4_K - Medium"): ("meta-llama/Llama-3.1-70B-Instruct", "Q4_K_M"),
    ("llama 70B", "F16"): ("meta-llama/Llama-3.1-70B-Instruct", "F16"),
    ("gpt-oss 20B", "MXFP4 MoE"): ("openai/gpt-oss-20b", "MXFP4"),
    ("gpt-oss 120B", "MXFP4 MoE"): ("openai/gpt-oss-120b", "MXFP4"),
}
#: The name each card's driver reports (nvidia-smi's ``name``; Apple: the chip).
DRIVER_NAMES = {
    "A100 80GB": "NVIDIA A100-SXM4-80GB",
    "A100 80GB PCIe": "NVIDIA A100 80GB PCIe",
    "A40": "NVIDIA A40",
    "H100 PCIe": "NVIDIA H100 PCIe",
    "L40S": "NVIDIA L40S",
    "RTX 4090": "NVIDIA GeForce RTX 4090",
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation",
    "RTX A6000": "NVIDIA RTX A6000",
    "RTX PRO 6000 Blackwell": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "DGX Spark (GB10)": "NVIDIA GB10",
    "Apple M1 Max": "Apple M1 Max",
    "Apple M2 Ultra": "Apple M2 Ultra",
    "Apple M3 Max": "Apple M3 Max",
}


def _memory_gib(card: str) -> float:
    """The card's memory, or a unified machine's GPU share of its RAM (GiB)."""
    spec = find_gpu(card)
    if spec is not None:
        return spec.memory_bytes / GIB
    unified = find_unified(card)
    ram = UNIFIED_RAM_GB[card]
    return ram * (unified.gpu_share(ram * GIB) if unified else 0.75)


def _json(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any] | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        payload = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def llamafit_figure(exe: str, row: PublishedRow) -> Figure:
    """LlamaFit's estimate for ``row`` (decode for tg rows, prefill for pp rows)."""
    model = LLAMAFIT_MODELS.get((row.shape.name, quant_of(row)))
    if model is None:
        return Figure(None, "model not in its catalog")
    driver = DRIVER_NAMES.get(row.gpu, row.gpu)
    vendor, backend = ("apple", "metal") if driver.startswith("Apple") else ("nvidia", "cuda")
    name = "tierlocal-" + "".join(c if c.isalnum() else "-" for c in row.gpu.lower())
    ram_gib = UNIFIED_RAM_GB.get(row.gpu, 256)
    profile = {
        "schema_version": 1,
        "name": name,
        "description": f"{row.gpu} for bench/gpu_speed.py",
        "provenance": "written by tierlocal's bench",
        "os": "macos" if vendor == "apple" else "linux",
        "os_version": "stand-in",
        "arch": "arm64" if vendor == "apple" else "x86_64",
        "cpu": {"model": "stand-in CPU", "physical_cores": 16},
        "memory": {"total": f"{ram_gib}GiB"},
        "gpus": [{"vendor": vendor, "name": driver, "vram_total": f"{int(_memory_gib(row.gpu) * 1024)}MiB", "backend_hint": backend}],
        "unified_memory": False,
        "backends": [backend, "cpu"],
    }
    with tempfile.TemporaryDirectory(prefix="bench-llamafit-") as scratch:
        path = Path(scratch) / f"{name}.json"  # LlamaFit wants the file named as the profile
        path.write_text(json.dumps(profile))
        plan = _json([exe, "--profile", str(path), "--json", "plan", model[0], "--quant", model[1], "--context", str(CONTEXT)])
    speed = plan.get("speed") if plan else None
    if not isinstance(speed, dict):
        return Figure(None, "no answer")
    notes = " ".join(str(note) for note in speed.get("notes") or [])
    mode = str((plan or {}).get("placement", {}).get("mode"))
    via = mode + ("; card not in its table" if "bandwidth is unknown" in notes else "")
    value = speed.get("gen_tps" if row.test.startswith("tg") else "pp_tps")
    if not row.test.startswith("tg") and "prompt processing is estimated on the CPU" in notes:
        via += "; prefill on the CPU"
    return Figure(float(value) if isinstance(value, int | float) and value > 0 else None, via)


_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *addressing_mode,memory.total,memory.free,name*) echo "None, {mib}, {mib}, {name}";;
  *memory.total,memory.free,name*) echo "{mib}, {mib}, {name}";;
  *memory.total,name*) echo "{mib}, {name}";;
  *) echo "stand-in nvidia-smi";;
esac
"""
_SYSTEM_PROFILER = """#!/bin/sh
printf 'Graphics/Displays:\\n\\n    {name}:\\n\\n      Chipset Model: {name}\\n'
printf '      Type: GPU\\n      Bus: Built-In\\n      Metal Support: Metal 3\\n'
"""


def _stand_in(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def llmfit_figure(exe: str, row: PublishedRow) -> Figure:
    """llmfit's decode estimate for ``row`` (no prefill: see the module's docstring)."""
    if not row.test.startswith("tg"):
        return Figure(None, "states prefill only from a profile")
    model = LLMFIT_MODELS.get((row.shape.name, quant_of(row)))
    if model is None:
        return Figure(None, "model not in its catalog")
    driver = DRIVER_NAMES.get(row.gpu, row.gpu)
    unified = row.gpu in UNIFIED_RAM_GB
    memory_mib = int((UNIFIED_RAM_GB[row.gpu] if unified else _memory_gib(row.gpu)) * 1024)  # a unified GPU: all of RAM, as it reads one
    with tempfile.TemporaryDirectory(prefix="bench-llmfit-") as scratch:
        bin_dir = Path(scratch)
        for tool in ("nvidia-smi", "rocm-smi", "system_profiler"):
            _stand_in(bin_dir / tool, "#!/bin/sh\nexit 9\n")  # nothing of this machine's answers
        argv = [
            exe,
            "--no-dashboard",
            "--ram",
            f"{UNIFIED_RAM_GB.get(row.gpu, 256)}G",
            "plan",
            model[0],
            "--context",
            str(CONTEXT),
            "--quant",
            model[1],
            "--json",
        ]
        if driver.startswith("Apple"):
            _stand_in(bin_dir / "system_profiler", _SYSTEM_PROFILER.format(name=driver))
            cpuinfo = bin_dir / "cpuinfo"
            cpuinfo.write_text("".join(f"processor\t: {index}\nmodel name\t: {driver}\n\n" for index in range(8)))
            unshare = shutil.which("unshare")
            if unshare is None:
                return Figure(None, "an Apple chip cannot be shown to it here")
            argv = [unshare, "-m", "sh", "-c", f'mount --bind "{cpuinfo}" /proc/cpuinfo && exec "$0" "$@"', *argv]
        else:
            _stand_in(bin_dir / "nvidia-smi", _NVIDIA_SMI.format(mib=memory_mib, name=driver))
        env = {**os.environ, "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}
        plan = _json(argv, env)
        # `info` says what the estimate rests on: a null bandwidth is its per-backend constant.
        info = _json([*argv[: argv.index("plan")], "info", model[0], "--json"], env)
    models = (info or {}).get("models") or [{}]
    known = bool((models[0].get("estimate_basis") or {}).get("gpu_bandwidth_gbps"))
    paths = plan.get("run_paths") if plan else None
    gpu = next((path for path in paths if isinstance(path, dict) and path.get("path") == "gpu"), None) if isinstance(paths, list) else None
    value = gpu.get("estimated_tps") if gpu else None
    if gpu is None or not isinstance(value, int | float) or value <= 0:
        return Figure(None, "no answer")
    fit = gpu.get("fit_level", (plan or {}).get("fit_level", "?"))
    return Figure(float(value), f"gpu path ({fit})" + ("" if known else "; card not in its table"))

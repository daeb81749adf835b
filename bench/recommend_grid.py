"""Issue 29's grid of machines, each tool's catalog pick beside the others' (bench/recommend_peers.py
compares their memory claims against real loads): each tool's pick, its own quality score for
it, its estimated decode tok/s, and the CPU time the answer cost (a bench run by hand; neither
peer is a dependency).

    .venv/bin/python -m bench.recommend_grid --llamafit /work/peers/lf/bin/llamafit --llmfit /work/peers/lm/bin/llmfit

- tierlocal: ``tierlocal check --gpu CARD --ram RAM --json`` (``--gpu none`` for a CPU-only box);
- LlamaFit 0.1.1: ``llamafit --profile FILE --json recommend`` with a hardware profile (its
  schema_version 1) naming the card, its memory and the RAM;
- llmfit 1.1.17: ``llmfit --no-dashboard --ram RAM recommend --force-runtime llamacpp -n 1``
  with a stand-in ``nvidia-smi`` first on PATH answering with the card's driver name and memory
  (for a CPU-only box it fails, as on a machine without the driver).

Scores are each tool's own and do not compare across tools (LlamaFit's is a curated quality
figure, llmfit's a heuristic, tierlocal's the fitted published benchmarks of README "Quality
scores"); the speeds are each tool's estimate on the same card.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (label, tierlocal --gpu, the driver's name for the card, MiB per card, cards, RAM GiB)
GRID: list[tuple[str, str, str, int, int, int]] = [
    ("8 GB (RTX 4060), 64 GB RAM", "RTX 4060", "NVIDIA GeForce RTX 4060", 8188, 1, 64),
    ("12 GB (RTX 3060), 64 GB RAM", "RTX 3060 12GB", "NVIDIA GeForce RTX 3060", 12288, 1, 64),
    ("16 GB (RTX 4080), 64 GB RAM", "RTX 4080", "NVIDIA GeForce RTX 4080", 16376, 1, 64),
    ("24 GB (RTX 4090), 64 GB RAM", "RTX 4090", "NVIDIA GeForce RTX 4090", 24564, 1, 64),
    ("2×24 GB (RTX 3090), 64 GB RAM", "2xRTX 3090", "NVIDIA GeForce RTX 3090", 24576, 2, 64),
    ("48 GB (RTX A6000), 64 GB RAM", "RTX A6000", "NVIDIA RTX A6000", 49140, 1, 64),
    ("80 GB (A100), 64 GB RAM", "A100 80GB", "NVIDIA A100 80GB PCIe", 81920, 1, 64),
    ("16 GB (RTX 4080), 128 GB RAM", "RTX 4080", "NVIDIA GeForce RTX 4080", 16376, 1, 128),
    *((f"CPU only, {ram} GB RAM", "none", "", 0, 0, ram) for ram in (8, 16, 32, 64)),
]


@dataclass(frozen=True)
class Pick:
    """One tool's answer for one machine."""

    model: str
    score: float | None
    tokens_per_s: float | None
    cpu_s: float

    def cell(self) -> str:
        score = "-" if self.score is None else f"{self.score:.1f}"
        speed = "-" if self.tokens_per_s is None else f"{self.tokens_per_s:.0f}"
        return f"{self.model} · {score} · {speed} tok/s · {self.cpu_s:.2f} s"


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[Any, float]:
    """The command's JSON answer (None: none) and the CPU seconds it took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
        payload = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        payload = None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return payload, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def tierlocal_pick(gpu: str, ram: int) -> Pick:
    payload, cpu = _run([sys.executable, "-m", "tierlocal", "check", "--gpu", gpu, "--ram", f"{ram}GiB", "--json"])
    best = (payload or {}).get("recommendation")
    if not best:
        return Pick("no answer", None, None, cpu)
    quality = best.get("quality") or {}
    return Pick(f"{best['model']} {best['quant']}", quality.get("score"), best.get("est_decode_tokens_per_s"), cpu)


def llamafit_pick(exe: str, driver: str, mib: int, cards: int, ram: int) -> Pick:
    gpus = [{"vendor": "nvidia", "name": driver, "vram_total": f"{mib}MiB", "backend_hint": "cuda"}] * cards
    profile = {
        "schema_version": 1,
        "name": "tierlocal-grid",
        "description": "bench/recommend_peers.py",
        "provenance": "written by tierlocal's bench",
        "os": "linux",
        "os_version": "stand-in",
        "arch": "x86_64",
        "cpu": {"model": "stand-in CPU", "physical_cores": 16},
        "memory": {"total": f"{ram}GiB"},
        "gpus": gpus,
        "unified_memory": False,
        "backends": ["cuda", "cpu"] if cards else ["cpu"],
    }
    with tempfile.TemporaryDirectory(prefix="bench-llamafit-") as scratch:
        path = Path(scratch) / "tierlocal-grid.json"  # LlamaFit wants the file named as the profile
        path.write_text(json.dumps(profile))
        payload, cpu = _run([exe, "--profile", str(path), "--json", "recommend"])
    rows = (payload or {}).get("rows") or []
    if not rows:
        return Pick("no answer", None, None, cpu)
    candidate = rows[0].get("candidate", {})
    return Pick(
        f"{rows[0]['model_id']} {rows[0]['quant']}", candidate.get("quality", {}).get("quality"), candidate.get("speed", {}).get("gen_tps"), cpu
    )


_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *addressing_mode,memory.total,memory.free,name*) {rows_addressing};;
  *memory.total,memory.free,name*) {rows_free};;
  *memory.total,name*) {rows_total};;
  *) echo "stand-in nvidia-smi";;
esac
"""


def llmfit_pick(exe: str, driver: str, mib: int, cards: int, ram: int) -> Pick:
    with tempfile.TemporaryDirectory(prefix="bench-llmfit-") as scratch:
        bin_dir = Path(scratch)
        for tool in ("nvidia-smi", "rocm-smi", "system_profiler"):
            (bin_dir / tool).write_text("#!/bin/sh\nexit 9\n")
        if cards:

            def rows(line: str) -> str:
                return "; ".join([f'echo "{line}"'] * cards)

            (bin_dir / "nvidia-smi").write_text(
                _NVIDIA_SMI.format(
                    rows_addressing=rows(f"None, {mib}, {mib}, {driver}"),
                    rows_free=rows(f"{mib}, {mib}, {driver}"),
                    rows_total=rows(f"{mib}, {driver}"),
                )
            )
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": scratch}
        payload, cpu = _run([exe, "--no-dashboard", "--ram", f"{ram}G", "recommend", "--force-runtime", "llamacpp", "-n", "1", "--json"], env)
    models = (payload or {}).get("models") or []
    if not models:
        return Pick("no answer", None, None, cpu)
    top = models[0]
    quality = (top.get("score_components") or {}).get("quality")
    return Pick(f"{top['name']} {top.get('best_quant', '')}", quality, top.get("estimated_tps"), cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llamafit", help="LlamaFit's executable, in a venv of its own")
    parser.add_argument("--llmfit", help="llmfit's executable, in a venv of its own")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d")
    print(f"Catalog picks, {started} (each: model quant · the tool's own quality score · its decode estimate · CPU time of the answer)\n")
    print("| machine | tierlocal | LlamaFit 0.1.1 | llmfit 1.1.17 |")
    print("|---|---|---|---|")
    cpu = []
    for label, gpu, driver, mib, cards, ram in GRID:
        ours = tierlocal_pick(gpu, ram)
        cpu.append(ours.cpu_s)
        theirs = [
            llamafit_pick(args.llamafit, driver, mib, cards, ram).cell() if args.llamafit else "not run",
            llmfit_pick(args.llmfit, driver, mib, cards, ram).cell() if args.llmfit else "not run",
        ]
        print(f"| {label} | {ours.cell()} | {theirs[0]} | {theirs[1]} |", flush=True)
    print(f"\ntierlocal check: median {sorted(cpu)[len(cpu) // 2]:.2f} s of CPU per machine (the whole catalog planned and ranked)")


if __name__ == "__main__":
    main()

"""What tierlocal, LlamaFit and llmfit each recommend for the same machines, and whose memory
claim is closest to what llama.cpp really allocates.

Peers are run from venvs of their own (never our dependency): ``--llamafit`` and ``--llmfit``
name their executables (install: ``python3 -m venv /tmp/peer-llamafit &&
/tmp/peer-llamafit/bin/pip install llamafit==0.1.1``, the same for ``llmfit==1.1.17``). Each
machine shape is given to each tool its own way: tierlocal ``--gpu``/``--ram``, LlamaFit a
hardware profile written here, llmfit ``--memory``/``--ram`` (it sees two cards as one pool).

Then, for tierlocal's pick on each shape that this machine can hold (≤ ``--max-load`` GiB), and
for five models all three tools know (COMMON) on an 8 GB card and a 16 GB VPS, the same model
is asked of each peer (``llamafit plan``, ``llmfit plan``, at 8,192 tokens) and loaded
for real from the catalog's compact header as a sparse GGUF: on a GPU shape one (or two) of
llama.cpp's RPC devices stand in for the card(s) with tierlocal's -ngl/-ts, and the claim compared
is the card's (LlamaFit's VRAM lines without its CUDA-context line, llmfit's GPU minimum, which
has none to take out); on a VPS shape the CPU build loads it and the kernel's VmHWM is the truth.

    .venv/bin/python -m bench.recommend_peers --llamafit /tmp/peer-llamafit/bin/llamafit \\
        --llmfit /tmp/peer-llmfit/bin/llmfit [--json FILE] [--max-load 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.assets import load_assets
from tests.support.catalog_headers import header_path
from tests.support.compact_file import write_compact_as_gguf
from tests.support.kernel_memory import measure_load
from tests.support.rpc_split import load_split, rpc_servers
from tierlocal.catalog import find_model

GIB = 2**30
CTX = 8192
#: Models of our catalog all three tools know, compared on an 8 GB card and a 16 GB VPS
#: whatever each recommends: the claims for one model side by side against the real load.
COMMON = [("llama-3.1-8b", "Q4_K_M"), ("mistral-7b-v0.3", "Q4_K_M"), ("gemma-3-4b", "Q4_K_M"), ("llama-3.2-3b", "Q6_K"), ("qwen3-0.6b", "Q8_0")]


@dataclass(frozen=True)
class Shape:
    """A machine: cards (tierlocal --gpu value, GiB, the name LlamaFit's profile gets) and RAM (GiB)."""

    label: str
    cards: tuple[tuple[str, int, str], ...]
    ram_gib: int


SHAPES = [
    Shape("8 GB card, 32 GB RAM", (("8GiB", 8, "NVIDIA GeForce RTX 4060"),), 32),
    Shape("12 GB card, 32 GB RAM", (("12GiB", 12, "NVIDIA GeForce RTX 3060"),), 32),
    Shape("16 GB card, 64 GB RAM", (("RTX 4080", 16, "NVIDIA GeForce RTX 4080"),), 64),
    Shape("24 GB card, 64 GB RAM", (("RTX 4090", 24, "NVIDIA GeForce RTX 4090"),), 64),
    Shape("2×24 GB cards, 128 GB RAM", (("RTX 3090", 24, "NVIDIA GeForce RTX 3090"),) * 2, 128),
    Shape("48 GB card, 128 GB RAM", (("RTX A6000", 48, "NVIDIA RTX A6000"),), 128),
    Shape("80 GB card, 128 GB RAM", (("A100 80GB", 80, "NVIDIA A100 80GB PCIe"),), 128),
    Shape("VPS, 8 GB RAM", (), 8),
    Shape("VPS, 16 GB RAM", (), 16),
    Shape("VPS, 32 GB RAM", (), 32),
    Shape("VPS, 64 GB RAM", (), 64),
]


def _json(argv: list[str]) -> object:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        return None
    try:
        return json.loads(result.stdout)
    except ValueError:
        return None


def _profile(shape: Shape, directory: Path) -> Path:
    """A LlamaFit hardware profile for ``shape`` (its schema_version 1)."""
    profile = {
        "schema_version": 1,
        "name": "tierlocal-" + "-".join("".join(c if c.isalnum() else " " for c in shape.label.lower()).split()),
        "description": shape.label,
        "provenance": "written by tierlocal's bench/recommend_peers.py for a side-by-side",
        "recorded_at": "2026-12-01T00:00:00Z",
        "os": "linux",
        "os_version": "Linux-6.1",
        "arch": "x86_64",
        "cpu": {"model": "generic x86-64", "physical_cores": 8, "logical_cores": 16, "isa": ["avx2"]},
        "memory": {"total": f"{shape.ram_gib}GiB", "available": f"{shape.ram_gib}GiB", "bandwidth_gbps": 40.0, "bandwidth_source": "assumed"},
        "gpus": [
            {"vendor": "nvidia", "name": name, "vram_total": f"{gib}GiB", "vram_used": "0MiB", "backend_hint": "cuda"} for _, gib, name in shape.cards
        ],
        "unified_memory": False,
        "backends": ["cuda", "cpu"] if shape.cards else ["cpu"],
    }
    path = directory / f"{profile['name']}.json"
    path.write_text(json.dumps(profile))
    return path


def _tierlocal(shape: Shape, source: str | None = None) -> dict[str, object] | None:
    argv = [sys.executable, "-m", "tierlocal", "check", *([source] if source else []), "--ram", f"{shape.ram_gib}GiB", "--ctx", str(CTX), "--json"]
    argv += [f"--gpu={card}" for card, _, _ in shape.cards]
    return _json(argv)  # type: ignore[return-value]


def tierlocal_pick(shape: Shape) -> dict[str, object]:
    payload = _tierlocal(shape) or {}
    best, plan = payload.get("recommendation"), payload.get("plan")
    if not isinstance(best, dict) or not isinstance(plan, dict):
        return {"model": None}
    return {
        "model": best["model"],
        "quant": best["quant"],
        "claim": _tierlocal_claim(plan, bool(shape.cards)),
        "tps": best["est_decode_tokens_per_s"],
    }


def _tierlocal_claim(plan: dict[str, object], on_cards: bool) -> int:
    """The cards' buffers (weights + KV + compute; the runtime overhead is not a llama.cpp
    buffer), or the host's peak at load with mmap (what the kernel's VmHWM counts)."""
    devices: list[dict[str, int]] = plan["devices"]  # type: ignore[assignment]
    if on_cards:
        return sum(d["weights_bytes"] + d["kv_bytes"] + d["compute_bytes"] for d in devices[:-1])
    return int(plan["host_memory"]["modes"][0]["peak_bytes"])  # type: ignore[index]


def llamafit_pick(binary: str, profile: Path) -> dict[str, object]:
    payload = _json([binary, "--json", "--profile", str(profile), "recommend", "--limit", "1"])
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not rows:
        return {"model": None}
    row = rows[0]
    return {
        "model": row["model_id"],
        "quant": row["quant"],
        "claim": _llamafit_claim(row["candidate"]["placement"], bool(profile)),
        "tps": row["candidate"]["speed"]["gen_tps"],
    }


def _llamafit_claim(placement: dict[str, object], on_cards: bool) -> int:
    lines = placement["budget"]["lines"]  # type: ignore[index]
    if on_cards and placement.get("mode") != "cpu":
        return sum(line["bytes"] for line in lines if line["pool"] == "vram" and line["component"] != "cuda-context")
    return sum(line["bytes"] for line in lines)


def llmfit_pick(binary: str, shape: Shape) -> dict[str, object]:
    vram = sum(gib for _, gib, _ in shape.cards)
    payload = _json([binary, "--json", "--memory", f"{vram}G", "--ram", f"{shape.ram_gib}G", "--max-context", str(CTX), "recommend", "-n", "1"])
    models = payload.get("models") if isinstance(payload, dict) else None
    if not models:
        return {"model": None}
    model = models[0]
    return {
        "model": model["name"],
        "quant": model.get("best_quant"),
        "claim": int(model["memory_required_gb"] * 1e9),
        "tps": model.get("estimated_tps"),
    }


def _peer_claims(entry_family: str, quant: str, shape: Shape, profile: Path, llamafit: str, llmfit: str) -> dict[str, int | None]:
    """LlamaFit's and llmfit's memory claims for one of our catalog models on ``shape``."""
    entry = find_model(f"{entry_family}:{quant}")[0]
    repo = entry.source.removeprefix("https://huggingface.co/").removesuffix("/blob/main/config.json")
    claims: dict[str, int | None] = {"llamafit": None, "llmfit": None}
    llamafit_id = repo.split("/")[-1].lower()
    # The same micro-batch as tierlocal's plan (llama-server's 512): LlamaFit would pick its own.
    plan = _json([llamafit, "--json", "--profile", str(profile), "plan", llamafit_id, "--quant", quant, "--context", str(CTX), "--ub", "512"])
    if isinstance(plan, dict) and "placement" in plan:
        claims["llamafit"] = _llamafit_claim(plan["placement"], bool(shape.cards))
    vram = sum(gib for _, gib, _ in shape.cards)
    estimate = _json([llmfit, "--json", "--memory", f"{vram}G", "--ram", f"{shape.ram_gib}G", "plan", repo, "--context", str(CTX), "--quant", quant])
    if isinstance(estimate, dict):
        path = next((p for p in estimate.get("run_paths", []) if p.get("path") == ("gpu" if shape.cards else "cpu_only")), None)
        if path is not None:
            claims["llmfit"] = int(path["minimum"]["vram_gb" if shape.cards else "ram_gb"] * 1e9)
    return claims


def measure(family: str, quant: str, shape: Shape, scratch: Path) -> int:
    """What llama.cpp allocates for tierlocal's plan of ``family:quant`` on ``shape``: the RPC
    devices' buffers (cards), or the CPU build's VmHWM (a VPS). Bytes."""
    assets = load_assets()
    assert assets is not None, "run bash tests/run.sh once: the engines are not prepared"
    model = write_compact_as_gguf(json.loads(header_path(family, quant).read_text()), scratch / f"{family}-{quant}.gguf")
    if not shape.cards:
        return measure_load(assets.llama_server_cpu, model, scratch, ctx=CTX, load_mode="mmap").peak_bytes
    plan = (_tierlocal(shape, f"{family}:{quant.lower()}") or {}).get("plan")
    assert isinstance(plan, dict)
    args = [arg for arg in plan["command"][3:] if arg != "--no-jinja"]
    if "--chat-template" in args:
        del args[args.index("--chat-template") : args.index("--chat-template") + 2]
    with rpc_servers(assets.rpc_server, len(shape.cards)) as endpoints:
        load = load_split(assets.llama_server_cpu, model, endpoints, args, scratch / "load.log")
    return sum(sum(device.values()) for device in load.devices)


def _gib(value: object) -> str:
    return "-" if not isinstance(value, int) else f"{value / GIB:.2f}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llamafit", required=True)
    parser.add_argument("--llmfit", required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--max-load", type=float, default=10.0, help="largest model file (GiB) loaded for real here")
    args = parser.parse_args(argv)
    rows, loads = [], []
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch_dir:
        scratch = Path(scratch_dir)
        for shape in SHAPES:
            profile = _profile(shape, scratch)
            row = {
                "shape": shape.label,
                "tierlocal": tierlocal_pick(shape),
                "llamafit": llamafit_pick(args.llamafit, profile),
                "llmfit": llmfit_pick(args.llmfit, shape),
            }
            rows.append(row)
            print(
                f"{shape.label}: "
                + "; ".join(
                    f"{tool} {pick.get('model')} {pick.get('quant') or ''} ({_gib(pick.get('claim'))} GiB)"
                    for tool, pick in row.items()
                    if isinstance(pick, dict)
                ),
                flush=True,
            )
            pick = row["tierlocal"]
            family, quant = pick.get("model"), pick.get("quant")
            if not family or not header_path(str(family), str(quant)).is_file():
                continue
            size = json.loads(header_path(str(family), str(quant)).read_text())["files"][0]["file_bytes"]
            if size > args.max_load * GIB:
                loads.append(
                    {
                        "shape": shape.label,
                        "model": family,
                        "quant": quant,
                        "loaded": False,
                        "why": f"{size / GIB:.1f} GiB: more than this machine stands in for",
                    }
                )
                continue
            actual = measure(str(family), str(quant), shape, scratch)
            claims = {"tierlocal": pick["claim"], **_peer_claims(str(family), str(quant), shape, profile, args.llamafit, args.llmfit)}
            loads.append({"shape": shape.label, "model": family, "quant": quant, "loaded": True, "actual": actual, "claims": claims})
        for shape in (SHAPES[0], SHAPES[8]):
            profile = _profile(shape, scratch)
            for family, quant in COMMON:
                actual = measure(family, quant, shape, scratch)
                plan = (_tierlocal(shape, f"{family}:{quant.lower()}") or {}).get("plan")
                assert isinstance(plan, dict)
                claims = {
                    "tierlocal": _tierlocal_claim(plan, bool(shape.cards)),
                    **_peer_claims(family, quant, shape, profile, args.llamafit, args.llmfit),
                }
                loads.append(
                    {"shape": shape.label, "model": family, "quant": quant, "loaded": True, "actual": actual, "claims": claims, "common": True}
                )
                print(
                    f"{shape.label}: {family} {quant} allocated {_gib(actual)} GiB; claims " + ", ".join(f"{t} {_gib(c)}" for t, c in claims.items()),
                    flush=True,
                )
    _print_tables(rows, loads)
    if args.json:
        args.json.write_text(json.dumps({"ctx": CTX, "picks": rows, "loads": loads}, indent=1))
    return 0


def _print_tables(rows: list[dict[str, object]], loads: list[dict[str, object]]) -> None:
    print("\n| machine | tierlocal | LlamaFit 0.1.1 | llmfit 1.1.17 |\n|---|---|---|---|")
    for row in rows:
        cells = []
        for tool in ("tierlocal", "llamafit", "llmfit"):
            pick = row[tool]
            assert isinstance(pick, dict)
            tps = pick.get("tps")
            cells.append(
                "none"
                if not pick.get("model")
                else f"{pick['model']} {pick.get('quant') or ''} — {_gib(pick.get('claim'))} GiB"
                + (f", {tps:.0f} tok/s" if isinstance(tps, (int, float)) else "")
            )
        print(f"| {row['shape']} | " + " | ".join(cells) + " |")
    print(
        "\n| machine | model (tierlocal's pick) | llama.cpp allocated GiB | tierlocal | LlamaFit | llmfit | closest |\n|---|---|---|---|---|---|---|"
    )
    for load in loads:
        if not load["loaded"]:
            print(f"| {load['shape']} | {load['model']} {load['quant']} | not loaded ({load['why']}) | | | | |")
            continue
        actual = int(load["actual"])  # type: ignore[call-overload]
        claims: dict[str, int | None] = load["claims"]  # type: ignore[assignment]
        cells = [f"{_gib(claim)} ({claim / actual:.2f}×)" if claim else "no answer" for claim in claims.values()]
        known = {tool: abs(claim / actual - 1) for tool, claim in claims.items() if claim}
        print(
            f"| {load['shape']} | {load['model']} {load['quant']} | {_gib(actual)} | "
            + " | ".join(cells)
            + f" | {min(known, key=known.__getitem__)} |"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

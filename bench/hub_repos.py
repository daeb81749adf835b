"""Any model on the Hub (issue 52): what `check hf://OWNER/REPO` and `search` read and how long
they take, against the loopback hub of tests/support/hub_repos.py (25 repositories of the big
publishers' layouts, real file sizes as sparse files, the hub's API on 127.0.0.1).

For three repositories it prints each quantisation's files, their bytes and the header bytes
read for it (cold: an empty header cache; the planning cache is built first, as any earlier run of
tierlocal leaves it), then the time of a cold and a warm `check`; then a `search` over every
public repository, cold and warm: the command's own seconds (its --json ``seconds``, from the
start of the search to the planned results) and the process's wall time.

    .venv/bin/python -m bench.hub_repos [--json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.hub_repos import hub_repos
from tests.support.servers import fake_hub

REPOS = ("unsloth/Llama-3.3-70B-Instruct-GGUF", "Qwen/Qwen2.5-7B-Instruct-GGUF", "ggml-org/gpt-oss-120b-GGUF")
MACHINE = ("--gpu", "RTX 4090", "--ram", "64GiB")


def _run(env: dict[str, str], *args: str) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tierlocal", *args, "--json"], capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"tierlocal {' '.join(args)} failed: {result.stderr.strip()}")
    return json.loads(result.stdout), wall


def main() -> None:
    cache_root = Path(os.environ.get("TIERLOCAL_TEST_CACHE") or Path.home() / ".cache" / "tierlocal-test")
    repos = hub_repos(cache_root)
    rows: list[dict[str, object]] = []
    timings: dict[str, float] = {}
    with fake_hub(repos) as (endpoint, _), tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "HF_ENDPOINT": endpoint, "XDG_CACHE_HOME": scratch}
        _run(env, "check", *MACHINE)  # the planning cache, built once as any first run builds it: "cold" is about headers
        for repo in REPOS:
            cold, cold_s = _run(env, "check", f"hf://{repo}", *MACHINE)
            _warm, warm_s = _run(env, "check", f"hf://{repo}", *MACHINE)
            timings[f"check {repo} cold"], timings[f"check {repo} warm"] = cold_s, warm_s
            seen: set[str] = set()
            for candidate in cold["candidates"]:  # type: ignore[attr-defined]
                if candidate["quant"] in seen:
                    continue
                seen.add(candidate["quant"])
                rows.append({key: candidate[key] for key in ("quant", "file_bytes", "header_bytes_read", "status")})
                rows[-1] |= {"repo": repo, "files": len(candidate["files"])}
        search_args = ("search", "gguf", *MACHINE, "--limit", "30")
        for run in ("cold", "warm"):
            if run == "cold":  # no header kept; the planning cache built, as after any earlier run of tierlocal
                env = {**env, "XDG_CACHE_HOME": tempfile.mkdtemp(dir=scratch)}
                _run(env, "check", *MACHINE)
            found, wall = _run(env, *search_args)
            timings[f"search {run} ({len(found['results'])} repos planned) seconds"] = float(found["seconds"])  # type: ignore[arg-type]
            timings[f"search {run} wall (with the CLI's start)"] = wall
            read = sum(r["header_bytes_read"] for r in found["results"])  # type: ignore[attr-defined]
            planned = sum(len(r["planned_quants"]) for r in found["results"])  # type: ignore[attr-defined]
            print(f"search {run}: {planned} quantisations of {len(found['results'])} repositories planned, {read:,} header bytes read")
    if "--json" in sys.argv:
        print(json.dumps({"rows": rows, "timings_s": timings}, indent=2))
        return
    print(f"{'repository':<38} {'quant':<10} {'files':>5} {'file bytes':>16} {'header bytes read':>18} {'read/file':>10}")
    for row in rows:
        share = row["header_bytes_read"] / row["file_bytes"]  # type: ignore[operator]
        print(f"{row['repo']:<38} {row['quant']:<10} {row['files']:>5} {row['file_bytes']:>16,} {row['header_bytes_read']:>18,} {share:>10.2e}")
    for what, seconds in timings.items():
        print(f"{what}: {seconds:.2f} s")


if __name__ == "__main__":
    main()

"""tierlocal's resumable downloader against huggingface_hub's own, side by side, in one run.

Both fetch the Gemma file (253 MB) from the same Hub stand-in on loopback (tests/support/servers.py:
listing, resolve with a redirect to a CDN host, Range), five times each, alternating, into
fresh directories; prints the median seconds and MB/s of each and the ratio. Loopback takes
the network out, so this measures the client's own cost (writing, hashing, verifying).

    .venv/bin/python -m bench.pull_throughput

Needs the test assets (bash tests/run.sh, or python tests/assets/prepare.py).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.assets import prepare
from tests.support.servers import HubRepo, fake_hub

HERE = Path(__file__).resolve().parent

REPO = "bench/gemma-GGUF"
FILE = "gemma-3-270m-Q4_K_M.gguf"
ROUNDS = 5

HF_SNIPPET = """
import sys, time
from huggingface_hub import hf_hub_download
started = time.perf_counter()
hf_hub_download(sys.argv[1], sys.argv[2], local_dir=sys.argv[3])
print(time.perf_counter() - started)
"""


def _tierlocal(env: dict[str, str], target: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tierlocal", "pull", f"hf://{REPO}/{FILE}", "--dir", str(target), "--json"], env=env, check=True, capture_output=True
    )
    return time.perf_counter() - started


def _huggingface_hub(env: dict[str, str], target: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", HF_SNIPPET, REPO, FILE, str(target)], env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    assets = json.loads(prepare.manifest_path().read_text())
    gemma = Path(assets["gemma_gguf"])
    size = gemma.stat().st_size
    with tempfile.TemporaryDirectory(prefix="tierlocal-pull-bench-") as scratch:
        served = Path(scratch) / "served"
        served.mkdir()
        (served / FILE).symlink_to(gemma)
        times: dict[str, list[float]] = {"tierlocal pull": [], "huggingface_hub hf_hub_download": []}
        with fake_hub([HubRepo(REPO, served)]) as (endpoint, _):
            env = {
                **os.environ,
                "HF_ENDPOINT": endpoint,
                "HF_HUB_CACHE": str(Path(scratch) / "hub"),
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_TOKEN": "",
            }
            for round_index in range(ROUNDS):
                for name, fetch in (("tierlocal pull", _tierlocal), ("huggingface_hub hf_hub_download", _huggingface_hub)):
                    target = Path(scratch) / f"{name.split()[0]}-{round_index}"
                    times[name].append(fetch(env, target))
                    for path in target.rglob("*"):
                        if path.is_file():
                            path.unlink()
    print(f"{size:,} bytes from a Hub stand-in on loopback, {ROUNDS} rounds each (median), process start included:")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, seconds in medians.items():
        print(f"  {name:34} {seconds:6.2f} s  {size / seconds / 1e6:7.1f} MB/s")
    ratio = medians["tierlocal pull"] / medians["huggingface_hub hf_hub_download"]
    print(f"tierlocal / huggingface_hub time: {ratio:.2f}× (tierlocal also hashes sha256 and parses the GGUF header before placing the file)")


if __name__ == "__main__":
    main()

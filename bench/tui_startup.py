"""How long `tierlocal ui` takes to open on What fits, as a user over SSH sees it: the real
binary started in a tmux pane (80×24), the pane read every 20 ms until the table shows its
first planned row and the plan beside it; and, a second later, how long the ``+`` key (context
× 2) takes to replan the catalog and redraw.

    python bench/tui_startup.py [--runs 5] [-- extra tierlocal ui arguments]

Prints each run's seconds and the median. The issue's target: open in under a second."""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import time
import uuid


def _screen(socket: str) -> str:
    return subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-t", "ui"], capture_output=True, text=True, check=False).stdout


def _until(socket: str, pattern: str, timeout_s: float = 30.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if re.search(pattern, _screen(socket), re.M):
            return time.monotonic() - started
        time.sleep(0.02)
    raise SystemExit(f"{pattern!r} never appeared; the screen was:\n{_screen(socket)}")


def one_run(extra: list[str]) -> tuple[float, float]:
    """(seconds to the first planned row and its plan, seconds for `+` to redraw at 2× ctx)."""
    socket = f"tui-bench-{uuid.uuid4().hex[:8]}"
    command = shlex.join([sys.executable, "-m", "tierlocal", "ui", *extra]) + "; sleep 30"
    started = time.monotonic()
    subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "ui", "-x", "80", "-y", "24", command], check=True)
    try:
        _until(socket, r"\d+/\d+ shown")
        _until(socket, r"Command: llama-server")
        opened = time.monotonic() - started
        before = re.search(r"ctx ([\d,]+)", _screen(socket))
        assert before is not None
        doubled = f"{int(before.group(1).replace(',', '')) * 2:,}"
        time.sleep(1.0)  # a person reads the screen before the first key (the UI warms its catalog meanwhile)
        subprocess.run(["tmux", "-L", socket, "send-keys", "-t", "ui", "+"], check=True)
        replanned = _until(socket, rf"ctx {doubled} ")
        return opened, replanned
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="arguments for tierlocal ui")
    args = parser.parse_args()
    opens, replans = [], []
    print(f"{'run':>3}  {'open (s)':>8}  {'replan (s)':>10}")
    for run in range(1, args.runs + 1):
        opened, replanned = one_run(args.extra)
        opens.append(opened)
        replans.append(replanned)
        print(f"{run:>3}  {opened:8.2f}  {replanned:10.2f}")
    print(f"median  {statistics.median(opens):6.2f}  {statistics.median(replans):10.2f}")


if __name__ == "__main__":
    main()

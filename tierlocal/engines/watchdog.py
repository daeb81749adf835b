"""The engine's watchdog: a small process, in a session of its own, that outlives tierlocal.

tierlocal holds the write end of a pipe whose read end is the watchdog's stdin; the kernel
closes it when tierlocal exits, however it exits (kill -9 included). At end of file the
watchdog gives the engine the grace period to finish (PR_SET_PDEATHSIG has already sent it
SIGTERM), then SIGKILLs its process group. An engine stuck in its own shutdown (a Vulkan
llama-server once hung there, SIGTERM blocked, and never exited) cannot outlive its supervisor.
When tierlocal stops the engine itself, it closes the pipe after the engine is gone, and the
watchdog exits without a signal.

Run as ``python -m tierlocal.engines.watchdog PID START_TICKS GRACE_S``: START_TICKS, the engine's
start time in /proc/PID/stat, tells the engine from a later process that reuses its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Watchdog", "start_watchdog", "start_ticks"]


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, field 22 of /proc/PID/stat), or None
    when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class Watchdog:
    """tierlocal's end: the pipe that keeps the watchdog waiting while it is open."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def release(self, timeout_s: float = 5.0) -> None:
        """The engine is stopped: let the watchdog go."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_watchdog(pid: int, grace_s: float) -> Watchdog | None:
    """A watchdog for the engine ``pid`` (the leader of its own process group), or None when the
    engine is already gone."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    process = subprocess.Popen(
        [sys.executable, "-m", "tierlocal.engines.watchdog", str(pid), str(ticks), str(grace_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return Watchdog(process)


def _watch(pid: int, ticks: int, grace_s: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the pipe ends the watch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.read(0, 4096):  # tierlocal writes nothing: this returns at end of file
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if start_ticks(pid) != ticks:
            return  # the engine exited (and was reaped, or its PID went to another process)
        time.sleep(0.1)
    if start_ticks(pid) == ticks:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

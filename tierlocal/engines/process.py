"""Running an engine as a child: its output drained continuously into a log file and a line
callback (a full pipe would stall it), readiness by polling its health URL, a graceful stop
(one SIGTERM, a bounded wait, then SIGKILL), and no orphan: the child is in its own process
group and gets SIGTERM from the kernel if tierlocal dies, even by kill -9 (PR_SET_PDEATHSIG),
and a watchdog (:mod:`.watchdog`) SIGKILLs the group after the grace period if that SIGTERM
did not end it.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import constants
from .watchdog import Watchdog, start_watchdog

__all__ = ["EngineChild", "Readiness", "start_child"]

_PR_SET_PDEATHSIG = 1
#: Lines of the child's output kept in memory for error messages.
TAIL_LINES = 200


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


@dataclass(frozen=True)
class Readiness:
    """How waiting for the engine ended: ``ready``, or it exited (``exit_code``), or time ran out."""

    ready: bool
    exit_code: int | None
    waited_s: float


class EngineChild:
    """A started engine process."""

    def __init__(
        self, process: subprocess.Popen[bytes], log_path: Path, on_line: Callable[[str], None] | None, watchdog: Watchdog | None = None
    ) -> None:
        self.process = process
        self.watchdog = watchdog
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._on_line = on_line
        self._drained = threading.Event()
        self._lock = threading.Lock()
        #: True once :meth:`stop` had to SIGKILL the child (it ignored SIGTERM for the grace time).
        self.killed = False
        self._reader = threading.Thread(target=self._drain, name="engine-output", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _drain(self) -> None:
        assert self.process.stdout is not None
        with self.log_path.open("a", encoding="utf-8", errors="replace") as log:
            for raw in iter(self.process.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                with self._lock:
                    self.tail.append(line.rstrip("\n"))
                    if self._on_line is not None:
                        self._on_line(line)
        self.process.stdout.close()  # at end of output: the pipe is not left for the collector
        self._drained.set()

    def wait_output(self, timeout_s: float = 5.0) -> None:
        """Wait until everything the child printed has been read (after it exited)."""
        self._drained.wait(timeout_s)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self.tail)

    def wait_ready(
        self,
        health_url: str,
        timeout_s: float,
        *,
        on_waiting: Callable[[float], None] | None = None,
        stop: threading.Event | None = None,
        headers: dict[str, str] | None = None,
    ) -> Readiness:
        """Poll ``health_url`` (with ``headers``) until it answers 200 (llama-server answers
        503 while loading); give up when the child exits, ``timeout_s`` passes or ``stop`` is
        set."""
        import httpx2  # the HTTP client loads when an engine is waited for, not with every command

        started = time.monotonic()
        with httpx2.Client(timeout=2.0, headers=headers) as client:
            while True:
                waited = time.monotonic() - started
                code = self.process.poll()
                if code is not None:
                    self.wait_output()
                    return Readiness(False, code, waited)
                try:
                    if client.get(health_url).status_code == 200:
                        return Readiness(True, None, waited)
                except httpx2.HTTPError:
                    pass
                if waited > timeout_s or (stop is not None and stop.is_set()):
                    return Readiness(False, None, waited)
                if on_waiting is not None:
                    on_waiting(waited)
                time.sleep(0.25)

    def stop(self, grace_s: float = constants.ENGINE_STOP_GRACE_S) -> int:
        """One SIGTERM (llama-server exits at once on a second), a bounded wait, then SIGKILL
        to the whole process group. Returns the exit code."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()
        if self.watchdog is not None:
            self.watchdog.release()
        self.wait_output()
        return self.process.returncode


def start_child(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> EngineChild:
    """Start ``argv`` in its own session, output merged into one drained pipe."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    return EngineChild(process, log_path, on_line, start_watchdog(process.pid, constants.ENGINE_STOP_GRACE_S))

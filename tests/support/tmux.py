"""A program in a real tmux session, as a user's SSH session runs it: keys sent with
``send-keys``, the screen read with ``capture-pane``. Each session has a tmux server of its own
(``-L``), so tests in parallel never see each other's panes."""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Tmux", "tmux_session"]


@dataclass
class Tmux:
    socket: str
    target: str

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, timeout=30).stdout

    def send(self, *keys: str, pause_s: float = 0.3) -> None:
        """Press each key in turn (tmux key names: Enter, Escape, C-c, or text), ``pause_s``
        apart, as a person types."""
        for key in keys:
            self._tmux("send-keys", "-t", self.target, key)
            time.sleep(pause_s)

    def screen(self) -> str:
        """The pane's text now (no colours)."""
        return self._tmux("capture-pane", "-p", "-t", self.target)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", self.target], capture_output=True, check=False).returncode == 0

    def wait_for(self, condition: Callable[[str], bool], timeout_s: float = 30.0, what: str = "the screen") -> str:
        """The screen once ``condition`` holds for it; fail with the last screen after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.screen() if self.alive() else ""
            if condition(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not appear within {timeout_s} s; the screen was:\n{text}")
            time.sleep(0.2)


@contextmanager
def tmux_session(argv: list[str], env: dict[str, str], *, columns: int = 80, rows: int = 24) -> Iterator[Tmux]:
    """Run ``argv`` (with ``env`` set) in a new tmux session of ``columns`` × ``rows`` (its
    stdout and stderr are the pane: Textual draws on stderr). The session is killed after."""
    socket = f"tierlocal-test-{uuid.uuid4().hex[:12]}"
    environment = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    # The pane stays after the program exits, showing how it ended (a traceback, or EXITED 0).
    # COLUMNS and LINES (pytest-xdist sets 80 and 24) would override the pane's size.
    command = f"env -u COLUMNS -u LINES {environment} {shlex.join(argv)}; echo EXITED $?; sleep 600"
    subprocess.run(
        ["tmux", "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "ui", "-x", str(columns), "-y", str(rows), command],
        check=True,
        timeout=30,
    )
    session = Tmux(socket, "ui")
    try:
        yield session
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False, timeout=30)

"""A command in a real pseudo-terminal of a given size, as a user's SSH session runs it: the
program sees a terminal (rich picks its width from it), and what it drew comes back as text."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import termios

__all__ = ["run_in_terminal"]

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(argv: list[str], *, columns: int = 80, rows: int = 24, env: dict[str, str] | None = None, timeout_s: float = 120) -> str:
    """Run ``argv`` on a pty of ``columns`` × ``rows``; its output without colour codes, lines
    split on the terminal's CR LF."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.execve(argv[0], argv, {**os.environ, **(env or {}), "TERM": "xterm-256color"})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    output = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            os.kill(pid, 9)
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.waitpid(pid, 0)
    os.close(fd)
    return _ESCAPE.sub("", output.decode("utf-8", "replace")).replace("\r\n", "\n")

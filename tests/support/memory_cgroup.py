"""A memory cgroup of the kernel's own (cgroup v1's memory controller, as this machine mounts it at
/sys/fs/cgroup/memory; cgroup2's, where it is enabled) for one command and its children: what the
kernel charges them — anonymous memory and the page cache they touch, mapped or read — as a
systemd unit's MemoryHigh=/MemoryMax= would count it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryCgroup", "memory_cgroup"]

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup/unified")


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    v1: bool

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the cgroup (a shell joins it, then becomes the command)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def peak_bytes(self) -> int:
        """The most the cgroup was charged since it was made."""
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        return int((self.path / name).read_text())

    def current_bytes(self) -> int:
        return int((self.path / ("memory.usage_in_bytes" if self.v1 else "memory.current")).read_text())


def _root() -> tuple[Path, bool]:
    if (_V1 / "memory.usage_in_bytes").exists():
        return _V1, True
    controllers = _V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return _V2, False
    raise RuntimeError("no memory cgroup controller here (cgroup v1 memory, or cgroup2 with memory enabled)")


@contextmanager
def memory_cgroup(name: str) -> Iterator[MemoryCgroup]:
    """A fresh cgroup; every process left in it is killed and it is removed afterwards."""
    root, v1 = _root()
    path = root / f"tierlocal-test-{name}-{os.getpid()}"
    path.mkdir()
    try:
        yield MemoryCgroup(path, v1)
    finally:
        for _ in range(50):
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        path.rmdir()

"""A real systemd for the unit tests: this machine's own /lib/systemd/systemd booted as PID 1 of
throw-away namespaces (pid, mount, uts, ipc, cgroup) over an overlay of / with a tmpfs on top,
private /dev, /run, /tmp and a cgroup2 hierarchy of its own; its /etc/systemd/system is a host
directory the test writes units into. It boots in under a second, and nothing it writes
reaches the host. The network namespace is the host's, so a unit's server answers on the
host's loopback. systemd_container.sh does the mounts; it needs root with CAP_SYS_ADMIN, a
writable cgroup2 mount at /sys/fs/cgroup/unified and overlayfs.

Only the root filesystem is visible inside: the host's /tmp and /dev/shm are not (a unit's
files must live elsewhere, e.g. the prepared test assets under ~/.cache)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SystemdContainer", "booted_systemd"]

SCRIPT = Path(__file__).with_name("systemd_container.sh")


@dataclass(frozen=True)
class SystemdContainer:
    """A booted container: ``units`` is its /etc/systemd/system."""

    directory: Path

    @property
    def units(self) -> Path:
        return self.directory / "units"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the container (systemctl, journalctl …)."""
        return subprocess.run(["sh", str(SCRIPT), "exec", str(self.directory), *argv], capture_output=True, text=True, timeout=timeout, check=False)


@contextmanager
def booted_systemd(directory: Path, boot_timeout_s: int = 30) -> Iterator[SystemdContainer]:
    """Boot, yield, and always power off and clean up (processes, mounts, cgroups)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        started = subprocess.run(
            ["sh", str(SCRIPT), "start", str(directory), str(boot_timeout_s)],
            capture_output=True,
            text=True,
            timeout=boot_timeout_s + 30,
            check=False,
        )
        if started.returncode != 0:
            raise RuntimeError(f"systemd did not boot in a container here (root, cgroup2 and overlayfs are needed): {started.stderr[-2000:]}")
        yield SystemdContainer(directory)
    finally:
        subprocess.run(["sh", str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=60, check=False)

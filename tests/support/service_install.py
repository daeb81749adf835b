"""A tierlocal a systemd unit can run wherever the checkout is: a unit's ``PrivateTmp=yes`` hides
/tmp, so a checkout (or a test cache) there can never be a unit's command — exactly what
``service install`` refuses. The unit tests then install this checkout (not editable) into a
virtual environment under /var/cache and write units from it, and copy files they serve out of
/tmp."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO_ROOT

__all__ = ["service_python", "outside_private_tmp", "SERVICE_ROOT"]

#: Where the unit tests keep what a unit must reach (root's, on the root filesystem).
SERVICE_ROOT = Path("/var/cache/tierlocal-test")
_PRIVATE = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def _private(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved == root or root in resolved.parents for root in _PRIVATE) or any(root in path.absolute().parents for root in _PRIVATE)


def service_python() -> Path:
    """A Python whose interpreter, standard library and tierlocal package a unit can reach: this
    one, or one with this checkout installed under SERVICE_ROOT (made once, this checkout's code
    reinstalled each time it is asked for)."""
    import tierlocal

    if not any(_private(path) for path in (Path(sys.executable), Path(tierlocal.__file__), Path(shutil.__file__))):
        return Path(sys.executable)
    venv = SERVICE_ROOT / f"venv-{hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:12]}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(REPO_ROOT)], check=True, capture_output=True, timeout=900)
    else:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(REPO_ROOT)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return python


def outside_private_tmp(path: Path, *, with_directory: bool = False) -> Path:
    """``path`` itself, or a copy under SERVICE_ROOT when it lies where a unit cannot see it
    (``with_directory``: the whole directory, for a binary that loads libraries beside it)."""
    if not _private(path):
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    target = SERVICE_ROOT / "files" / digest
    if with_directory:
        if not (target / path.name).exists():
            shutil.copytree(path.resolve().parent, target, symlinks=True, dirs_exist_ok=True)
        return target / path.name
    copy = target / path.name
    if not copy.exists():
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
    return copy

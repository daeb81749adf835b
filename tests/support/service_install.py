"""A tierlocal a systemd unit can run wherever the checkout is: a unit's ``PrivateTmp=yes`` hides
/tmp, so a checkout (or a test cache) there can never be a unit's command — exactly what
``service install`` refuses. The unit tests then install this checkout (not editable) into a
virtual environment under /var/cache and write units from it, and copy files they serve out of
/tmp."""

from __future__ import annotations

import fcntl
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


def _source_digest() -> str:
    """A hash of what the installed package is built from (the code, recipes, pyproject.toml)."""
    digest = hashlib.sha256()
    paths = [*(REPO_ROOT / "tierlocal").rglob("*"), *(REPO_ROOT / "recipes").rglob("*"), REPO_ROOT / "pyproject.toml"]
    for path in sorted(path for path in paths if path.is_file() and "__pycache__" not in path.parts):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def service_python() -> Path:
    """A Python whose interpreter, standard library and tierlocal package a unit can reach: this
    one, or one with this checkout installed under SERVICE_ROOT (made once; reinstalled when the
    checkout's code changed). Workers in parallel take a lock, and only the first installs: a
    reinstall while another worker's unit runs from the same environment once broke its imports."""
    import tierlocal

    if not any(_private(path) for path in (Path(sys.executable), Path(tierlocal.__file__), Path(shutil.__file__))):
        return Path(sys.executable)
    venv = SERVICE_ROOT / f"venv-{hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:12]}"
    python, stamp = venv / "bin" / "python", venv / "tierlocal-source.sha256"
    SERVICE_ROOT.mkdir(parents=True, exist_ok=True)
    with (SERVICE_ROOT / f"{venv.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = _source_digest()
        if python.exists() and stamp.exists() and stamp.read_text() == digest:
            return python
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
        stamp.write_text(digest)
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

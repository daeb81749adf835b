"""The ``tierlocal`` command as a user runs it: a fresh process, the test's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["REPO_ROOT", "run_cli"]

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120, python: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tierlocal ARGS`` in a fresh process, as a user would (the environment as set by the
    test; ``python``: another installation's interpreter)."""
    return subprocess.run(
        [str(python or sys.executable), "-m", "tierlocal", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO_ROOT if python is None else "/",  # `-m` imports from the working directory first: not this checkout's copy
        check=False,
    )

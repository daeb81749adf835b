"""Project invariants: the estimation core stays pure, env vars are read in one place, modules stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tierlocal"
PURE_MODULES = ["fit.py", "units.py", "tiers.py", "plan.py", "model.py", "memory.py", "estimate.py", "gguf/parse.py", "gguf/summary.py"]
IO_MODULES = {"os", "subprocess", "socket", "httpx2", "httpx", "aiohttp", "sqlite3", "huggingface_hub", "psutil", "pynvml", "shutil", "pathlib"}
MAX_MODULE_LINES = 600


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", PURE_MODULES)
def test_core_modules_do_no_io(module: str) -> None:
    assert _imported_roots(PACKAGE / module) & IO_MODULES == set()


def test_environment_is_read_only_in_constants() -> None:
    readers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "os.environ" in p.read_text())
    assert readers == ["constants.py"]


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}

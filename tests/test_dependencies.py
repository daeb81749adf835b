"""Every third-party package tierlocal imports is declared in pyproject.toml: checked from the
source (each import statement against the declared distributions), and for real (a fresh
virtual environment with the declared dependencies only imports every module and runs the CLI)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT

PACKAGE = REPO_ROOT / "tierlocal"


def _declared() -> tuple[set[str], set[str]]:
    """(core dependency names, names in the optional extras), normalised."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {_normalise(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]) for requirement in requirements}

    extras = set().union(*(names(group) for name, group in project["optional-dependencies"].items() if name != "test"))
    return names(project["dependencies"]), extras


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports() -> Iterator[tuple[str, str, bool]]:
    """(file, top-level module, guarded by ``except ImportError``) for every import of a module
    outside the standard library and tierlocal."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
            ):
                guarded.update(id(child) for statement in node.body for child in ast.walk(statement))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                if root not in sys.stdlib_module_names and root != "tierlocal":
                    yield str(path.relative_to(REPO_ROOT)), root, id(node) in guarded


def test_every_import_is_a_declared_dependency() -> None:
    core, extras = _declared()
    distributions = importlib.metadata.packages_distributions()
    undeclared = []
    for path, module, guarded in _third_party_imports():
        provided_by = {_normalise(name) for name in distributions.get(module, [module])}
        allowed = core | extras if guarded else core
        if not provided_by & allowed:
            undeclared.append(f"{path}: {module} ({', '.join(sorted(provided_by))}){' in an optional import' if guarded else ''}")
    assert sorted(set(undeclared)) == []


def test_the_static_check_knows_a_transitive_package_is_not_declared() -> None:
    """tqdm arrives with gguf but is not ours to import: the check would flag it (numpy, which
    also arrives with gguf, is declared because the speed calibration imports it)."""
    core, extras = _declared()
    assert "gguf" in core and "tqdm" not in core | extras and "numpy" in core


@pytest.mark.long
def test_a_venv_of_the_declared_dependencies_imports_every_module(tmp_path: Path) -> None:
    """Built as a user would install it (pip install ., no extras), outside the checkout so
    the source tree cannot stand in for the installed package."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--disable-pip-version-check", str(REPO_ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    script = (
        "import importlib, json, pkgutil, tierlocal\n"
        "walked, failed = [], []\n"
        "for module in pkgutil.walk_packages(tierlocal.__path__, 'tierlocal.'):\n"
        "    walked.append(module.name)\n"
        "    if module.name != 'tierlocal.__main__':\n"
        "        try:\n"
        "            importlib.import_module(module.name)\n"
        "        except Exception as exc:\n"
        "            failed.append(f'{module.name}: {exc!r}')\n"
        "print(json.dumps([tierlocal.__file__, sorted(walked), failed]))\n"
    )
    imported = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True)
    location, walked, failed = json.loads(imported.stdout)
    assert location.startswith(str(venv)) and failed == []
    # Every module of the source tree was installed and imported (a folder without __init__.py
    # would be skipped by the walk).
    in_tree = sorted(".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__") for p in PACKAGE.rglob("*.py"))
    assert walked == [name for name in in_tree if name != "tierlocal"]
    checked = subprocess.run(
        [str(venv / "bin" / "tierlocal"), "check", "--gpu", "24GiB", "--json"], capture_output=True, text=True, cwd=tmp_path, check=False, timeout=120
    )
    assert checked.returncode == 0, checked.stderr
    assert '"recommendation"' in checked.stdout

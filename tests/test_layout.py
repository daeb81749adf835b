"""The package's shape: a pure core that stays pure however it imports, the CLI the only user of
click and rich, no import cycle, every user-facing error in errors.py, every named default in
constants.py, env vars read in one place, small modules and functions."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT

PACKAGE = REPO_ROOT / "tierlocal"

#: The pure core: planning arithmetic over plain data. Nothing here may reach these, however
#: indirectly: no network client, no process, no hardware probe, no terminal UI.
PURE = [
    "tierlocal.gguf.cursor",
    "tierlocal.fit",
    "tierlocal.fit.model",
    "tierlocal.fit.memory",
    "tierlocal.fit.offload",
    "tierlocal.fit.split",
    "tierlocal.fit.estimate",
    "tierlocal.fit.search",
    "tierlocal.fit.speed",
    "tierlocal.fit.features",
    "tierlocal.fit.placement",
    "tierlocal.fit.device_speed",
    "tierlocal.fit.calibration",
    "tierlocal.fit.recurrent",
    "tierlocal.fit.cpu_prior",
    "tierlocal.plan",
    "tierlocal.plan.source",
    "tierlocal.plan.speeds",
    "tierlocal.plan.notes",
    "tierlocal.fit.cpu_kernels",
    "tierlocal.fit.routing",
    "tierlocal.fit.concurrency",
    "tierlocal.fit.users_measured",
    "tierlocal.plan.machine",
    "tierlocal.plan.quality",
    "tierlocal.plan.quality_rules",
    "tierlocal.plan.modes",
    "tierlocal.plan.answer_time",
    "tierlocal.plan.where",
    "tierlocal.plan.inputs",
    "tierlocal.published",
    "tierlocal.plan.rule_of_thumb",
    "tierlocal.plan.recommend",
    "tierlocal.plan.candidates",
    "tierlocal.fit.digest",
    "tierlocal.measure.probes",
    "tierlocal.report",
    "tierlocal.report.svg",
    "tierlocal.report.plan_view",
    "tierlocal.report.pages",
    "tierlocal.report.set_page",
    "tierlocal.plan.verify",
    "tierlocal.tiers",
    "tierlocal.tiers.arithmetic",
    "tierlocal.tiers.plan",
    "tierlocal.tiers.launch",
    "tierlocal.tiers.launch_specs",
    "tierlocal.gguf",
    "tierlocal.gguf.parse",
    "tierlocal.gguf.summary",
    "tierlocal.gguf.chat_template",
    "tierlocal.hardware.types",
    "tierlocal.hardware.override",
    "tierlocal.tui.rows",
    "tierlocal.engines.flags",
    "tierlocal.engines.ollama",
    "tierlocal.engines.prompt_formats",
    "tierlocal.engines.loadlog",
    "tierlocal.units",
    "tierlocal.errors",
]
IMPURE_ROOTS = {
    "click",
    "rich",
    "textual",
    "huggingface_hub",
    "httpx",
    "httpx2",
    "aiohttp",
    "requests",
    "urllib3",
    "psutil",
    "subprocess",
    "pynvml",
    "ollama",
    "redis",
    "sqlite3",
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: A module over MAX_MODULE_LINES says why in its docstring with this phrase.
LONG_MODULE_REASON = "Over 400 lines because"
#: Defaults that live in constants.py only (the literal may appear nowhere else in the package;
#: 512, the micro-batch, is left out: it is also an unrelated limit, --jobs).
NAMED_DEFAULTS = {8192: "DEFAULT_CTX", 8080: "LLAMA_SERVER_PORT", 11434: "OLLAMA_PORT", 8088: "GATEWAY_PORT"}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


KNOWN = {module for module, _ in _modules()}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement in ``path``, at any depth, except
    those only type checkers see; relative imports resolved."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_lines(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
            # "from . import constants" imports a module; "from .x import y" imports x.
            yield from ((name, node.lineno) for name in names if name in KNOWN)
            if not any(name in KNOWN for name in names):
                yield base, node.lineno


def _impure_imports(modules: list[str], pythonpath: str = "") -> dict[str, list[str]]:
    """Import each module in turn in a fresh interpreter; for each, the impure roots
    (:data:`IMPURE_ROOTS`) its import pulled in, however indirectly."""
    script = (
        "import importlib, json, sys\n"
        "seen = set(sys.modules); added = {}\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "    added[name] = sorted({m.split('.')[0] for m in set(sys.modules) - seen}); seen = set(sys.modules)\n"
        "print(json.dumps(added))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{pythonpath}:{REPO_ROOT}" if pythonpath else str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True, env=env)
    added = json.loads(done.stdout)
    return {module: sorted(set(roots) & IMPURE_ROOTS) for module, roots in added.items() if set(roots) & IMPURE_ROOTS}


def test_the_pure_core_reaches_no_io_however_indirectly() -> None:
    """Import each pure module in turn in a fresh interpreter; name the first that pulls in a
    network client, a process, a hardware probe or a terminal UI."""
    assert _impure_imports(PURE) == {}


def test_only_the_cli_imports_click_or_rich() -> None:
    """The terminal UI (tierlocal.tui) draws with Textual, and rich inside it; click stays in the CLI."""
    offenders = sorted(
        f"{module}:{line} imports {name}"
        for module, path in _modules()
        if not module.startswith("tierlocal.cli")
        for name, line in _imports(module, path)
        if name.split(".")[0] in ({"click"} if module.startswith("tierlocal.tui") else {"click", "rich", "textual"})
    )
    assert offenders == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere() -> None:
    """Imports inside functions count too: a lazy import that closes a loop is still a loop."""
    graph = {module: {name for name, _ in _imports(module, path) if name in KNOWN and name != module} for module, path in _modules()}
    assert _strongly_connected(graph) == []


#: The packages (and top-level modules) in the order the data flows, lowest first: each may
#: import only those before it. source/header → spec → estimate → engine → machine → plan →
#: measure → ranking → tiers → serve/gateway → the terminal UI → cli.
LAYERS = [
    "errors",
    "units",
    "constants",
    "cache_file",
    "published",
    "gguf",
    "catalog",
    "fit",
    "planning_cache",
    "engines",
    "hardware",
    "fetch",
    "plan",
    "measure",
    "gpu_figures",
    "cpu_figures",
    "inputs_here",
    "recommendation",
    "hub_recommendation",
    "tiers",
    "resolve",
    "report",
    "serve",
    "gateway",
    "tui",
    "cli",
    "__main__",
]


def _package_of(module: str) -> str:
    """tierlocal.fit.estimate → fit; tierlocal.catalog → catalog; tierlocal → tierlocal."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _package_imports() -> dict[str, dict[str, list[str]]]:
    """package → imported package → the imports that make the edge (module:line → module);
    lazy imports inside functions included, type-checking-only ones left out."""
    edges: dict[str, dict[str, list[str]]] = {}
    for module, path in _modules():
        for name, line in _imports(module, path):
            if name in KNOWN and _package_of(name) != _package_of(module):
                edges.setdefault(_package_of(module), {}).setdefault(_package_of(name), []).append(f"{module}:{line} → {name}")
    return edges


def _upward_imports(edges: dict[str, dict[str, list[str]]], layers: list[str]) -> list[str]:
    rank = {package: index for index, package in enumerate(layers)}
    return sorted(
        why
        for package, targets in edges.items()
        if package != "tierlocal"  # the package face: lazy names only, resolved by string
        for target, whys in targets.items()
        if rank.get(target, len(layers)) >= rank.get(package, -1)
        for why in whys
    )


def test_packages_depend_one_way() -> None:
    """No two packages import each other, however indirectly, and every import goes down
    :data:`LAYERS` (a new package must be placed in it)."""
    edges = _package_imports()
    assert sorted(set(edges) - {"tierlocal"} - set(LAYERS)) == []
    assert _strongly_connected({package: set(targets) for package, targets in edges.items()}) == []
    assert _upward_imports(edges, LAYERS) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    """The tree before the layering had catalog → fit.gpu_speed beside fit.source → catalog."""
    edges = {
        "catalog": {"fit": ["tierlocal.catalog:20 → tierlocal.fit.gpu_speed"]},
        "fit": {"catalog": ["tierlocal.fit.source:10 → tierlocal.catalog"]},
    }
    assert _upward_imports(edges, ["catalog", "fit"]) == ["tierlocal.catalog:20 → tierlocal.fit.gpu_speed"]
    assert _strongly_connected({package: set(targets) for package, targets in edges.items()}) == [["catalog", "fit"]]


def test_the_cycle_finder_finds_cycles() -> None:
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_every_user_facing_error_is_in_errors_py() -> None:
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    tree_names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    offenders = []
    for module, path in _modules():
        if module == "tierlocal.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
                if bases & tree_names:
                    offenders.append(f"{module}.{node.name}")
    assert offenders == []


def test_the_error_tree_in_errors_py_names_every_error() -> None:
    """The tree drawn in the docstring is the one users and the README read: every class is in
    it, under its own base."""
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    drawn = ast.get_docstring(tree) or ""
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    lines: dict[str, int] = {}  # class name → the column it is drawn at
    for line in drawn.splitlines():
        found = re.match(r"[\s│├└─]*([A-Z]\w+)", line)
        if found and found.group(1).endswith(("Error", "Failed", "Download", "Interrupted")):
            lines[found.group(1)] = found.start(1)
    assert sorted(node.name for node in classes if node.name not in lines) == []
    for node in classes:
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in lines:
                assert lines[node.name] > lines[base.id], f"{node.name} is drawn beside, not under, {base.id}"


def test_named_defaults_live_in_constants_only() -> None:
    offenders = []
    for module, path in _modules():
        if module == "tierlocal.constants":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in NAMED_DEFAULTS:
                offenders.append(f"{module}:{node.lineno}: {node.value} (use constants.{NAMED_DEFAULTS[node.value]})")
    assert offenders == []


def test_environment_is_read_only_in_constants() -> None:
    readers = sorted(module for module, path in _modules() if "os.environ" in path.read_text())
    assert readers == ["tierlocal.constants"]


def test_modules_stay_small_or_say_why() -> None:
    long = {}
    for module, path in _modules():
        text = path.read_text()
        lines = len(text.splitlines())
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_MODULE_LINES and LONG_MODULE_REASON not in docstring:
            long[module] = lines
    assert long == {}


def test_functions_stay_short() -> None:
    long = {}
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{module}.{node.name}"] = lines
    assert long == {}


@pytest.mark.parametrize("module", ["tierlocal.fit", "tierlocal.plan.source", "tierlocal.engines.flags"])
def test_the_checker_would_catch_an_impure_import(module: str, tmp_path: Path) -> None:
    """The purity check itself, on a module that imports a pure one and then psutil, and on one
    that reaches psutil only through another module: both are caught, after the pure ones."""
    (tmp_path / "impure_probe.py").write_text(f"import {module}\nimport psutil\n")
    (tmp_path / "indirect_probe.py").write_text("import impure_probe\n")
    found = _impure_imports([module, "indirect_probe"], str(tmp_path))
    assert set(found) == {"indirect_probe"} and "psutil" in found["indirect_probe"]


#: Libraries that cost a tenth of a second or more to import, loaded only by the code that uses
#: them (a request to the hub or a URL, a download, the gateway's server, the probe writer).
HEAVY_IMPORTS = ("huggingface_hub.hf_api", "huggingface_hub.file_download", "httpx2", "aiohttp", "numpy", "gguf")


def test_no_command_imports_a_client_it_has_not_used_yet() -> None:
    """Every command's module together, imported in a fresh interpreter, loads none of the heavy
    libraries: `status` took 0.6 s of CPU, 0.45 s of it importing huggingface_hub, httpx2 and
    aiohttp it never called (the test suite runs the CLI hundreds of times; users, at every start)."""
    from tierlocal.cli import _LazyGroup

    modules = sorted({target.partition(":")[0] for target in _LazyGroup.lazy.values()})
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps([name for name in {HEAVY_IMPORTS!r} if name in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert len(modules) >= 12 and json.loads(done.stdout) == []


def test_the_library_api_names_resolve_lazily() -> None:
    """``tierlocal.__all__`` is what ``tierlocal.NAME`` gives, each from its own module, and
    importing the package alone loads none of them."""
    script = (
        "import sys, tierlocal\n"
        "before = {m for m in sys.modules if m.startswith('tierlocal.')}\n"
        "missing = [name for name in tierlocal.__all__ if getattr(tierlocal, name, None) is None]\n"
        "print(sorted(before), missing, sorted(tierlocal.__all__) == sorted(['__version__', *tierlocal._API]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.split() == ["[]", "[]", "True"]


def test_what_ships_cites_primary_sources_not_the_team_notes() -> None:
    """The package, its recipes and its unit templates reach users (``plan --sources``, ``usage``,
    the dashboard, a unit's header): none may cite the team's notes outside the product."""
    shipped = [
        path for folder in ("tierlocal", "recipes", "systemd") for path in (REPO_ROOT / folder).rglob("*") if path.is_file() and path.suffix != ".pyc"
    ]
    assert len(shipped) > 50
    citing = [
        str(path.relative_to(REPO_ROOT))
        for path in shipped
        if any(word in path.read_text(errors="replace") for word in ("shared/", "MISSION.md", "shared notes"))
    ]
    assert citing == []


def test_lines_stay_short_without_telling_the_formatter_to_look_away() -> None:
    """Over-long lines are ruff's E501 at pyproject's line-length, checked by the lint step of the
    test command; no ``# fmt: skip`` or ``# fmt: off`` keeps arguments packed on one line so
    that a function meets MAX_FUNCTION_LINES by packing rather than by doing one thing."""
    ruff = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert "E" in ruff["lint"]["select"] and "E501" not in ruff["lint"].get("ignore", []) and ruff["line-length"] <= 150
    escapes = re.compile(r"(?<!`)#\s*fmt:\s*(skip|off)\b")  # a comment, not one quoted in a docstring
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for folder in ("tierlocal", "tests", "bench", "docs")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if escapes.search(line)
    ]
    assert found == []

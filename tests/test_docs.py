"""The documentation: the site builds with warnings as errors, every command and error class has
its entry, the README's commands are real ones, the outputs it shows are what the commands
print, and the JSON shapes docs/reference/json.md documents are what the commands give."""

from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
import yaml

from tests.support.cli import REPO_ROOT, run_cli
from tests.support.doc_json import assert_documented, documented_mismatches, shapes
from tests.support.sparse_models import QWEN3_8B, write_sparse_gguf
from tierlocal import errors
from tierlocal.cli import cli
from tierlocal.errors import UsageError
from tierlocal.gateway.config import parse_config

DOCS = REPO_ROOT / "docs"
README = REPO_ROOT / "README.md"
COMMANDS = cli.list_commands(click.Context(cli))


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generated", DOCS / "_hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """mkdocs --strict fails on a broken link or anchor, a page outside the nav, a missing
    snippet, or a generated section the code cannot fill (a config key without a comment)."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    config_page = _text_of(tmp_path / "site" / "gateway" / "configuration" / "index.html")
    assert "redis_url_env" in config_page and "usd_per_hour" in config_page  # the generated reference
    assert 'model = "kimi-k3"' in config_page  # the example file, included
    assert "--min-speed" in _text_of(tmp_path / "site" / "commands" / "check" / "index.html")  # the CLI reference, from click
    assert "free some space, pull to a larger disk" in _text_of(tmp_path / "site" / "troubleshooting" / "index.html")


def _text_of(page: Path) -> str:
    """A built page's text, without its markup."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_a_page_with_its_reference(name: str) -> None:
    page = DOCS / "commands" / f"{name}.md"
    assert page.exists(), f"tierlocal {name} has no page: add docs/commands/{name}.md (and to mkdocs.yml's nav)"
    text = page.read_text()
    directive = re.search(r"::: mkdocs-click\n    :module: (\S+)\n    :command: (\S+)\n", text)
    assert directive, f"docs/commands/{name}.md has no generated reference (::: mkdocs-click)"
    module, attribute = directive.groups()
    assert getattr(importlib.import_module(module), attribute) is cli.get_command(click.Context(cli), name)
    nav = _nav_pages(yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())["nav"])
    assert f"commands/{name}.md" in nav
    assert f"[`{name}`]({name}.md)" in (DOCS / "commands" / "index.md").read_text()


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_class_has_an_entry_in_troubleshooting(name: str) -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    assert f"\n## {name}\n" in text, f"docs/troubleshooting.md has no section for {name}"
    assert f"<!-- generated: raises {name} -->" in text
    section = text.split(f"\n## {name}\n", 1)[1].split("<!-- generated", 1)[0]
    assert len(section.split()) >= 8, f"{name}'s section says what it means and what to do"


def test_troubleshooting_lists_the_hints_the_source_raises() -> None:
    """Read from the source: a hint written at a raise site shows up under its class."""
    hooks = _hooks()
    table = hooks.raises_table("DiskFullError")
    assert "free some space, pull to a larger disk with --dir DIR, or lower --keep-free" in table
    usage = hooks.raises_table("UsageError")
    assert "[[users]] has: …" in usage  # a config_error(...) counts as the UsageError it builds
    with pytest.raises(ValueError, match="not an error class"):
        hooks.raises_table("NoSuchError")


def test_the_gateway_reference_documents_every_key_the_parser_takes() -> None:
    reference = _hooks().gateway_config_reference()
    for heading, _what, keys, _cls in _hooks().GATEWAY_TABLES:
        section = reference.split(f"### `{heading}`", 1)[1].split("### ", 1)[0]
        rows = re.findall(r"^\| `([a-z_]+)` \| [^|]+ \| [^|]+ \| (.+) \|$", section, re.M)
        assert {key for key, _meaning in rows} == keys, heading
        assert all(len(meaning.split()) >= 3 for _key, meaning in rows), heading
    assert "| `port` | integer | `8088` |" in reference
    assert "| `budget_period` | string | `month` |" in reference


@pytest.mark.parametrize(
    ("table", "where"),
    [
        ({"users": [{"name": "alice", "budjet_usd": 5}]}, "users[0].budjet_usd"),
        ({"prices": {"m": {"input_cache_hit": 1, "input_cache_miss": 2, "output": 3, "cached": 1}}}, "prices.m.cached"),
        ({"routes": [{"model": "m", "targets": [{"url": "http://127.0.0.1:1/v1", "model": "m", "tier": 2, "colour": 1}]}]}, "routes[0].targets[0]"),
    ],
)
def test_a_key_the_reference_does_not_list_is_refused(table: dict[str, object], where: str) -> None:
    """The reference is the whole file: a key outside it is an error naming where it is, not
    a setting silently ignored (a misspelt budget would be no budget)."""
    with pytest.raises(UsageError, match=re.escape(where)) as raised:
        parse_config(table, "gateway.toml")
    assert raised.value.hint


def _code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, re.DOTALL)


def _command_lines(text: str) -> list[str]:
    """Every ``tierlocal …`` invocation in a page's sh and console blocks, continuation lines
    joined, without the prompt, environment assignments, comments and what follows a pipe."""
    found = []
    for language, body in _code_blocks(text):
        if language not in ("sh", "console", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").strip()
            line = re.split(r" #|\s\|\s|\s>\s|\s&&\s|\s&$", line)[0]
            words = line.split()
            while words and (re.fullmatch(r"[A-Z_]+=\S*", words[0]) or words[0] in ("sudo", "(cd")):
                words.pop(0)
            if words and words[0].endswith("tierlocal") and len(words) > 1:
                found.append(" ".join(words[1:]))
    return found


def _check_invocation(invocation: str) -> str | None:
    """Why ``tierlocal INVOCATION`` names a command or option that does not exist (None: it does)."""
    words = shlex.split(invocation.replace("[", " ").replace("]", " ").replace("…", "x"))
    command: click.Command = cli
    path = ["tierlocal"]
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(click.Context(command), words[0])
        if sub is None:
            return f"{' '.join(path)} has no command {words[0]!r}"
        path.append(words.pop(0))
        command = sub
    options = {name for parameter in command.params for name in (*parameter.opts, *parameter.secondary_opts)} | {"-h", "--help"}
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if name.startswith("-") and name not in options and not re.fullmatch(r"-\d.*", name):
            return f"{' '.join(path)} has no option {name!r}"
    return None


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_the_readme_starts_with_the_two_commands_ci_runs_and_stays_short() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first = _code_blocks(text)[0]
    assert first == ("sh", "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/tierlocal check\nbash tests/run.sh\n")
    assert text.index("```") < text.index("\n## ")  # before anything else
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bash tests/run\.sh\b", ci, re.M)


def test_every_command_the_pages_show_exists_with_those_options() -> None:
    problems = []
    count = 0
    for page in _pages():
        for invocation in _command_lines(page.read_text()):
            count += 1
            if (problem := _check_invocation(invocation)) is not None:
                problems.append(f"{page.relative_to(REPO_ROOT)}: tierlocal {invocation}: {problem}")
    assert count > 100  # the pages' examples were found
    assert not problems, "\n".join(problems)


def test_the_invocation_check_catches_a_wrong_command_or_option() -> None:
    assert _check_invocation("check --gpu 24GiB --ram 64GiB") is None
    assert _check_invocation("gateway keys add alice --json") is None
    assert _check_invocation("check --gpus 24GiB") == "tierlocal check has no option '--gpus'"
    assert _check_invocation("gateway key add alice") == "tierlocal gateway has no command 'key'"


def _output_blocks() -> list[tuple[Path, str, list[str]]]:
    found = []
    for page in _pages():
        for command, body in re.findall(r"<!-- output of: tierlocal (.+?) -->\n```console\n(.*?)```", page.read_text(), re.DOTALL):
            found.append((page, command, [line for line in body.splitlines() if not line.startswith("$ ")]))
    return found


@pytest.mark.parametrize(("page", "command", "lines"), _output_blocks(), ids=lambda value: value.name if isinstance(value, Path) else None)
def test_the_output_the_pages_show_is_what_the_command_prints(page: Path, command: str, lines: list[str], tmp_path: Path) -> None:
    """Each line shown must be in the output (a pipe wraps long lines at 120 columns, so words
    are compared with the line breaks as spaces); a line ending in … only up to there; a lone …
    stands for lines left out."""
    result = run_cli(*shlex.split(command), env={"TIERLOCAL_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    printed = " ".join(result.stdout.split())
    for line in lines:
        shown = " ".join(line.removesuffix("…").split())
        if shown:
            assert shown in printed, f"{page.name}: {line!r} is not in the output of tierlocal {command}"


def test_the_pages_show_real_outputs() -> None:
    shown = {command for _page, command, _lines in _output_blocks()}
    assert {'check --gpu "RTX 4090" --ram 64GiB', "plan kimi-k3"} <= shown


def test_every_environment_variable_tierlocal_reads_is_documented() -> None:
    source = (REPO_ROOT / "tierlocal" / "constants.py").read_text()
    names = set(re.findall(r'^ENV_[A-Z_]+ = "([A-Z_]+)"', source, re.M))
    names |= {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and re.fullmatch(r"[A-Z][A-Z_]+", node.args[0].value)
    }
    page = (DOCS / "reference" / "configuration.md").read_text()
    assert names >= {"TIERLOCAL_HOME", "TIERLOCAL_DEBUG", "XDG_DATA_HOME", "OLLAMA_MODELS"}
    missing = sorted(name for name in names if f"`{name}" not in page)
    assert not missing, f"docs/reference/configuration.md does not list {missing}"


def test_the_shape_checker_finds_a_missing_an_extra_and_a_mistyped_key() -> None:
    good = {"engine_dir": "/x", "engines": [{"path": "/x/a", "binary": "/x/a/b", "backend": "cpu", "version": "1"}], "selected": None}
    assert documented_mismatches("engine-list", good) == []
    extra = {**good, "colour": 1}
    assert documented_mismatches("engine-list", extra) == ["engine-list: key 'colour' is not documented"]
    missing = {key: value for key, value in good.items() if key != "selected"}
    assert documented_mismatches("engine-list", missing) == ["engine-list: documented key 'selected' is missing"]
    assert documented_mismatches("engine-list", {**good, "engines": {}}) == ["engine-list.engines: documented as a list, is dict"]
    assert "usage" in shapes() and "status" in shapes()


@pytest.fixture(scope="module")
def sparse_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sparse_gguf(tmp_path_factory.mktemp("gguf") / "qwen3-8b-q4k.gguf", QWEN3_8B)


def _gateway_toml(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[server]\nstate_dir = "{tmp_path / "state"}"\n\n'
        '[[routes]]\nmodel = "m"\ntargets = [ { url = "http://127.0.0.1:9/v1", model = "m" } ]\n\n'
        '[[users]]\nname = "alice"\nbudget_usd = 5.0\n'
    )
    return path


def test_the_json_of_the_commands_that_need_no_engine_is_as_documented(sparse_qwen3: Path, tmp_path: Path) -> None:
    env = {"TIERLOCAL_HOME": str(tmp_path / "home")}
    config = _gateway_toml(tmp_path)
    cases = [
        ("check", ["check", "--gpu", "RTX 4090", "--ram", "64GiB"]),
        ("check", ["check", "--gpu", "none", "--ram", "16GiB"]),
        ("check-source", ["check", str(sparse_qwen3), "--gpu", "8GiB"]),
        ("check-set", ["check", str(sparse_qwen3), "qwen3-0.6b:q8_0", "--gpu", "8GiB"]),
        ("inspect", ["inspect", str(sparse_qwen3)]),
        ("hw", ["hw"]),
        ("plan", ["plan", "kimi-k3"]),
        ("plan", ["plan", "llama-3.3-70b"]),
        ("catalog-list", ["catalog", "list"]),
        ("catalog-show", ["catalog", "show", "qwen3-8b"]),
        ("engine-list", ["engine", "list"]),
        ("keys-add", ["gateway", "keys", "add", "alice", "--config", str(config)]),
        ("keys-list", ["gateway", "keys", "list", "--config", str(config)]),
        ("usage", ["usage", "--config", str(config)]),
        ("gateway-agents", ["gateway", "agents", "--config", str(config)]),
    ]
    for shape, argv in cases:
        result = run_cli(*argv, "--json", env=env)
        assert result.returncode == 0, (argv, result.stderr)
        assert_documented(shape, json.loads(result.stdout))


def test_every_documented_shape_is_checked_against_a_real_output_somewhere() -> None:
    """A shape no test compares with a command's output could drift unseen."""
    sources = "\n".join(path.read_text() for path in (REPO_ROOT / "tests").glob("test_*.py"))
    checked = set(re.findall(r'assert_documented\(\s*"([a-z-]+)"', sources))
    checked |= set(re.findall(r'^\s*\("([a-z-]+)", \["', sources, re.M))  # the cases above
    referenced = set(re.findall(r"<([a-z-]+)>", (DOCS / "reference" / "json.md").read_text()))
    assert not set(shapes()) - checked - referenced, "shapes in docs/reference/json.md that no test checks"

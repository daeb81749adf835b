"""tests/assets/prepare.py fetches through this machine's own package configuration, and the
tree names no package registry: the machines this project builds on bring their own mirrors."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.assets import prepare
from tests.support.cli import REPO_ROOT

#: Public package registries (Debian, Ubuntu, PyPI, the Go module proxy, npm, crates.io, Maven
#: Central). The machine's own configuration says where packages come from.
REGISTRY_HOSTS = (
    "deb.debian.org",
    "security.debian.org",
    "ftp.debian.org",
    "httpredir.debian.org",
    "archive.ubuntu.com",
    "pypi.org",
    "pypi.python.org",
    "files.pythonhosted.org",
    "proxy.golang.org",
    "sum.golang.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "crates.io",
    "repo.maven.apache.org",
    "repo1.maven.org",
)


def _tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=REPO_ROOT, check=False)
    if listed.returncode == 0:
        return [REPO_ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in REPO_ROOT.rglob("*") if path.is_file() and not {".git", ".venv"} & set(path.parts)]


def test_the_tree_names_no_package_registry_host() -> None:
    found = []
    for path in _tracked_files():
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        text = path.read_text(errors="replace").lower()
        found += [f"{path.relative_to(REPO_ROOT)}: {host}" for host in REGISTRY_HOSTS if host in text]
    assert found == []


def test_the_host_check_would_catch_one(tmp_path: Path) -> None:
    assert any(host in "deb [signed-by=/k.gpg] http://deb.debian.org/debian stable main" for host in REGISTRY_HOSTS)


def test_apt_sources_come_from_the_system_configuration(tmp_path: Path) -> None:
    """Both apt formats; the release's own archive entries only (not -updates or -security),
    disabled stanzas and deb-src lines skipped, options and keyrings kept."""
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (tmp_path / "sources.list").write_text(
        "# a comment\n"
        "deb [arch=amd64 signed-by=/etc/keys/mirror.gpg] http://mirror.example/debian bookworm main contrib\n"
        "deb-src http://mirror.example/debian bookworm main\n"
        "deb http://mirror.example/debian bookworm-updates main\n"
    )
    (parts / "debian.sources").write_text(
        "Types: deb\nURIs: http://proxy.example:3142/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nEnabled: no\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb\nURIs: http://proxy.example:3142/debian-security\nSuites: bookworm-security\nComponents: main\n"
    )
    assert prepare.system_archives("bookworm", tmp_path / "sources.list", parts) == [
        ("http://mirror.example/debian", "/etc/keys/mirror.gpg"),
        ("http://proxy.example:3142/debian", prepare.DEFAULT_KEYRING),
    ]
    with pytest.raises(SystemExit, match="no apt source for trixie"):
        prepare.system_archives("trixie", tmp_path / "sources.list", parts)

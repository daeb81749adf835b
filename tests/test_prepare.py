"""tests/assets/prepare.py fetches through this machine's own package configuration, and the
tree names none of the registries that configuration points at."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.assets import prepare
from tests.support.cli import REPO_ROOT


def _configured_hosts(text: str) -> set[str]:
    """Host names in URLs or bare hosts, one or more per line (``https://host:port/path``)."""
    hosts = set()
    for word in text.replace(",", " ").split():
        host = re.sub(r"^[a-z+]+://", "", word.strip()).split("/", 1)[0].split(":", 1)[0].strip("'\"")
        if "." in host:
            hosts.add(host.lower())
    return hosts


def registry_hosts() -> set[str]:
    """The package registries this machine's own clients are configured for: apt's sources,
    pip's index (its default and any configured one), the Go proxy, npm's registry."""
    hosts = _configured_hosts(" ".join(uri for uri, _suites, _keyring in prepare._source_entries()))
    for argv in (
        [sys.executable, "-c", "import pip._internal.models.index as i; print(i.PyPI.netloc, i.PyPI.file_storage_domain)"],
        [sys.executable, "-m", "pip", "config", "list"],
        ["go", "env", "GOPROXY"],
        ["npm", "config", "get", "registry"],
    ):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        pip_config = argv[1:4] == ["-m", "pip", "config"]
        configured = [line.split("=", 1)[1] for line in done.stdout.splitlines() if "index-url" in line] if pip_config else [done.stdout]
        hosts |= _configured_hosts(" ".join(configured))
    return hosts


def _tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=REPO_ROOT, check=False)
    if listed.returncode == 0:
        return [REPO_ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in REPO_ROOT.rglob("*") if path.is_file() and not {".git", ".venv"} & set(path.parts)]


def test_the_tree_names_no_package_registry_host() -> None:
    """No file names a registry this machine's package clients use: the machines this project
    builds on bring their own mirrors, and the tree must not route around them."""
    hosts = registry_hosts()
    assert hosts, "no package registry is configured on this machine: nothing to check against"
    found = []
    for path in _tracked_files():
        if path.is_file():
            text = path.read_text(errors="replace").lower()
            found += [f"{path.relative_to(REPO_ROOT)}: {host}" for host in sorted(hosts) if host in text]
    assert found == []


def test_configured_hosts_are_read_from_urls_and_lists() -> None:
    text = "https://mirror.example:8443/pypi/simple, direct\nhttp://apt.example/debian 'files.example'"
    assert _configured_hosts(text) == {"mirror.example", "apt.example", "files.example"}


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

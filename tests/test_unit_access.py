"""`service install serve` refuses a unit its account could not start: the rules on real files and
real accounts (``nobody``, root), then the command itself. The files live under /dev/shm: the
test's own /tmp is exactly what the unit's PrivateTmp=yes hides."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tierlocal.serve.unit_access import Needed, Sandbox, ServiceAccount, blocked_paths

NOBODY = ServiceAccount.lookup("nobody")
ROOT = ServiceAccount.lookup("root")
UNIT = Sandbox(private_tmp=True, protect_home="read-only")


@pytest.fixture
def tree() -> Iterator[Path]:
    """A directory outside /tmp, removed afterwards."""
    base = Path("/dev/shm") / f"tierlocal-access-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _file(path: Path, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    path.chmod(mode)
    return path


def _why(needed: Needed, account: ServiceAccount = NOBODY, sandbox: Sandbox = UNIT) -> list[tuple[str, str]]:
    return [(blocked.cause, blocked.why) for blocked in blocked_paths([needed], account, sandbox)]


def test_an_account_needs_every_directory_on_the_way_and_the_file(tree: Path) -> None:
    assert NOBODY.uid == 65534 and 65534 in NOBODY.gids
    open_file = _file(tree / "open" / "model.gguf")
    assert _why(Needed("the model", open_file)) == []
    closed = tree / "closed"
    _file(closed / "model.gguf")
    closed.chmod(0o700)
    assert _why(Needed("the model", closed / "model.gguf")) == [
        ("permissions", f"{closed} is drwx------ (owner root, group root): nobody cannot enter it")
    ]
    private = _file(tree / "open" / "private.gguf", 0o600)
    assert _why(Needed("the model", private)) == [("permissions", f"{private} is -rw------- (owner root, group root): nobody cannot read it")]
    unrunnable = _file(tree / "open" / "llama-server", 0o644)
    assert _why(Needed("llama-server", unrunnable, execute=True)) == [
        ("permissions", f"{unrunnable} is -rw-r--r-- (owner root, group root): nobody cannot run it")
    ]
    assert _why(Needed("the model", closed / "model.gguf"), ROOT) == []  # root passes permissions


def test_the_owner_and_the_group_classes_decide_before_the_others(tree: Path) -> None:
    mine = tree / "mine"
    model = _file(mine / "model.gguf", 0o600)
    os.chown(model, 65534, 0)
    os.chown(mine, 65534, 0)
    mine.chmod(0o700)
    assert _why(Needed("the model", model)) == []  # nobody owns both
    shared = tree / "shared"
    model = _file(shared / "model.gguf", 0o640)
    os.chown(model, 0, 65534)
    os.chown(shared, 0, 65534)
    shared.chmod(0o750)
    assert _why(Needed("the model", model)) == []  # nobody's group may enter and read
    os.chown(model, 65534, 65534)
    model.chmod(0o060)  # the owner's bits are the ones that count for the owner, even when the group's would allow
    assert _why(Needed("the model", model))[0][0] == "permissions"


def test_a_link_is_followed_to_where_its_target_is_closed(tree: Path) -> None:
    closed = tree / "closed"
    target = _file(closed / "blob")
    closed.chmod(0o700)
    link = tree / "snapshot" / "model.gguf"
    link.parent.mkdir()
    link.symlink_to(target)
    assert _why(Needed("the model", link)) == [("permissions", f"{closed} is drwx------ (owner root, group root): nobody cannot enter it")]


def test_the_units_sandbox_hides_tmp_and_with_protect_home_yes_the_homes(tmp_path: Path) -> None:
    model = _file(tmp_path / "model.gguf")
    (cause, why), *_ = _why(Needed("the model", model), ROOT)
    assert cause == "private_tmp" and why == f"{model} is under /tmp, which PrivateTmp=yes replaces with the service's own empty directory"
    assert _why(Needed("the model", model), ROOT, Sandbox(private_tmp=False)) == []
    home = Path("/root/.bashrc")
    assert _why(Needed("a file", home), ROOT, Sandbox(protect_home="yes"))[0][0] == "home"
    assert _why(Needed("a file", home), ROOT, Sandbox(protect_home="read-only")) == []  # read-only still reads


def test_install_refuses_a_unit_its_account_cannot_start_and_says_what_to_change(tree: Path, tmp_path: Path, unit_python: Path) -> None:
    closed = tree / "closed"
    model = _file(closed / "model.gguf")
    closed.chmod(0o700)
    units = tree / "units"
    refused = run_cli(
        "service", "install", "serve", str(model), "--llama-server", "/bin/true", "--user", "nobody", "--dir", str(units), python=unit_python
    )
    assert refused.returncode == 2 and not units.exists()
    error, hint = refused.stderr.splitlines()[-2:]
    assert error.startswith("error: the service account 'nobody' could not reach ") and "the model" in error
    assert hint.startswith("hint: ") and hint.endswith("; or --no-access-check if an ACL or a drop-in opens it")

    in_tmp = _file(tmp_path / "model.gguf")
    hidden = run_cli(
        "service", "install", "serve", str(in_tmp), "--llama-server", "/bin/true", "--user", "root", "--dir", str(units), python=unit_python
    )
    assert hidden.returncode == 2
    assert hidden.stderr.splitlines()[-2:] == [
        f"error: the service account 'root' could not reach the model {in_tmp}: {in_tmp} is under /tmp, which PrivateTmp=yes replaces with the "
        "service's own empty directory",
        "hint: move it out of /tmp and /var/tmp (e.g. models under /var/lib/tierlocal/models, tierlocal under /opt/tierlocal); or "
        "--no-access-check if an ACL or a drop-in opens it",
    ]

    written = run_cli(
        "service", "install", "serve", str(model), "--llama-server", "/bin/true", "--user", "root", "--dir", str(units), python=unit_python
    )
    assert written.returncode == 0, written.stderr
    assert f"ReadOnlyPaths={closed}" in (units / "tierlocal-serve.service").read_text()


def test_install_takes_a_catalog_name_once_it_is_pulled(tmp_path: Path) -> None:
    """`serve` takes catalog names; `service install serve` now does too (it said "no such model
    file"), and says how to get the file when it is not downloaded yet."""
    result = run_cli(
        "service", "install", "serve", "qwen3-4b", "--llama-server", "/bin/true", "--dry-run", env={"HF_HUB_CACHE": str(tmp_path / "hub")}
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-2:] == ["error: qwen3-4b: not downloaded yet", "hint: run `tierlocal pull qwen3-4b` first"]

"""Whether a systemd service's account can reach every file its unit names, under the sandboxing
the unit itself writes — checked before the unit is written, because `systemd-analyze verify`
passes a unit that can never start (a venv under ``/root``, mode 700 on Debian; a model under
``/tmp``, which ``PrivateTmp=yes`` replaces with an empty directory).

The rules are the kernel's and systemd's (systemd.exec(5)): every directory on the way needs
the execute bit for the account (owner bits if it owns the directory, else group bits if it is
in the directory's group, else the others' bits; root passes), the file itself the read bit
(and execute for a program); ``PrivateTmp=yes`` hides ``/tmp`` and ``/var/tmp``;
``ProtectHome=yes`` or ``tmpfs`` hides ``/home``, ``/root`` and ``/run/user``
(``read-only`` keeps them readable). Access control lists are not read: a path an ACL opens is
reported blocked, and ``--no-access-check`` skips the check for it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["ServiceAccount", "Sandbox", "Needed", "Blocked", "blocked_paths", "hidden_by", "HOME_ROOTS", "PRIVATE_TMP_ROOTS"]

#: What ``PrivateTmp=yes`` gives the service its own empty copy of.
PRIVATE_TMP_ROOTS = (PurePosixPath("/tmp"), PurePosixPath("/var/tmp"))
#: What ``ProtectHome=`` covers.
HOME_ROOTS = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/run/user"))
#: Most symbolic links followed for one path (a loop ends the walk).
_MAX_LINKS = 40


@dataclass(frozen=True)
class ServiceAccount:
    """The account a unit runs as: uid None when it does not exist yet (it then gets no more
    than any other account: the others' permission bits)."""

    name: str
    uid: int | None
    gids: frozenset[int]

    @classmethod
    def lookup(cls, name: str) -> ServiceAccount:
        """The account as this machine's user database has it."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return cls(name, None, frozenset())
        groups = {entry.pw_gid} | {group.gr_gid for group in grp.getgrall() if name in group.gr_mem}
        return cls(name, entry.pw_uid, frozenset(groups))


@dataclass(frozen=True)
class Sandbox:
    """The unit's settings that hide or lock paths (as the templates in systemd/ write them)."""

    private_tmp: bool = True
    protect_home: str = "read-only"


@dataclass(frozen=True)
class Needed:
    """A file the service must reach: ``what`` it is (for the message), its path, and whether it
    is run (``execute``; for a directory: entered) and written (``write``) or only read."""

    what: str
    path: Path
    execute: bool = False
    write: bool = False


@dataclass(frozen=True)
class Blocked:
    """A needed file the account cannot reach, and why, in words that name the cause."""

    needed: Needed
    why: str
    #: "private_tmp", "home" (hidden or closed home directory) or "permissions".
    cause: str


def blocked_paths(needed: Sequence[Needed], account: ServiceAccount, sandbox: Sandbox) -> list[Blocked]:
    """Every needed file the account cannot reach under ``sandbox``, with the first reason found
    (the path as named, then each symbolic link's target in turn)."""
    blocked = []
    for item in needed:
        for candidate in _link_chain(item.path):
            reason = hidden_by(candidate, sandbox) or _denied(candidate, account, item.execute, item.write)
            if reason is not None:
                blocked.append(Blocked(item, *reason))
                break
    return blocked


def _link_chain(path: Path) -> Iterator[Path]:
    """The path, each symbolic link's target after it, and the fully resolved path last."""
    current = Path(os.path.abspath(path))
    seen = {current}
    yield current
    for _ in range(_MAX_LINKS):
        if not current.is_symlink():
            break
        current = Path(os.path.normpath(current.parent / os.readlink(current)))
        if current in seen:
            break
        seen.add(current)
        yield current
    resolved = path.resolve()
    if resolved not in seen:
        yield resolved


def _under(path: Path, roots: Sequence[PurePosixPath]) -> PurePosixPath | None:
    posix = PurePosixPath(path)
    return next((root for root in roots if posix == root or root in posix.parents), None)


def hidden_by(path: Path, sandbox: Sandbox) -> tuple[str, str] | None:
    """Why ``sandbox`` hides ``path`` from the service, and the cause ("private_tmp" or "home");
    None: it does not (whether the path exists or not)."""
    root = _under(path, PRIVATE_TMP_ROOTS)
    if sandbox.private_tmp and root is not None:
        return f"{path} is under {root}, which PrivateTmp=yes replaces with the service's own empty directory", "private_tmp"
    root = _under(path, HOME_ROOTS)
    if sandbox.protect_home in ("yes", "tmpfs") and root is not None:
        return f"{path} is under {root}, which ProtectHome={sandbox.protect_home} hides from the service", "home"
    return None


def _denied(path: Path, account: ServiceAccount, execute: bool, write: bool = False) -> tuple[str, str] | None:
    if account.uid == 0:
        return None
    directories = [*reversed(path.parents)]
    for directory in directories:
        try:
            info = directory.stat()
        except OSError as exc:
            return f"{directory}: {exc.strerror or exc}", "permissions"
        if not _allowed(info, account, stat.S_IXOTH):
            cause = "home" if _under(directory, HOME_ROOTS) is not None else "permissions"
            return f"{directory} is {stat.filemode(info.st_mode)} ({_owner(info)}): {account.name} cannot enter it", cause
    try:
        info = path.stat()
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}", "permissions"
    wanted = stat.S_IROTH | (stat.S_IXOTH if execute else 0) | (stat.S_IWOTH if write else 0)
    if not _allowed(info, account, wanted):
        verb = "write" if write else "run" if execute else "read"
        return f"{path} is {stat.filemode(info.st_mode)} ({_owner(info)}): {account.name} cannot {verb} it", "permissions"
    return None


def _allowed(info: os.stat_result, account: ServiceAccount, other_bits: int) -> bool:
    """The kernel's choice of one permission class: owner, else group, else others."""
    if account.uid is not None and info.st_uid == account.uid:
        shift = 6
    elif info.st_gid in account.gids:
        shift = 3
    else:
        shift = 0
    return (info.st_mode >> shift) & other_bits == other_bits


def _owner(info: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        user = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return f"owner {user}, group {group}"

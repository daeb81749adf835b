"""Whether a unit's account can reach what it runs: the command, the interpreter, tierlocal, the
engine and the files named on its command line, under the unit's sandboxing."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from .. import constants
from ..errors import UsageError
from ..serve.systemd import tierlocal_command
from ..serve.unit_access import Needed, Sandbox, ServiceAccount, blocked_paths

__all__ = ["GATEWAY_SANDBOX", "SERVE_SANDBOX", "STATE_FILES", "check_access", "path_arguments", "runtime_files"]


def runtime_files() -> list[Needed]:
    """What any tierlocal unit runs before it reads a model: the command in ExecStart=, the
    interpreter behind it, the standard library and the tierlocal package."""
    command = tierlocal_command()
    return [
        Needed("the unit's command", Path(command[0]), execute=True),
        Needed("the Python interpreter", Path(sys.executable), execute=True),
        Needed("Python's standard library", Path(os.__file__)),
        Needed("the tierlocal package", Path(constants.__file__)),
    ]


def path_arguments(args: list[str]) -> list[Needed]:
    """Files named in the serve arguments (an mmproj, a chat template file)."""
    return [
        Needed(f"{flag} {value}", Path(value))
        for flag, value in itertools.pairwise(args)
        if flag.startswith("--") and value.startswith("/") and Path(value).is_file()
    ]


#: The files a gateway keeps in its state directory that its account must be able to write.
STATE_FILES = ("gateway.sqlite3", "local.key")
#: What the units hide (systemd/*.service.in): serve reads home directories, the gateway does not see them.
SERVE_SANDBOX = Sandbox(private_tmp=True, protect_home="read-only")
GATEWAY_SANDBOX = Sandbox(private_tmp=True, protect_home="yes")


def check_access(user: str, needed: list[Needed], sandbox: Sandbox = SERVE_SANDBOX) -> None:
    """Refuse, with what to change, a unit whose account could not reach a file it names.

    Raises:
        UsageError: the first blocked file, how many more there are, and the fix for its cause.
    """
    unique = list({item.path.resolve(): item for item in reversed(needed)}.values())[::-1]  # one entry per file, its first name
    blocked = blocked_paths(unique, ServiceAccount.lookup(user), sandbox)
    if not blocked:
        return
    first = blocked[0]
    more = f" (and {len(blocked) - 1} more: {', '.join(b.needed.what for b in blocked[1:])})" if len(blocked) > 1 else ""
    hints = {
        "private_tmp": "move it out of /tmp and /var/tmp (e.g. models under /var/lib/tierlocal/models, tierlocal under /opt/tierlocal)",
        "home": (
            "install tierlocal and what it serves outside home directories (python3 -m venv /opt/tierlocal; "
            "models under /var/lib/tierlocal/models), or run the service as the account that owns them (--user NAME)"
        ),
        "permissions": f"let {user} read it (chmod o+x on each directory on the way, o+r on the file), or choose an account that can (--user NAME)",
    }
    if first.needed.write and first.cause == "permissions":
        hints["permissions"] = f"give it to the account (chown -R {user}: {first.needed.path}), or choose the account that owns it (--user NAME)"
    raise UsageError(
        f"the service account {user!r} could not reach {first.needed.what} {first.needed.path}: {first.why}{more}",
        hint=hints[first.cause] + "; or --no-access-check if an ACL or a drop-in opens it",
    )

"""A model set file (``--set FILE``, TOML) read into its members and settings, each value checked:
a one-line error names the member and the key. Pure: the parsed document comes in.

::

    [set]
    load_wait_s = 60          # how long a request waits for its member to load (then 503)

    [[model]]
    name = "chat"             # what requests give as "model" (default: the file's stem)
    source = "hf://OWNER/REPO/FILE.gguf"   # or a path, URL, or catalog name
    role = "chat"             # chat, code, embeddings, rerank
    ctx = 8192                # tokens per slot (default: --ctx, else 8192 up to the trained context)
    parallel = 2              # slots (default: --parallel)
    pinned = true             # never unloaded
    idle_unload_s = 600       # unloaded after this long unused (default: only when memory is needed)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from ..errors import UsageError
from .inputs import PlanAsk
from .model_set import MAX_MEMBERS, ROLES, SetMember

__all__ = ["SetSettings", "DEFAULT_LOAD_WAIT_S", "member_name", "members_from_sources", "parse_set_file"]

#: How long a request waits for its member to load before the set answers 503 (seconds): a
#: choice, long enough for a 10 GB file read from an NVMe disk.
DEFAULT_LOAD_WAIT_S = 120.0
_MEMBER_KEYS = {"name", "source", "role", "ctx", "parallel", "users", "pinned", "idle_unload_s"}
_SET_KEYS = {"load_wait_s"}
#: Bounds on what a set file may ask (tokens, slots, seconds).
_MAX_CTX = 1 << 24
_MAX_SLOTS = 256
_MAX_SECONDS = 30 * 86_400


@dataclass(frozen=True)
class SetSettings:
    """What a set file says of the whole set: how long a request waits for a load (seconds)."""

    load_wait_s: float = DEFAULT_LOAD_WAIT_S


def member_name(source: str) -> str:
    """The name a member is asked for by when the set does not name it: the file's stem
    (``gemma-3-270m-q4_k_m``), or the catalog name as given."""
    last = PurePosixPath(source.split("?")[0]).name
    return last.removesuffix(".gguf") if last.endswith(".gguf") else source


def members_from_sources(sources: list[str], ask: PlanAsk) -> list[SetMember]:
    """``check A B C``: each source a member named by :func:`member_name`, asked ``ask``."""
    return _unique([SetMember(member_name(source), source, ask) for source in sources])


def parse_set_file(document: Mapping[str, Any], default: PlanAsk, where: str) -> tuple[list[SetMember], SetSettings]:
    """The members of a set file's parsed TOML ``document`` (``where``: its path, for errors),
    each asked ``default`` where it says nothing.

    Raises:
        UsageError: an unknown key, a value out of range or of the wrong type, no members or too many.
    """
    unknown = sorted(set(document) - {"set", "model"})
    if unknown:
        raise UsageError(f"{where}: unknown table {unknown[0]!r}", hint="a set file has [set] and [[model]] entries")
    settings = _settings(document.get("set", {}), where)
    models = document.get("model", [])
    if not isinstance(models, list) or not models or len(models) > MAX_MEMBERS:
        raise UsageError(f"{where}: a set has 1 to {MAX_MEMBERS} [[model]] entries", hint="add one [[model]] table per member")
    return _unique([_member(entry, default, f"{where}: model {index + 1}") for index, entry in enumerate(models)]), settings


def _settings(table: object, where: str) -> SetSettings:
    if not isinstance(table, dict):
        raise UsageError(f"{where}: [set] must be a table", hint="write it as [set] with key = value lines")
    unknown = sorted(set(table) - _SET_KEYS)
    if unknown:
        raise UsageError(f"{where}: [set] has no key {unknown[0]!r}", hint=f"its keys: {', '.join(sorted(_SET_KEYS))}")
    wait = table.get("load_wait_s", DEFAULT_LOAD_WAIT_S)
    return SetSettings(load_wait_s=_seconds(wait, f"{where}: [set] load_wait_s"))


def _member(entry: object, default: PlanAsk, where: str) -> SetMember:
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be a [[model]] table", hint="write each member as a [[model]] table")
    unknown = sorted(set(entry) - _MEMBER_KEYS)
    if unknown:
        raise UsageError(f"{where}: no key {unknown[0]!r}", hint=f"a member's keys: {', '.join(sorted(_MEMBER_KEYS))}")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UsageError(f"{where}: 'source' is missing", hint="give a GGUF path, URL, hf://OWNER/REPO/FILE.gguf or a catalog name")
    name = entry.get("name", member_name(source))
    if not isinstance(name, str) or not name.strip() or len(name) > 128 or any(c.isspace() for c in name):
        raise UsageError(f"{where}: 'name' must be 1 to 128 characters without spaces", hint="requests give it as their model")
    role = entry.get("role", "chat")
    if role not in ROLES:
        raise UsageError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}", hint="say what the member serves")
    ask = replace(
        default,
        ctx=_count(entry, "ctx", _MAX_CTX, where) or default.ctx,
        up_to_training=default.up_to_training and "ctx" not in entry,
        parallel=_count(entry, "parallel", _MAX_SLOTS, where) or default.parallel,
        users=_count(entry, "users", _MAX_SLOTS, where) or default.users,
    )
    if role in ("embeddings", "rerank"):  # llama-server outputs every token of a micro-batch then (--embeddings, --reranking)
        ask = replace(ask, request=replace(ask.request, all_outputs=True))
    pinned = entry.get("pinned", False)
    if not isinstance(pinned, bool):
        raise UsageError(f"{where}: 'pinned' must be true or false", hint="pinned = true keeps it loaded")
    idle = entry.get("idle_unload_s")
    idle_s = _seconds(idle, f"{where}: idle_unload_s") if idle is not None else None
    if pinned and idle_s is not None:
        raise UsageError(f"{where}: a pinned member is never unloaded, so it takes no idle_unload_s", hint="drop one of the two")
    return SetMember(name, source, ask, role=role, pinned=pinned, idle_unload_s=idle_s)


def _count(entry: Mapping[str, object], key: str, most: int, where: str) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise UsageError(f"{where}: {key!r} must be a whole number from 1 to {most}", hint=f"for example {key} = 2")
    return value


def _seconds(value: object, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= _MAX_SECONDS:
        raise UsageError(f"{where} must be a number of seconds, more than 0 and at most {_MAX_SECONDS}", hint="for example 600")
    return float(value)


def _unique(members: list[SetMember]) -> list[SetMember]:
    names = [member.name for member in members]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UsageError(f"two members of the set are both named {repeated[0]!r}", hint="give each its own name (name = ... in --set FILE)")
    return members

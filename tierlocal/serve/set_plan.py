"""A set of models planned together on this machine (or the one --gpu/--ram describe), from the
members' headers: :func:`tierlocal.plan.model_set.plan_set` for ``tierlocal check A B C`` /
``check --set FILE`` (headers only) and for ``tierlocal serve`` of a set (local files)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..catalog import ModelEntry, catalog_reasoning_effort, find_model, load_host_defaults
from ..errors import UsageError
from ..fit.model import ModelSpec, model_spec
from ..gguf import ModelSummary, summarize
from ..hardware.types import Hardware
from ..inputs_here import plan_inputs
from ..plan.inputs import PlanAsk
from ..plan.machine import machine_for
from ..plan.model_set import SetMember, SetPlan, plan_set
from ..plan.set_file import SetSettings, members_from_sources, parse_set_file
from ..planning_cache import catalog_models
from ..recommendation import engine_version

__all__ = ["member_source", "plan_model_set", "read_set_file"]

#: The most a set file may hold (bytes): a few dozen members' lines.
_MAX_SET_FILE_BYTES = 1 << 20


def read_set_file(path: str, default: PlanAsk) -> tuple[list[SetMember], SetSettings]:
    """The members and settings of the set file at ``path`` (:mod:`tierlocal.plan.set_file`).

    Raises:
        UsageError: it cannot be read, is not TOML, or says something a set cannot be.
    """
    file = Path(path)
    try:
        if file.stat().st_size > _MAX_SET_FILE_BYTES:
            raise UsageError(f"{path}: a set file of more than {_MAX_SET_FILE_BYTES} bytes", hint="a set file lists a few [[model]] tables")
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})", hint="give the path of a set file (TOML)") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a TOML file ({exc})", hint="see docs/model-sets.md for the format") from exc
    return parse_set_file(document, default, path)


def plan_model_set(
    sources: tuple[str, ...], set_file: str | None, hardware: Hardware, default: PlanAsk, *, local: Callable[[str], Path] | None = None
) -> tuple[SetPlan, SetSettings]:
    """The joint plan of ``sources`` (or of ``set_file``'s members), each asked ``default``
    where it says nothing, on ``hardware``; with ``local``, each member's source is first made a
    local file by it (serve: the path its command names).

    Raises:
        UsageError: a member is neither a GGUF source nor a catalog model, or the set is malformed.
    """
    if set_file is not None and sources:
        raise UsageError("give the set's models as SOURCES or in --set FILE, not both", hint="list every member in the set file")
    members, settings = read_set_file(set_file, default) if set_file is not None else (members_from_sources(list(sources), default), SetSettings())
    machine = machine_for(hardware, load_host_defaults())
    where = plan_inputs(machine, engine_version(), host_is_here=not hardware.ram_overridden)
    members = [replace(member, reasoning_effort=catalog_reasoning_effort(member.source)) for member in members]
    if local is not None:
        members = [replace(member, source=str(local(member_source(member.source)))) for member in members]
    headed = [_pooled(member, *_header(member.source, machine.max_tensor_bytes is None)) for member in members]
    try:
        return plan_set(headed, where), settings
    except ValueError as exc:
        raise UsageError(str(exc), hint="give each member its own name") from exc


def _pooled(member: SetMember, spec: ModelSpec, summary: ModelSummary, path: str) -> tuple[SetMember, ModelSpec, ModelSummary, str]:
    """``member`` as its file says it serves: a chat member whose header names a pooling (an
    embedding model's: 1 mean, 2 cls, 3 last; 4 rank, a reranker's) is that role instead."""
    role = summary.pooled_role
    if member.role != "chat" or role is None:
        return member, spec, summary, path
    ask = replace(member.ask, request=replace(member.ask.request, all_outputs=True))
    return replace(member, role=role, ask=ask), spec, summary, path


def _header(source: str, from_digests: bool) -> tuple[ModelSpec, ModelSummary, str]:
    """A member's spec and summary from its header, and the path its command names."""
    from ..fetch.sources import read_headers  # the hub's client loads only when a file is read

    entry = _catalog_entry(source)
    if entry is not None:
        spec, summary = catalog_models([entry], from_digests=from_digests)[entry.key]
        return spec, summary, f"<{entry.family}-{entry.quant}.gguf after tierlocal pull>"
    if "/" not in source and not source.endswith(".gguf"):
        raise UsageError(f"{source!r} is neither a catalog model nor a GGUF path", hint="see `tierlocal catalog list`, or give a path or hf:// file")
    headers = read_headers(source)
    remote = source.startswith(("http://", "https://", "hf://"))
    return model_spec(headers), summarize(headers), "<path after tierlocal pull>" if remote else source


def member_source(source: str) -> str:
    """What a member's source is fetched or served as: a catalog family becomes the entry the
    set plans (``family:quant``), anything else is itself."""
    entry = _catalog_entry(source)
    return entry.key if entry is not None else source


def _catalog_entry(source: str) -> ModelEntry | None:
    """The catalog entry a member names: ``family:quant`` exactly, or a family at Q4_K_M where
    it has one, else its smallest file (a set plans its members as named, with no ranking)."""
    if "/" in source or source.endswith(".gguf"):
        return None
    entries = [entry for entry in find_model(source) if entry.header_file is not None]
    if not entries:
        return None
    preferred = [entry for entry in entries if entry.quant.upper() == "Q4_K_M"]
    return (preferred or sorted(entries, key=lambda entry: entry.file_bytes))[0]

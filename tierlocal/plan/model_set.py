"""A set of models on one machine, planned together (``tierlocal check A B C``, ``--set FILE``).
Pure: the members' specs and the machine come in as arguments.

Each member is planned by :func:`~tierlocal.plan.source.check_model`, the one estimator, against
the memory the others leave: the pinned members (always resident) in the order given, each
beside the ones before it; then every on-demand member beside all the pinned ones, since a
member loaded on demand may first unload the other on-demand members but never a pinned one.
Every member's process pays its own runtime (its GPU context, the engine's own RAM): that is
inside its figures. The safety margin is kept once per device, not once per member.

A member's bytes on the host are what the kernel counts while it serves
(:attr:`~tierlocal.fit.host_memory.HostMemory.in_use_bytes`): with mmap the mapped file beside
the CPU's repacked copy, so a member that fits only without mmap is loaded with
``--load-mode none``. The prompt cache (``--cache-ram``) of each member gets an equal share of
what the largest resident group leaves, so saved prompts never push the set past the plan.

Which members may be resident together is every combination that may occur, not only the first:
each group of on-demand members beside the pinned ones is checked device by device.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..engines.flags import planned_command, reasoning_flags, role_flags
from ..fit.estimate import Machine
from ..fit.host_memory import PROMPT_CACHE_DEFAULT_BYTES
from ..fit.model import ModelSpec
from ..fit.split import split_ratio
from ..gguf import ModelSummary
from .inputs import PlanAsk, PlanInputs
from .source import SourceCheck, check_model

__all__ = ["ROLES", "MAX_MEMBERS", "SetMember", "MemberPlan", "SetPlan", "plan_set"]

#: What a member is for: the endpoint its requests use.
ROLES = ("chat", "code", "embeddings", "rerank")
#: The most members a set may have: every group of them is checked (2^12 groups at most).
MAX_MEMBERS = 12


@dataclass(frozen=True)
class SetMember:
    """One model of a set, as asked: the ``name`` requests give as ``model``, its ``source``
    (path, URL, hf:// file or catalog name), what it is for, the plan asked of it, whether it
    stays loaded (``pinned``) and after how long unused it is unloaded (seconds; None: only
    when another member needs its memory)."""

    name: str
    source: str
    ask: PlanAsk
    role: str = "chat"
    pinned: bool = False
    idle_unload_s: float | None = None
    #: A catalog model's reasoning effort (gpt-oss: high, the effort of its figures), which its
    #: command asks for (``--reasoning-effort``); None: the chat template's default.
    reasoning_effort: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "source": self.source,
            "role": self.role,
            "pinned": self.pinned,
            "idle_unload_s": self.idle_unload_s,
            "ctx": self.ask.ctx,
            "parallel": self.ask.parallel,
        }


@dataclass(frozen=True)
class MemberPlan:
    """One member planned beside the pinned members: its plan, its bytes per device (the GPUs
    in order, then the host, in use), how it loads, its prompt-cache share (bytes) and, when
    sharing changed the plan it would have alone, what changed."""

    member: SetMember
    check: SourceCheck
    device_bytes: tuple[int, ...]
    load_mode: str
    cache_ram_bytes: int
    #: The file the command names (a placeholder for one not pulled yet).
    model_path: str
    shrunk: str | None = None

    @property
    def command(self) -> tuple[str, ...]:
        """The member's llama-server command: its plan, its prompt-cache share, its load mode."""
        estimate = self.check.estimate
        if estimate is None:
            return ()
        template = self.check.template.engine_args
        command = planned_command(
            self.model_path, estimate, host_only=self.check.host_only, template_args=template, cache_ram_bytes=self.cache_ram_bytes
        )
        roles = role_flags(self.member.role, pooled=self.check.pooled_role is not None)
        effort = reasoning_flags("thinking", effort=self.member.reasoning_effort, switch=False) if self.member.role in ("chat", "code") else ()
        return (*command, *roles, *effort, *(("--load-mode", "none") if self.load_mode == "none" else ()))

    @property
    def fits(self) -> bool:
        return self.check.estimate is not None and self.check.estimate.fits and self.load_mode != ""

    @property
    def reason(self) -> str | None:
        if self.fits:
            return None
        if self.check.estimate is not None and self.check.estimate.fits:
            return "its RAM in use does not fit beside the pinned members, with or without mmap"
        return self.check.reason or "does not fit beside the pinned members"

    def to_json(self) -> dict[str, object]:
        return {
            **self.member.to_json(),
            "fits": self.fits,
            "reason": self.reason,
            "device_bytes": list(self.device_bytes),
            "load_mode": self.load_mode or None,
            "cache_ram_bytes": self.cache_ram_bytes,
            "command": list(self.command),
            "shrunk": self.shrunk,
            "plan": self.check.to_json(),
        }


@dataclass(frozen=True)
class SetPlan:
    """The joint plan: each member's, the devices' budgets (bytes free less the margin, the
    GPUs in order, then the host), the largest groups that may be resident together (pinned
    members in every one), and the count of members that always fit together whichever they are
    (``max_resident``: an eviction by count at this bound never over-commits)."""

    members: tuple[MemberPlan, ...]
    device_names: tuple[str, ...]
    budget_bytes: tuple[int, ...]
    resident_groups: tuple[tuple[str, ...], ...]
    max_resident: int
    margin_bytes: int

    @property
    def fits(self) -> bool:
        """Every member can load (beside the pinned ones, unloading others if it must)."""
        return bool(self.members) and all(member.fits for member in self.members)

    @property
    def all_resident(self) -> bool:
        """Every member fits at once: nothing is ever unloaded for memory."""
        return self.fits and len(self.resident_groups) == 1 and len(self.resident_groups[0]) == len(self.members)

    def resident_bytes(self, names: tuple[str, ...]) -> tuple[int, ...]:
        """What the members ``names`` hold together, per device (bytes)."""
        chosen = [m for m in self.members if m.member.name in names]
        return tuple(sum(m.device_bytes[i] for m in chosen) for i in range(len(self.device_names)))

    def to_json(self) -> dict[str, object]:
        return {
            "fits": self.fits,
            "all_resident": self.all_resident,
            "max_resident": self.max_resident,
            "margin_bytes": self.margin_bytes,
            "devices": [{"name": n, "budget_bytes": b} for n, b in zip(self.device_names, self.budget_bytes, strict=True)],
            "resident_groups": [{"members": list(group), "device_bytes": list(self.resident_bytes(group))} for group in self.resident_groups],
            "members": [member.to_json() for member in self.members],
        }


def plan_set(members: list[tuple[SetMember, ModelSpec, ModelSummary, str]], where: PlanInputs) -> SetPlan:
    """Plan ``members`` (each with its header's spec and summary, and the path its command names)
    together on ``where`` (module docstring)."""
    if not members or len(members) > MAX_MEMBERS:
        raise ValueError(f"a model set has 1 to {MAX_MEMBERS} members, not {len(members)}")
    names = [member.name for member, *_ in members]
    if len(set(names)) != len(names):
        raise ValueError(f"two members of the set share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    machine = where.machine
    budget = tuple(free - machine.margin_bytes for free in _free_bytes(machine))
    planned: dict[str, MemberPlan] = {}
    pinned_bytes = tuple(0 for _ in budget)
    for member, spec, summary, path in (m for m in members if m[0].pinned):
        planned[member.name] = _member_plan(member, spec, summary, path, where, pinned_bytes)
        if planned[member.name].fits:
            pinned_bytes = _added(pinned_bytes, planned[member.name].device_bytes)
    for member, spec, summary, path in (m for m in members if not m[0].pinned):
        planned[member.name] = _member_plan(member, spec, summary, path, where, pinned_bytes)
    ordered = [planned[name] for name in names]
    groups, max_resident = _resident_groups(ordered, budget)
    ordered = _with_cache_shares(ordered, budget, groups)
    return SetPlan(tuple(ordered), _device_names(machine), budget, groups, max_resident, machine.margin_bytes)


def _member_plan(member: SetMember, spec: ModelSpec, summary: ModelSummary, path: str, where: PlanInputs, taken: tuple[int, ...]) -> MemberPlan:
    """``member`` planned on what ``taken`` (bytes per device) leaves of ``where``'s machine."""
    left = replace(where, machine=_less(where.machine, taken))
    check = check_model(member.source, spec, summary, left, member.ask, model_path=path)
    alone = check_model(member.source, spec, summary, where, member.ask, model_path=path, detail=False) if any(taken) else check
    mode, host = _load_mode(check, left.machine)
    gpus = _gpu_bytes(check, len(_device_names(where.machine)) - 1)
    return MemberPlan(member, check, (*gpus, host), mode, 0, path, _shrunk(alone, check))


def _load_mode(check: SourceCheck, machine: Machine) -> tuple[str, int]:
    """How the member loads (``mmap``; ``none`` when only that fits the RAM left; ``""``: neither
    does) and its host bytes in use that way."""
    modes = {memory.load_mode: memory.in_use_bytes for memory in check.host_memory}
    if not modes:
        return "", 0
    room = machine.host_free_bytes - machine.margin_bytes
    for mode in ("mmap", "none"):
        if mode in modes and modes[mode] <= room:
            return mode, modes[mode]
    return "", modes.get("mmap", 0)


def _gpu_bytes(check: SourceCheck, gpus: int) -> tuple[int, ...]:
    """The member's bytes on each GPU (0 where the plan keeps it on the CPU)."""
    estimate = check.estimate
    if estimate is None or check.host_only:
        return tuple(0 for _ in range(gpus))
    return tuple(device.total_needed_bytes for device in estimate.devices[:-1])


def _shrunk(alone: SourceCheck, shared: SourceCheck) -> str | None:
    """What sharing the machine changed in a member's plan (context, slots, GPU layers), if anything."""
    if alone.estimate is None or shared.estimate is None:
        return None
    was, now = alone.estimate, shared.estimate
    changes = []
    if now.params.n_ctx_seq != was.params.n_ctx_seq:
        changes.append(f"context {was.params.n_ctx_seq} → {now.params.n_ctx_seq} tokens per slot")
    if now.params.n_seq_max != was.params.n_seq_max:
        changes.append(f"slots {was.params.n_seq_max} → {now.params.n_seq_max}")
    if now.layers_offloaded != was.layers_offloaded:
        changes.append(f"GPU layers {was.layers_offloaded} → {now.layers_offloaded}")
    return "beside the pinned members: " + ", ".join(changes) if changes else None


def _resident_groups(members: list[MemberPlan], budget: tuple[int, ...]) -> tuple[tuple[tuple[str, ...], ...], int]:
    """The largest groups that fit together (every pinned member in each) and the count every
    group of that many fits at (pinned members included)."""
    pinned = [m for m in members if m.member.pinned and m.fits]
    loose = [m for m in members if not m.member.pinned and m.fits]
    base = _added(*(m.device_bytes for m in pinned)) if pinned else tuple(0 for _ in budget)

    def fits(group: tuple[int, ...]) -> bool:
        used = _added(base, *(loose[i].device_bytes for i in group))
        return all(u <= b for u, b in zip(used, budget, strict=True))

    indices = range(len(loose))
    fitting = [frozenset(g) for k in range(len(loose) + 1) for g in itertools.combinations(indices, k) if fits(g)]
    largest = [g for g in fitting if not any(g < other for other in fitting)]
    every = max((k for k in range(len(loose) + 1) if all(fits(g) for g in itertools.combinations(indices, k))), default=0)
    order = {m.member.name: i for i, m in enumerate(members)}
    pinned_names = [m.member.name for m in pinned]
    groups = sorted(
        (tuple(sorted(pinned_names + [loose[i].member.name for i in g], key=order.__getitem__)) for g in largest),
        key=lambda names: (-len(names), [order[n] for n in names]),
    )
    return tuple(groups), len(pinned) + every


def _with_cache_shares(members: list[MemberPlan], budget: tuple[int, ...], groups: tuple[tuple[str, ...], ...]) -> list[MemberPlan]:
    """Each member's prompt cache (``--cache-ram``, whole MiB, at most the engine's default): an
    equal share of what the host has left beside the resident group that holds the most."""
    by_name = {m.member.name: m for m in members}
    host_used = max((sum(by_name[n].device_bytes[-1] for n in group) for group in groups), default=0)
    most = max((len(group) for group in groups), default=1)
    share = min(max(budget[-1] - host_used, 0) // most, PROMPT_CACHE_DEFAULT_BYTES) // 2**20 * 2**20
    return [replace(member, cache_ram_bytes=share) if member.check.estimate is not None else member for member in members]


def _device_names(machine: Machine) -> tuple[str, ...]:
    """The devices a set is planned on: the GPUs in order, then the host."""
    if machine.gpu_devices:
        return (*(device.name for device in machine.gpu_devices), "host")
    return (machine.gpu_name, "host") if machine.gpu_name is not None else ("host",)


def _free_bytes(machine: Machine) -> tuple[int, ...]:
    """Each device's free bytes, in :func:`_device_names` order."""
    if machine.gpu_devices:
        return (*(device.free_bytes for device in machine.gpu_devices), machine.host_free_bytes)
    return (machine.gpu_free_bytes, machine.host_free_bytes) if machine.gpu_name is not None else (machine.host_free_bytes,)


def _less(machine: Machine, taken: tuple[int, ...]) -> Machine:
    """``machine`` with ``taken`` bytes per device already held by other members (a split
    across GPUs follows what each has free then, as llama.cpp's default does)."""
    if not any(taken):
        return machine
    host_free = max(machine.host_free_bytes - taken[-1], 0)
    if machine.gpu_devices:
        devices = tuple(replace(d, free_bytes=max(d.free_bytes - t, 0)) for d, t in zip(machine.gpu_devices, taken, strict=False))
        free = sum(d.free_bytes for d in devices)
        return replace(
            machine, gpu_devices=devices, gpu_free_bytes=free, tensor_split=split_ratio([d.free_bytes for d in devices]), host_free_bytes=host_free
        )
    if machine.gpu_name is not None:
        return replace(machine, gpu_free_bytes=max(machine.gpu_free_bytes - taken[0], 0), host_free_bytes=host_free)
    return replace(machine, host_free_bytes=host_free)


def _added(*vectors: tuple[int, ...]) -> tuple[int, ...]:
    """Bytes per device, summed."""
    return tuple(sum(values) for values in zip(*vectors, strict=True))

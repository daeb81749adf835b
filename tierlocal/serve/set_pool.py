"""The members of a served model set, each a ``tierlocal serve`` process of its own (so every load
is planned, started, checked against its plan and supervised as one serve is), loaded on demand
and unloaded by bytes.

A member loads when a request asks for it. If its bytes do not fit beside what is resident —
every device, against the joint plan's budget (:class:`~tierlocal.plan.model_set.SetPlan`) — the
least recently used members are unloaded first: never a pinned one, never one with requests in
flight. A member that is loading or unloading still counts as resident, so the members' planned
bytes together never exceed the budget. A member with an idle time is unloaded once unused that
long. Every load, unload and wait is an event (:attr:`SetPool.events`) and a count.

Threads, not the event loop: a load blocks its caller (the front runs it in a worker thread).
Every serve is started from one thread that lives as long as the pool: the kernel's
parent-death signal (which stops a member whose supervisor dies) fires when the *thread* that
started it ends, so a thread per load would stop each member as soon as it loaded.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import constants
from ..engines.process import EngineChild, start_child
from ..errors import MemberLoadFailed
from ..plan.model_set import MemberPlan, SetPlan
from ..plan.verify import TOTAL_TOLERANCE, TOTAL_TOLERANCE_BYTES
from .port import free_loopback_port
from .state import ServeState, running_servers

__all__ = ["Member", "SetPool", "LoadWaitExceeded", "LOADED", "LOADING", "UNLOADED", "UNLOADING"]

LOADED, LOADING, UNLOADING, UNLOADED = "loaded", "loading", "unloading", "unloaded"
#: Events kept in memory for ``/set`` and ``status``.
MAX_EVENTS = 1000
#: How often a load in progress checks for its serve's state file (seconds).
_POLL_S = 0.2


class LoadWaitExceeded(Exception):
    """A request waited its bound for its member to load: control flow between the pool and the
    front, which answers 503 with ``Retry-After`` (never shown as an error of a command)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


@dataclass
class Member:
    """One member as it runs: its plan, state, the serve process and port while resident, its
    requests in flight, when it was last used (monotonic seconds) and its loads and failures."""

    plan: MemberPlan
    state: str = UNLOADED
    port: int | None = None
    child: EngineChild | None = None
    serve: ServeState | None = None
    in_flight: int = 0
    last_used: float = 0.0
    loads: int = 0
    failures: int = 0
    error: str | None = None
    loaded_s: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.plan.member.name

    @property
    def resident(self) -> bool:
        """Holding (or about to hold, or still holding) its memory."""
        return self.state in (LOADED, LOADING, UNLOADING)


class SetPool:
    """The set's members on this machine (module docstring). ``argv_for(member, port)`` is the
    ``tierlocal serve`` command that runs a member on ``port``; ``load_timeout_s`` bounds a load."""

    def __init__(self, plan: SetPlan, argv_for: Callable[[MemberPlan, int], list[str]], *, load_timeout_s: float, log_dir: Path) -> None:
        self.plan = plan
        self.members = {member.member.name: Member(member) for member in plan.members if member.fits}
        self._argv_for = argv_for
        self._load_timeout_s = load_timeout_s
        self._log_dir = log_dir
        self._cond = threading.Condition()
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self.counts: collections.Counter[str] = collections.Counter()
        self.started = time.time()
        #: Called after every event, with the pool's lock held (re-entrant): the state file is written then.
        self.on_change: Callable[[], None] | None = None
        self._loads: queue.Queue[tuple[Member, list[Member]]] = queue.Queue()
        self._loader = threading.Thread(target=self._load_each, name="set-loader", daemon=True)
        self._loader.start()

    def acquire(self, name: str, wait_s: float) -> Member:
        """``name`` loaded and counted in flight (:meth:`release` when done), loading it — and
        unloading others for its memory — if it must; waits at most ``wait_s`` seconds.

        Raises:
            KeyError: no member of that name.
            LoadWaitExceeded: it did not load in time (still loading, or memory is held by requests in flight).
            MemberLoadFailed: its load failed.
        """
        deadline = time.monotonic() + wait_s
        with self._cond:
            member = self.members[name]
            failures, waited = member.failures, False
            while True:
                self._notice_exit(member)
                if member.state == LOADED:
                    member.in_flight += 1
                    member.last_used = time.monotonic()
                    return member
                if member.failures != failures:
                    raise MemberLoadFailed(f"{name} did not load: {member.error}", hint="see its serve log (tierlocal status)")
                if member.state == UNLOADED:
                    victims = self._victims_for(member)
                    if victims is not None:
                        self._begin_load(member, victims)
                left = deadline - time.monotonic()
                if left <= 0:
                    self._event("wait_exceeded", name, waited_s=round(wait_s, 3), state=member.state)
                    raise LoadWaitExceeded(f"{name} is {member.state} (waited {wait_s:g} s)", hint="retry, or raise load_wait_s")
                if not waited:
                    self._event("waiting", name, state=member.state)
                    waited = True
                self._cond.wait(left)

    def release(self, member: Member) -> None:
        """A request to ``member`` is done."""
        with self._cond:
            member.in_flight -= 1
            member.last_used = time.monotonic()
            self._cond.notify_all()

    def load_pinned(self) -> None:
        """Load every pinned member, one after the other.

        Raises:
            MemberLoadFailed: one did not load.
        """
        for member in [m for m in self.members.values() if m.plan.member.pinned]:
            self.release(self.acquire(member.name, self._load_timeout_s + 5))

    def unload_idle(self) -> None:
        """Unload each member unused for its idle time (not pinned, nothing in flight); a member
        whose serve exited on its own frees its place here too (called every second)."""
        now = time.monotonic()
        with self._cond:
            for member in self.members.values():
                self._notice_exit(member)
            idle = [
                m
                for m in self.members.values()
                if m.state == LOADED
                and m.in_flight == 0
                and m.plan.member.idle_unload_s is not None
                and now - m.last_used >= m.plan.member.idle_unload_s
            ]
            for member in idle:
                member.state = UNLOADING
        for member in idle:
            self._unload(member, "idle")

    def stop_all(self) -> None:
        """Stop every member's serve (on shutdown)."""
        with self._cond:
            resident = [m for m in self.members.values() if m.child is not None]
            for member in resident:
                member.state = UNLOADING
        for member in resident:
            self._unload(member, "shutdown")

    def resident_bytes(self) -> tuple[int, ...]:
        """What the resident members' plans hold, per device (bytes)."""
        with self._cond:
            return self._held()

    def snapshot(self) -> dict[str, Any]:
        """The members as they are now, the counts and the last events (``/set``)."""
        now = time.monotonic()
        with self._cond:
            members = [_member_json(m, now) for m in self.members.values()]
            return {
                "devices": list(self.plan.device_names),
                "budget_bytes": list(self.plan.budget_bytes),
                "resident_bytes": list(self._held()),
                "members": members,
                "counts": dict(self.counts),
                "events": list(self.events),
            }

    def _held(self) -> tuple[int, ...]:
        held = [0] * len(self.plan.budget_bytes)
        for member in self.members.values():
            if member.resident:
                held = [h + b for h, b in zip(held, member.plan.device_bytes, strict=True)]
        return tuple(held)

    def _victims_for(self, member: Member) -> list[Member] | None:
        """The members to unload so ``member`` fits, least recently used first ([]: it fits now;
        None: it cannot fit until requests in flight end or loads finish)."""
        held = list(self._held())

        def fits() -> bool:
            return all(h + b <= budget for h, b, budget in zip(held, member.plan.device_bytes, self.plan.budget_bytes, strict=True))

        if fits():
            return []
        victims = []
        candidates = [m for m in self.members.values() if m.state == LOADED and not m.plan.member.pinned and m.in_flight == 0]
        for candidate in sorted(candidates, key=lambda m: m.last_used):
            victims.append(candidate)
            held = [h - b for h, b in zip(held, candidate.plan.device_bytes, strict=True)]
            if fits():
                return victims
        return None

    def _begin_load(self, member: Member, victims: list[Member]) -> None:
        member.state = LOADING
        for victim in victims:
            victim.state = UNLOADING
        self._loads.put((member, victims))

    def _load_each(self) -> None:
        """The loader thread: each load in turn, for the pool's life."""
        while True:
            member, victims = self._loads.get()
            try:
                self._load(member, victims)
            except Exception as exc:  # a load that broke frees its place and says why; the loader goes on
                with self._cond:
                    member.state, member.child, member.port, member.serve = UNLOADED, None, None, None
                    member.failures += 1
                    member.error = f"{type(exc).__name__}: {exc}"
                    self._event("load_failed", member.name, error=member.error)
                    self._cond.notify_all()

    def _load(self, member: Member, victims: list[Member]) -> None:
        for victim in victims:
            self._unload(victim, "memory", for_member=member.name)
        port = free_loopback_port()
        with self._cond:
            self._event("load_start", member.name, port=port, resident_bytes=list(self._held()))
        started = time.monotonic()
        log = self._log_dir / f"set-member-{member.name}-{port}.log"
        # A member's serve is on loopback behind the set: it claims no readiness for the unit and takes none of its credentials.
        env = {k: v for k, v in constants.child_environment().items() if k != "CREDENTIALS_DIRECTORY"}
        child = start_child(self._argv_for(member.plan, port), log, env=env)
        state, problem = self._wait_verified(child, port, member.plan)
        seconds = time.monotonic() - started
        if state is None:
            child.stop()
        with self._cond:
            if state is None:
                member.state, member.child, member.port, member.serve = UNLOADED, None, None, None
                member.failures += 1
                member.error = problem
                self._event("load_failed", member.name, seconds=round(seconds, 3), error=problem)
            else:
                member.state, member.child, member.port, member.serve = LOADED, child, port, state
                member.loads += 1
                member.loaded_s.append(seconds)
                member.last_used = time.monotonic()
                self._event("loaded", member.name, seconds=round(seconds, 3), port=port, engine_pid=state.engine_pid)
            self._cond.notify_all()

    def _wait_verified(self, child: EngineChild, port: int, plan: MemberPlan) -> tuple[ServeState | None, str]:
        """The member's serve state once it has checked its load against its plan, or why not."""
        deadline = time.monotonic() + self._load_timeout_s
        while time.monotonic() < deadline:
            states = running_servers(port)
            if states:
                problem = _differs(plan, states[0])
                return (None, problem) if problem else (states[0], "")
            if child.process.poll() is not None:
                child.wait_output()
                error = next((line for line in reversed(child.lines()) if line.startswith("error: ")), "")
                return None, error.removeprefix("error: ") or f"its serve exited ({child.process.returncode})"
            time.sleep(_POLL_S)
        return None, f"not ready in {self._load_timeout_s:g} s"

    def _unload(self, member: Member, reason: str, **details: object) -> None:
        """Stop ``member``'s serve (marked unloading by the caller) and free its place."""
        child = member.child
        if child is not None:
            child.stop()
        with self._cond:
            member.state, member.child, member.port, member.serve = UNLOADED, None, None, None
            self._event("unloaded", member.name, reason=reason, **details)
            self._cond.notify_all()

    def _notice_exit(self, member: Member) -> None:
        """A loaded member whose serve exited is unloaded: a pinned one is loaded again at once,
        any other on its next request."""
        if member.state == LOADED and member.child is not None and member.child.process.poll() is not None:
            member.state, member.child, member.port, member.serve = UNLOADED, None, None, None
            member.error = "its serve exited"
            self._event("exited", member.name)
            victims = self._victims_for(member) if member.plan.member.pinned else None
            if victims is not None:
                self._begin_load(member, victims)
            self._cond.notify_all()

    def _event(self, kind: str, name: str, **details: object) -> None:
        self.counts[kind] += 1
        self.events.append({"time": round(time.time(), 3), "event": kind, "member": name, **details})
        if self.on_change is not None:
            self.on_change()


def _idle_past(member: Member, now: float) -> bool:
    """Whether ``member`` has been unused for its idle time (it has one)."""
    idle = member.plan.member.idle_unload_s
    return idle is not None and now - member.last_used >= idle


def _differs(plan: MemberPlan, state: ServeState) -> str:
    """How the member's load departs from the set's plan ("" when it does not): its serve planned
    another context, slot count or GPU layers, its load did not hold its own plan, or llama.cpp
    allocated more on a device than the set counts for the member there (the host's figure is the
    RAM in use, the CPU's repacked weights included)."""
    asked = plan.check.estimate
    if asked is None:
        return "the set has no plan for it"
    request, delta = state.request, state.delta
    wanted = {"ctx": asked.params.n_ctx_padded, "parallel": asked.params.n_seq_max, "ngl": asked.request.ngl}
    got = {key: request.get(key) for key in wanted}
    wrong = [f"{key} {got[key]} (the set planned {value})" for key, value in wanted.items() if got[key] != value]
    if wrong:
        return "its serve planned " + ", ".join(wrong)
    if delta.get("verified") is False:
        return "its load did not hold its plan: " + "; ".join(str(p) for p in delta.get("problems") or [])
    devices = [d for d in delta.get("devices") or [] if isinstance(d, dict)]
    over = [
        f"{d.get('name')}: {int(d.get('actual_bytes') or 0) / 2**20:.0f} MiB allocated, the set counts {counted / 2**20:.0f} MiB"
        for d, counted in zip(devices, _counted_like(devices, plan.device_bytes), strict=False)
        if int(d.get("actual_bytes") or 0) > counted + max(TOTAL_TOLERANCE * counted, TOTAL_TOLERANCE_BYTES)
    ]
    return "llama.cpp allocated more than the set planned — " + "; ".join(over) if over else ""


def _counted_like(devices: list[dict[str, Any]], device_bytes: tuple[int, ...]) -> list[int]:
    """The set's bytes in the order of the load's devices: the GPUs in order, the host last."""
    gpus, host = list(device_bytes[:-1]), device_bytes[-1]
    counted = []
    for device in devices:
        on_host = "host" in str(device.get("name", "")).lower() or "cpu" in str(device.get("name", "")).lower()
        counted.append(host if on_host or not gpus else gpus.pop(0))
    return counted


def _member_json(member: Member, now: float) -> dict[str, Any]:
    asked = member.plan.member
    idle = asked.idle_unload_s
    unused = now - member.last_used if member.state == LOADED else None
    return {
        "name": member.name,
        "role": asked.role,
        "pinned": asked.pinned,
        "state": member.state,
        "url": f"http://127.0.0.1:{member.port}" if member.port else None,
        "engine_pid": member.serve.engine_pid if member.serve else None,
        "planned_bytes": list(member.plan.device_bytes),
        "in_flight": member.in_flight,
        "idle_s": None if unused is None else round(unused, 1),
        "unloads_in_s": None if unused is None or idle is None or member.in_flight else round(max(idle - unused, 0.0), 1),
        "loads": member.loads,
        "load_s": [round(s, 3) for s in member.loaded_s[-8:]],
        "error": member.error,
    }

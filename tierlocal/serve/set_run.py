"""``tierlocal serve A B C`` / ``serve --set FILE``: a model set planned together, run as a pool of
``tierlocal serve`` processes (:mod:`.set_pool`) behind one endpoint (:mod:`.set_front`) until
SIGTERM or Ctrl-C. Pinned members load before the endpoint says it is ready; the others load on
their first request.

Why a pool of serves and not llama-server's router mode (``--models-max``): the router evicts by
count, least recently used (tools/server/server-models.cpp), so a 20 GB and a 1 GB member count
the same and a count safe for every group wastes the memory a byte budget would use; it has no
pinned member; and its children's load logs reach tierlocal only as forwarded lines of one
stream. A pool of serves evicts by the joint plan's bytes, never unloads a pinned member or one
with requests in flight, and checks every load — a first load, a reload after an eviction or an
idle unload — against its plan exactly as one serve does, with the same no-orphan guarantee.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import constants
from ..errors import TierlocalError
from ..plan.model_set import MemberPlan, SetPlan
from ..plan.set_file import SetSettings
from .set_front import set_app
from .set_pool import SetPool
from .state import set_state_path, write_set_state
from .systemd import notify

__all__ = ["SetServe", "member_argv", "run_set"]

#: How often idle members are looked for (seconds).
_IDLE_CHECK_S = 1.0


@dataclass(frozen=True)
class SetServe:
    """How a planned set is run: where its endpoint listens, the keys it takes (none: loopback),
    the options each member's serve gets besides its plan (``--llama-server``, ``--threads``,
    ``--gpu``), and the bound on one load (seconds)."""

    host: str
    port: int
    api_keys: frozenset[str]
    member_options: tuple[str, ...]
    load_timeout_s: float


def member_argv(member: MemberPlan, port: int, options: tuple[str, ...]) -> list[str]:
    """The ``tierlocal serve`` command that runs ``member`` on loopback ``port`` exactly as the set
    planned it: its context, slots, GPU layers, cache types, prompt-cache share and load mode."""
    estimate = member.check.estimate
    assert estimate is not None, "a member that fits has an estimate"
    request, params = estimate.request, estimate.params
    argv = [sys.executable, "-m", "tierlocal", "serve", member.member.source, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--ctx", str(request.ctx // params.n_seq_max), "--parallel", str(params.n_seq_max), "--ngl", str(request.ngl or 0)]
    argv += ["--cache-type-k", request.cache_type_k, "--cache-type-v", request.cache_type_v, "--ubatch", str(request.n_ubatch)]
    argv += ["--flash-attn", "on" if request.flash_attn else "off"]
    argv += ["--n-cpu-moe", str(request.n_cpu_moe)] if request.n_cpu_moe else []
    argv += ["--users", str(params.n_seq_max)] if params.kv_unified and params.n_seq_max > 1 else []
    argv += ["--role", member.member.role] if member.member.role != "chat" else []
    argv += [*options, "--", "--cache-ram", str(member.cache_ram_bytes // 2**20), "--alias", member.member.name]
    return argv + (["--load-mode", "none"] if member.load_mode == "none" else [])


def run_set(plan: SetPlan, settings: SetSettings, how: SetServe, *, say: Callable[[str], None], on_ready: Callable[[dict[str, Any]], None]) -> int:
    """Serve ``plan`` as ``how`` says until SIGTERM or SIGINT; returns the exit code.

    Raises:
        TierlocalError: a member cannot load beside the pinned ones, or a pinned one failed to load.
    """
    if not plan.fits:
        missing = "; ".join(f"{m.member.name}: {m.reason}" for m in plan.members if not m.fits)
        raise TierlocalError(f"the set does not fit this machine ({missing}); nothing was started", hint="see `tierlocal check` with the same set")
    pool = SetPool(
        plan, lambda member, port: member_argv(member, port, how.member_options), load_timeout_s=how.load_timeout_s, log_dir=constants.run_dir()
    )
    try:
        return asyncio.run(_serve(pool, settings, how, say, on_ready))
    finally:
        pool.stop_all()


async def _serve(pool: SetPool, settings: SetSettings, how: SetServe, say: Callable[[str], None], on_ready: Callable[[dict[str, Any]], None]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(set_app(pool, load_wait_s=settings.load_wait_s, api_keys=how.api_keys), access_log=None)
    await runner.setup()
    pool.on_change = lambda: _write_state(pool, how)
    try:
        await web.TCPSite(runner, how.host, how.port).start()
        pinned = [m.name for m in pool.members.values() if m.plan.member.pinned]
        if pinned:
            say(f"loading the pinned member(s) {', '.join(pinned)}")
            await asyncio.to_thread(pool.load_pinned)
        _write_state(pool, how)
        on_ready(pool.snapshot())
        notify("READY=1", f"STATUS=serving a set of {len(pool.members)} models on {how.host}:{how.port}")
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), _IDLE_CHECK_S)
            except TimeoutError:
                await asyncio.to_thread(pool.unload_idle)
                _write_state(pool, how)
        say("stopping the set")
        return 0
    finally:
        await runner.cleanup()
        await asyncio.to_thread(pool.stop_all)
        pool.on_change = None
        set_state_path(how.port).unlink(missing_ok=True)


def _write_state(pool: SetPool, how: SetServe) -> None:
    """The set as ``tierlocal status`` reads it (every second, while it serves)."""
    write_set_state(how.port, {"url": f"http://{how.host}:{how.port}", "pid": os.getpid(), **pool.snapshot()})


def read_keys(path: Path | None) -> frozenset[str]:
    """The keys in ``path`` (one per line), none without one."""
    if path is None:
        return frozenset()
    return frozenset(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())

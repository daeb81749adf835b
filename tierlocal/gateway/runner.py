"""Running the gateway in the foreground: checks before listening, local engines found for the
built-in configuration, TLS, readiness for systemd, a clean stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
from aiohttp import web

try:
    import uvloop
except ImportError:  # not on Windows
    uvloop = None  # type: ignore[assignment]

from .. import constants
from ..errors import UsageError
from ..serve.exposure import is_loopback
from ..serve.state import running_servers, running_sets
from ..serve.systemd import notify
from .agents_env import agent_setups
from .app import create_app
from .backends import resolve_key
from .config import GatewayConfig, Route, Target
from .logs import configure_logging
from .store import Store, open_store, store_label

__all__ = ["run_gateway", "discover_local_routes", "served_engines", "route_id", "LOCAL_ENGINES"]

log = logging.getLogger("tierlocal.gateway")

#: Where the built-in configuration looks for local engines: llama-server's and Ollama's
#: default ports, OpenAI-compatible base URLs.
LOCAL_ENGINES = tuple(f"http://{constants.DEFAULT_HOST}:{port}/v1" for port in (constants.LLAMA_SERVER_PORT, constants.OLLAMA_PORT))
#: Most models taken from one engine's /v1/models.
MAX_DISCOVERED = 64


async def _models_at(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    try:
        async with session.get(f"{base_url}/models", timeout=aiohttp.ClientTimeout(total=2)) as response:
            if response.status != 200:
                return []
            data = (await response.json(content_type=None)).get("data")
    except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
        return []
    if not isinstance(data, list):
        return []
    ids = [entry.get("id") for entry in data[:MAX_DISCOVERED] if isinstance(entry, dict)]
    return [model for model in ids if isinstance(model, str) and 0 < len(model) <= 256]


def served_engines() -> tuple[str, ...]:
    """OpenAI base URLs of the servers `tierlocal serve` runs now (its state files whose
    process is alive): a served model set's one endpoint, not its members' own."""
    sets = running_sets()
    members = {str(member.get("url")) for state in sets for member in _listed(state.get("members")) if isinstance(member, dict)}
    urls = [state.url for state in running_servers() if state.url not in members]  # a set's member is reached through the set
    urls += [str(state.get("url")) for state in sets]
    return tuple(url.rstrip("/") + "/v1" for url in urls if url.startswith("http://"))


def _listed(value: object) -> list[object]:
    """``value`` if it is a list (a state file's part), else nothing."""
    return value if isinstance(value, list) else []


def route_id(model: str) -> str:
    """The id clients send for a model an engine reports: llama-server reports the GGUF path
    unless started with --alias, so a path becomes its file name without .gguf."""
    return PurePosixPath(model).stem if model.endswith(".gguf") else model


async def discover_local_routes(engines: tuple[str, ...]) -> list[Route]:
    """A route for every model a local llama-server or Ollama reports (first engine wins)."""
    routes: dict[str, Route] = {}
    async with aiohttp.ClientSession(trust_env=False) as session:
        for base_url, models in zip(engines, await asyncio.gather(*(_models_at(session, url) for url in engines)), strict=True):
            for model in models:
                routes.setdefault(route_id(model), Route(route_id(model), (Target(base_url, model),)))
    return list(routes.values())


def without_unfittable_local_targets(config: GatewayConfig, memory_bytes: int) -> GatewayConfig:
    """Drop the local (tier-2) targets of routes whose model can never fit ``memory_bytes`` (this
    machine's GPU memory plus RAM): a frontier model in recipes/ whose serving floor is larger.
    A route left with no target is dropped; both are logged."""
    from ..catalog import find_frontier

    routes: list[Route] = []
    for route in config.routes:
        frontier = find_frontier(route.model)
        if frontier is None or frontier.serving_floor_bytes <= memory_bytes or all(t.tier != 2 for t in route.targets):
            routes.append(route)
            continue
        kept = tuple(target for target in route.targets if target.tier != 2)  # a cluster of your own or a hosted API
        log.warning(
            "%s needs at least %.0f GiB to serve and this machine has %.0f GiB (GPU + RAM): its local targets are skipped%s",
            route.model,
            frontier.serving_floor_bytes / 2**30,
            memory_bytes / 2**30,
            "" if kept else ", and with no cluster or hosted target the route is dropped",
        )
        if kept:
            routes.append(replace(route, targets=kept))
    return replace(config, routes=tuple(routes))


def _machine_memory_bytes() -> int:
    """This machine's GPU memory and RAM; under the gateway unit's sandbox, where /proc/meminfo is
    hidden (ProcSubset=pid) and so are the GPUs (PrivateDevices=yes), the RAM the kernel reports
    by sysinfo(2) — enough to tell that a frontier model can never fit."""
    from ..hardware.detect import detect

    try:
        machine = detect()
    except OSError as exc:
        log.info("cannot detect this machine's memory (%s): planning the routes on its RAM alone", exc)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return sum(gpu.total_bytes for gpu in machine.gpus) + machine.ram_total_bytes


def ensure_key(config: GatewayConfig, store: Store) -> None:
    """Refuse a non-loopback address while no gateway key exists; on loopback, create one for
    user "local" in a 0600 file so one command gives a working gateway."""
    if any(info.revoked is None for info in store.list_keys()):
        return
    if not is_loopback(config.server.host):
        raise UsageError(
            f"refusing to listen on {config.server.host}: no gateway key exists, so anyone who can reach it could spend the upstream's budget",
            hint="create one with `tierlocal gateway keys add NAME --config FILE`, or listen on 127.0.0.1",
        )
    key = store.add_key("local")
    path = config.server.state_dir / "local.key"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    print(f"no gateway key existed: created one for user 'local' in {path} (mode 0600); clients send it as their API key", file=sys.stderr)


def _ssl_context(config: GatewayConfig) -> ssl.SSLContext | None:
    server = config.server
    if server.tls_cert is None or server.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(server.tls_cert, server.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(
            f"cannot load the TLS certificate {server.tls_cert} / key {server.tls_key}: {exc}", hint="give PEM files the gateway's user can read"
        ) from None
    return context


async def _serve(app: web.Application, config: GatewayConfig, context: ssl.SSLContext | None, *, worker: bool = False) -> None:
    """Listen and serve until SIGTERM/SIGINT. A ``worker`` shares the port with its siblings
    (SO_REUSEPORT: the kernel spreads connections) and leaves readiness to its supervisor."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port, ssl_context=context, backlog=1024, reuse_port=worker or None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(
            f"cannot listen on {config.server.host}:{config.server.port}: {exc.strerror}", hint="choose another --port, or stop what holds it"
        ) from None
    if not worker:
        _announce(config, context)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    if not worker:
        notify("STOPPING=1")
    await runner.cleanup()


def _announce(config: GatewayConfig, context: ssl.SSLContext | None, workers: int = 1) -> None:
    """The listening line on stderr and READY=1 to systemd."""
    scheme = "https" if context else "http"
    routes = ", ".join(route.model for route in config.routes) or "none"
    processes = f" ({workers} workers)" if workers > 1 else ""
    server = config.server
    print(
        f"gateway on {scheme}://{server.host}:{server.port}/v1 — models: {routes}{processes}; keys and usage in {store_label(config)}",
        file=sys.stderr,
        flush=True,
    )
    if config.routes:
        host = server.host if server.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        setups = agent_setups(f"{scheme}://{host}:{server.port}", config.routes[0].model)
        print("\n".join(line for setup in setups for line in setup.lines()), file=sys.stderr, flush=True)
    notify("READY=1", f"STATUS=serving {len(config.routes)} model(s) on port {config.server.port}")


def _raise_open_files_limit() -> None:
    """Every connection is a file descriptor: the soft limit (1,024 under systemd) raised to the
    hard one, so a thousand idle clients cannot starve new ones."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        log.warning("could not raise the open-files limit from %d", soft)


def run_gateway(config: GatewayConfig, *, discover: bool, workers: int = 1) -> None:
    """Serve until SIGTERM/SIGINT. ``discover`` adds routes for local engines' models;
    ``workers`` > 1 serves from that many processes on one port (:func:`_run_workers`)."""
    configure_logging()
    if discover:
        engines = tuple(dict.fromkeys(served_engines() + LOCAL_ENGINES))
        found = [route for route in asyncio.run(discover_local_routes(engines)) if config.route(route.model) is None]
        if found:
            config = replace(config, routes=config.routes + tuple(found))
    config = without_unfittable_local_targets(config, _machine_memory_bytes())
    for route in config.routes:
        for target in route.targets:
            if target.hosted and resolve_key(target) is None:
                where = target.api_key_env or f"credential {target.api_key_credential}"
                log.warning("%s: %s is not set; requests for %r will not reach %s", config.source, where, route.model, target.url)
    context = _ssl_context(config)
    _raise_open_files_limit()
    store = open_store(config)
    try:
        ensure_key(config, store)
        if workers > 1:
            store.close()  # each worker opens its own, after the fork
            _run_workers(config, context, workers)
            return
        store.maintain_in_background()
        _run_loop(_serve(create_app(config, store), config, context))
    finally:
        store.close()


def _run_loop(serving: Coroutine[Any, Any, None]) -> None:
    if uvloop is not None:
        uvloop.run(serving)  # libuv's loop: measurably less overhead per request (bench/gateway_overhead.py)
    else:
        asyncio.run(serving)


_PR_SET_PDEATHSIG = 1


def _run_workers(config: GatewayConfig, context: ssl.SSLContext | None, workers: int) -> None:
    """Serve from ``workers`` forked processes on one port (SO_REUSEPORT). They share keys,
    budgets, rate limits and usage through the store (SQLite: one BEGIN IMMEDIATE per
    reservation or admission, whichever process makes it; Redis: its scripts), and their
    metrics through prometheus_client's multiprocess files, so /metrics from any worker counts
    all of them. This process only supervises: READY once the port answers, SIGTERM/SIGINT
    passed on, and if a worker dies the others are stopped and the gateway exits 1 (systemd
    restarts it). Workers get SIGTERM if this process dies, even by kill -9."""
    metrics_dir = Path(tempfile.mkdtemp(prefix="tierlocal-gateway-metrics-"))
    children = []
    for index in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                _worker(config, context, metrics_dir, index)
                code = 0
            except BaseException:
                log.exception("gateway worker %d stopped", index)
            finally:
                os._exit(code)
        children.append(pid)
    try:
        code = _supervise(config, context, children)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if code:
        raise SystemExit(code)


def _worker(config: GatewayConfig, context: ssl.SSLContext | None, metrics_dir: Path, index: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    constants.use_metrics_dir(str(metrics_dir))
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # metrics made from here on write to metrics_dir
    store = open_store(config, shared_limits=True)
    try:
        if index == 0:
            store.maintain_in_background()  # one checkpointer is enough
        _run_loop(_serve(create_app(config, store, metrics_dir=metrics_dir), config, context, worker=True))
    finally:
        store.close()


def _supervise(config: GatewayConfig, context: ssl.SSLContext | None, children: list[int]) -> int:
    """Wait for the workers; the exit code the gateway ends with."""
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    announced = False
    code = 0
    alive = set(children)
    while alive:
        if not announced and not stopping and _port_answers(config):
            _announce(config, context, len(children))
            announced = True
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            continue
        alive.discard(pid)
        if not stopping:
            log.error("a gateway worker (pid %d) exited with status %d: stopping the others", pid, os.waitstatus_to_exitcode(status))
            code = 1
            stop(signal.SIGTERM, None)
    if announced:
        notify("STOPPING=1")
    return code


def _port_answers(config: GatewayConfig) -> bool:
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::", "") else config.server.host
    try:
        with socket.create_connection((host, config.server.port), timeout=0.2):
            return True
    except OSError:
        return False

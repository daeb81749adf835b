"""Whether the port a serve asks for is free, checked before anything is started and before any
file of that port (its log, its state) is touched: a second serve on a port in use once truncated
the running server's log and deleted its state file, so `status`, the dashboard and the gateway
lost a server that still answered."""

from __future__ import annotations

import socket

from ..errors import UsageError
from .state import running_servers, starting_servers

__all__ = ["check_port_free", "free_loopback_port", "listening"]

#: Seconds a connection attempt to the port may take before it counts as free.
CONNECT_TIMEOUT_S = 0.5


def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (a wildcard address is asked
    on loopback)."""
    address = "127.0.0.1" if host in ("0.0.0.0", "", "*") else "::1" if host == "::" else host
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def check_port_free(host: str, port: int, *, other_listener_ok: bool = False) -> None:
    """Refuse a port a running (or starting) `tierlocal serve` holds, or — unless
    ``other_listener_ok`` (an Ollama already there is used as it is) — any program listens on.

    Raises:
        UsageError: the port is taken, naming by whom where tierlocal knows.
    """
    running, starting = running_servers(port), starting_servers(port)
    if running or starting:
        pid, url, model = (
            (running[0].pid, running[0].url, running[0].model_source) if running else (starting[0].get("pid"), starting[0].get("url"), None)
        )
        raise UsageError(
            f"port {port} is used by tierlocal serve (pid {pid}{f', {model}' if model else ''}, {url})",
            hint="choose another --port, or stop that serve first",
        )
    if not other_listener_ok and listening(host, port):
        raise UsageError(f"port {port} on {host} is in use by another program", hint="choose another --port, or stop what listens there")


def free_loopback_port() -> int:
    """A port nothing listens on at 127.0.0.1 now (the kernel's choice), for a serve tierlocal
    starts itself: a measurement's, or a model set's member."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

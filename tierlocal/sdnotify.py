"""systemd's readiness protocol without libsystemd: datagrams to ``$NOTIFY_SOCKET``.

``READY=1`` once the engine answers health and the load is verified; ``EXTEND_TIMEOUT_USEC``
while a big model loads (so the unit's start timeout does not kill it); ``STOPPING=1`` on the
way out. Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.
"""

from __future__ import annotations

import socket

from . import constants

__all__ = ["notify"]


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=…"``) as one message; True if sent."""
    address = constants.notify_socket()
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
        except OSError:
            return False
    return True

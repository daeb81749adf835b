"""Listen addresses: which ones only this machine can reach."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

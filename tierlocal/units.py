"""Parsing and rendering sizes. Bytes internally; binary units (MiB, GiB) on screen."""

from __future__ import annotations

import re

from .errors import UsageError

__all__ = ["parse_bytes", "format_bytes", "format_count"]

_UNIT_BYTES = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse ``24GiB``, ``24GB``, ``24000MiB`` or ``1048576`` into bytes.

    Decimal suffixes (KB, MB, GB, TB) are powers of 1000, binary ones (KiB … TiB)
    powers of 1024, as their names say.

    Raises:
        UsageError: the text is not a number with a known unit.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNIT_BYTES:
        raise UsageError(
            f"cannot read {text!r} as a size",
            hint="write a number with a unit, e.g. 24GiB, 24GB or 24000MiB",
        )
    return int(float(match.group(1)) * _UNIT_BYTES[unit])


def format_bytes(n_bytes: float) -> str:
    """Render bytes in binary units: ``253113024`` → ``241.4 MiB``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(count: float) -> str:
    """Render a parameter count: ``268098176`` → ``268.1M``, ``2.78e12`` → ``2.78T``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= scale:
            digits = 2 if unit == "T" else 1
            return f"{count / scale:.{digits}f}{unit}"
    return str(int(count))

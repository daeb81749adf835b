"""Parsing and rendering sizes. Bytes internally; binary units (MiB, GiB) on screen."""

from __future__ import annotations

import re

from .errors import UsageError

__all__ = [
    "parse_bytes",
    "parse_memory_size",
    "parse_count",
    "parse_bandwidth",
    "format_bytes",
    "format_decimal_bytes",
    "format_marketed_bytes",
    "format_usd",
    "format_count",
    "format_duration",
]

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


def parse_memory_size(text: str, option: str) -> int:
    """A memory or disk size a user gives for ``option`` (``--ram``, ``--gpu``): a positive
    number with a unit. A bare number is refused rather than read as bytes (``--ram 16`` is
    16 GiB or 16 GB, never 16 bytes, and tierlocal does not guess which).

    Raises:
        UsageError: no unit, not a size, or not positive.
    """
    match = _SIZE_RE.match(text)
    if match is not None and match.group(2) == "":
        raise UsageError(f"{option} {text.strip()!r} has no unit", hint=f"write {match.group(1)}GiB (binary) or {match.group(1)}GB (decimal)")
    size = parse_bytes(text)
    if size <= 0:
        raise UsageError(f"{option} {text.strip()!r}: the size must be positive", hint=f"give the memory it has, e.g. {option} 24GiB")
    return size


_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kKmMbBgGtT]?)\s*$")
_COUNT_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> int:
    """Parse a count such as ``2.8T``, ``104B``, ``270M``, ``5e9`` or ``1000`` (B = billion).

    Raises:
        UsageError: the text is not a number with an optional K/M/B/T suffix.
    """
    match = _COUNT_RE.match(text)
    if match is None:
        raise UsageError(f"cannot read {text!r} as a count", hint="write e.g. 2.8T, 104B, 270M or 5000000")
    return round(float(match.group(1)) * _COUNT_SCALE[match.group(2).lower()])


def parse_bandwidth(text: str) -> float:
    """Parse a transfer rate into bytes/s: ``1GB/s``, ``125MB/s``, ``10Gbit/s`` (bits ÷ 8).

    Raises:
        UsageError: the text is not a size per second.
    """
    stripped = text.strip()
    for suffix, divisor in (("bit/s", 8), ("bps", 8), ("/s", 1)):
        if stripped.lower().endswith(suffix):
            amount = stripped[: -len(suffix)]
            try:
                value = parse_bytes(amount + ("" if divisor == 1 else "B")) / divisor
            except UsageError:
                break
            if value > 0:
                return value
            break
    raise UsageError(f"cannot read {text!r} as a bandwidth", hint="write e.g. 1GB/s, 125MB/s or 10Gbit/s")


def _format_scaled(n_bytes: float, base: int, units: tuple[str, ...], digits: int) -> str:
    value = float(n_bytes)
    for unit in units[:-1]:
        if abs(value) < base:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= base
    return f"{value:.{digits}f} {units[-1]}"


def format_usd(amount: float) -> str:
    """Dollars with the digits that matter: cents at least (``$12.50``), and the smaller
    figures a budget of a fraction of a dollar is made of (``$0.002``, ``$0.0016``), up to
    micro-dollars; never rounded to ``$0.00`` unless it is zero."""
    text = f"{abs(amount):,.6f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{'-' if amount < 0 else ''}${whole}.{cents.ljust(2, '0')}"


def format_decimal_bytes(n_bytes: float) -> str:
    """Render bytes in decimal units, as the industry quotes model and disk sizes: ``1.56 TB``."""
    return _format_scaled(n_bytes, 1000, ("B", "KB", "MB", "GB", "TB", "PB"), 2)


def format_marketed_bytes(n_bytes: float) -> str:
    """A size as a vendor markets it, decimal and without padding: ``288 GB``, ``80 GB``,
    ``2.3 TB`` (one unit for a GPU's memory everywhere tierlocal names it)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.4g} {unit}"
    return f"{n_bytes:.0f} B"


def format_duration(seconds: float) -> str:
    """Render seconds as ``25 min``, ``4.2 h`` or ``3.1 days``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def format_bytes(n_bytes: float) -> str:
    """Render bytes in binary units: ``253113024`` → ``241.4 MiB``."""
    return _format_scaled(n_bytes, 1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 1)


def format_count(count: float) -> str:
    """Render a parameter count: ``268098176`` → ``268.1M``, ``2.78e12`` → ``2.78T``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(count) >= scale:
            digits = 2 if unit == "T" else 1
            return f"{count / scale:.{digits}f}{unit}"
    return str(int(count))

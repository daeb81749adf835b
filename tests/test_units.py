"""Sizes, counts and rates as users write them, and as tierlocal prints them."""

from __future__ import annotations

import pytest

from tierlocal.errors import UsageError
from tierlocal.units import (
    format_bytes,
    format_count,
    format_decimal_bytes,
    format_duration,
    format_usd,
    parse_bandwidth,
    parse_bytes,
    parse_count,
    parse_memory_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("24000MiB", 24000 * 2**20), ("1048576", 2**20), ("1.5 TiB", 3 * 2**39), ("512mib", 512 * 2**20)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("2.8T", 2_800_000_000_000), ("104B", 104_000_000_000), ("270M", 270_000_000), ("5e9", 5_000_000_000), ("1000", 1000)]
)
def test_parse_count(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("1GB/s", 1e9), ("125MB/s", 125e6), ("10Gbit/s", 1.25e9), ("100Mbps", 12.5e6)])
def test_parse_bandwidth(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    ("parse", "text"),
    [(parse_bytes, "24 GiBs"), (parse_bytes, "lots"), (parse_count, "2.8 trillion"), (parse_bandwidth, "1GB"), (parse_bandwidth, "0GB/s")],
)
def test_bad_values_say_how_to_write_them(parse: object, text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse(text)  # type: ignore[operator]
    assert caught.value.hint and caught.value.hint.startswith("write")


@pytest.mark.parametrize(
    ("text", "error", "hint"),
    [
        ("16", "--ram '16' has no unit", "write 16GiB (binary) or 16GB (decimal)"),
        ("0.5", "--ram '0.5' has no unit", "write 0.5GiB (binary) or 0.5GB (decimal)"),
        ("0GiB", "--ram '0GiB': the size must be positive", "give the memory it has, e.g. --ram 24GiB"),
    ],
)
def test_a_memory_size_needs_a_unit_and_a_positive_value(text: str, error: str, hint: str) -> None:
    """``--ram 16`` once planned for 16 bytes of RAM: a bare number is refused, not guessed."""
    with pytest.raises(UsageError) as caught:
        parse_memory_size(text, "--ram")
    assert (str(caught.value), caught.value.hint) == (error, hint)
    assert parse_memory_size("16GiB", "--ram") == 16 * 2**30


@pytest.mark.parametrize(
    ("amount", "text"),
    [(0, "$0.00"), (0.002, "$0.002"), (0.0016, "$0.0016"), (0.000016, "$0.000016"), (12.5, "$12.50"), (1234.5678, "$1,234.5678"), (-0.25, "-$0.25")],
)
def test_dollars_keep_the_digits_a_small_budget_is_made_of(amount: float, text: str) -> None:
    assert format_usd(amount) == text


def test_formatting() -> None:
    assert format_bytes(253_113_024) == "241.4 MiB"
    assert format_bytes(1023) == "1023 B"
    assert format_decimal_bytes(1_560_000_000_000) == "1.56 TB"
    assert format_decimal_bytes(694_975_000_000) == "694.98 GB"
    assert format_count(268_098_176) == "268.1M"
    assert format_count(2_779_900_000_000) == "2.78T"
    assert format_duration(1560) == "26 min"
    assert format_duration(12_480) == "3.5 h"
    assert format_duration(3 * 86400) == "3.0 days"

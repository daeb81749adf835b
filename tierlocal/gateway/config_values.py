"""Checks for one value of the gateway's TOML file: each returns the value or raises a
:class:`UsageError` naming the file and the key."""

from __future__ import annotations

from ..errors import UsageError

__all__ = ["config_error", "as_table", "positive_int", "positive_number", "variable_name", "flag"]


def config_error(source: str, where: str, what: str, hint: str) -> UsageError:
    return UsageError(f"{source}: {where}: {what}", hint=hint)


def as_table(value: object, source: str, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise config_error(source, where, "must be a table", "see the example in the README")
    return value


def positive_int(value: object, source: str, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise config_error(source, where, f"must be a whole number above 0, not {value!r}", "or leave it out for no limit")
    return value


def variable_name(value: object, source: str, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "/" in value:
        raise config_error(
            source,
            where,
            f"must name an environment variable, not {value!r}",
            'e.g. "TIERLOCAL_REDIS_URL" (the URL itself, with its password, stays out of this file)',
        )
    return value


def positive_number(value: object, source: str, where: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise config_error(source, where, f"must be a number above 0, not {value!r}", "or leave it out for the default")
    return float(value)


def flag(value: object, source: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise config_error(source, where, f"must be true or false, not {value!r}", "write admin = true or leave it out")
    return value

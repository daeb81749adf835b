"""The gateway's TOML file: the keys each table takes, and the checks for one value (each
returns the value or raises a :class:`UsageError` naming the file and the key)."""

from __future__ import annotations

from ..errors import UsageError

__all__ = [
    "CONFIG_DOCS",
    "SERVER_KEYS",
    "ROUTE_KEYS",
    "TARGET_KEYS",
    "USER_KEYS",
    "PRICE_KEYS",
    "TOML_FIELDS",
    "MAX_NAME_CHARS",
    "name_problem",
    "config_error",
    "as_table",
    "positive_int",
    "positive_number",
    "variable_name",
    "flag",
]

#: Where the documentation of the file lives (every hint about its shape points there).
CONFIG_DOCS = "docs/gateway/configuration.md, or systemd/gateway.example.toml"
#: The keys each table of the file takes (the documentation is generated from these and the
#: dataclasses of :mod:`tierlocal.gateway.config`: docs/_hooks/generated.py). TOML names that differ from the field's:
#: :data:`TOML_FIELDS`.
SERVER_KEYS = frozenset(
    {
        "host",
        "port",
        "state_dir",
        "tls_cert",
        "tls_key",
        "default_max_tokens",
        "max_body_bytes",
        "upstream_timeout_s",
        "retry_deadline_s",
        "redis_url_env",
        "error_cooldown_s",
        "body_timeout_s",
    }
)
ROUTE_KEYS = frozenset({"model", "targets", "store_bodies", "max_stored_body_bytes", "min_user_tokens_per_s", "max_first_token_s"})
TARGET_KEYS = frozenset({"url", "model", "api_key_env", "api_key_credential", "tier", "usd_per_hour", "speaks"})
USER_KEYS = frozenset({"name", "requests_per_minute", "tokens_per_minute", "concurrent_requests", "budget_usd", "budget_period", "admin"})
PRICE_KEYS = frozenset({"input_cache_hit", "input_cache_miss", "output"})
#: TOML key → dataclass field, where they differ.
TOML_FIELDS = {"tier": "declared_tier", "speaks": "declared_speaks"}
#: Longest user name or model id.
MAX_NAME_CHARS = 200


def config_error(source: str, where: str, what: str, hint: str) -> UsageError:
    return UsageError(f"{source}: {where}: {what}", hint=hint)


def as_table(value: object, source: str, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise config_error(source, where, "must be a table", "see docs/gateway/configuration.md, or systemd/gateway.example.toml")
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


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user name or model id (None: it can): names reach log lines,
    terminals and pages, so no control characters (newlines, ESC, bidi overrides), and at most
    :data:`MAX_NAME_CHARS` characters."""
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters long (at most {MAX_NAME_CHARS})"
    if not name.isprintable():
        return f"{name[:40]!r} holds control characters"
    return None

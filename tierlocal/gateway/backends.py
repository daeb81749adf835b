"""What the gateway knows about each upstream target: its key (resolved once, never logged),
whether it answers, how many parallel slots it has, how many requests it is serving, and until
when it is cooling down after a failure.

Local targets (no key) are polled (:mod:`.health`); hosted targets are not polled: they are
taken out of rotation only by their own failures, for as long as they ask. No HTTP client is
imported here: `usage` and `service` read the store without aiohttp's import time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import constants
from ..serve.state import UsersPoint
from .config import Target

__all__ = ["TargetState", "resolve_key", "credential", "now"]

UP, LOADING, DOWN, UNKNOWN = "up", "loading", "down", "unknown"
#: Longest credential file read, in bytes.
MAX_KEY_BYTES = 4096


def credential(name: str) -> str | None:
    directory = constants.credentials_dir()
    if directory is None or "/" in name:
        return None
    try:
        with (directory / name).open("rb") as handle:
            return handle.read(MAX_KEY_BYTES).decode("utf-8", "replace").strip() or None
    except OSError:
        return None


def resolve_key(target: Target) -> str | None:
    """The target's API key: its environment variable, else a systemd credential of the same
    name (how `tierlocal service install gateway` hands keys over), or its named credential."""
    if target.api_key_env is not None:
        return constants.secret_from_env(target.api_key_env) or credential(target.api_key_env)
    if target.api_key_credential is not None:
        return credential(target.api_key_credential)
    return None


@dataclass
class TargetState:
    """Live state of one target; ``slots`` None means unknown (no capacity limit); ``curve``:
    the users table of the `tierlocal serve` behind a local target (empty: none known)."""

    target: Target
    key: str | None = None
    health: str = UNKNOWN
    slots: int | None = None
    in_flight: int = 0
    cooldown_until: float = 0.0
    last_error: str | None = None
    curve: tuple[UsersPoint, ...] = ()

    @property
    def label(self) -> str:
        """How logs and metrics name it: the URL and the model, never the key."""
        return self.target.label

    @property
    def missing_key(self) -> bool:
        return self.target.hosted and self.key is None

    def cooling(self, now: float) -> bool:
        return now < self.cooldown_until

    def cool_down(self, seconds: float, reason: str, now: float) -> None:
        if seconds > 0:
            self.cooldown_until = max(self.cooldown_until, now + seconds)
        self.last_error = reason

    def full(self) -> bool:
        return self.slots is not None and self.in_flight >= self.slots

    def passed_over_reason(self, excluded: bool, now: float) -> str:
        """Why this target was not tried for a request, as the usage log and the fallback metric
        name it (a request served by a later target is a fallback)."""
        if excluded:
            return "context_exceeded"
        if self.missing_key:
            return "no_key"
        if self.cooling(now):
            return f"cooling_down:{self.last_error}" if self.last_error else "cooling_down"
        if self.health == DOWN:
            return "engine_down"
        if self.health == LOADING:
            return "engine_loading"
        return "slots_full" if self.full() else "passed_over"

    def describe(self, now: float) -> dict[str, object]:
        state = "no_key" if self.missing_key else ("cooldown" if self.cooling(now) else self.health)
        return {
            "url": self.target.url,
            "model": self.target.model,
            "state": state,
            "in_flight": self.in_flight,
            "slots": self.slots,
            "cooldown_s": round(max(self.cooldown_until - now, 0.0), 1),
        }


def now() -> float:
    """The gateway's clock for cooldowns (monotonic seconds)."""
    return time.monotonic()

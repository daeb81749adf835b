"""What the gateway knows about each upstream target: its key (resolved once, never logged),
whether it answers, how many parallel slots it has, how many requests it is serving, and until
when it is cooling down after a failure.

Local targets (no key) are polled: llama-server's ``/health`` (503 while it loads) and
``/props`` (``total_slots``), else Ollama's ``/api/version``. Hosted targets are not polled;
they are taken out of rotation only by their own failures, for as long as they ask.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from .. import constants
from .config import Target

__all__ = ["TargetState", "resolve_key", "credential", "poll_target", "engine_root"]

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


def engine_root(url: str) -> str:
    """A local engine's root URL (its health and props routes) from its OpenAI base URL."""
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass
class TargetState:
    """Live state of one target; ``slots`` None means unknown (no capacity limit)."""

    target: Target
    key: str | None = None
    health: str = UNKNOWN
    slots: int | None = None
    in_flight: int = 0
    cooldown_until: float = 0.0
    last_error: str | None = None

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


async def poll_target(session: aiohttp.ClientSession, state: TargetState, timeout_s: float = 2.0) -> None:
    """Refresh a local target's health and slot count."""
    root = engine_root(state.target.url)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(f"{root}/health", timeout=timeout) as response:
            if response.status == 200:
                state.health = UP
            elif response.status == 503:
                state.health = LOADING
            elif response.status == 404:  # not llama-server: Ollama answers /api/version
                async with session.get(f"{root}/api/version", timeout=timeout) as ollama:
                    state.health = UP if ollama.status == 200 else DOWN
                return
            else:
                state.health = DOWN
                return
        if state.health == UP and state.slots is None:
            async with session.get(f"{root}/props", timeout=timeout) as props:
                if props.status == 200:
                    slots = (await props.json(content_type=None)).get("total_slots")
                    if isinstance(slots, int) and 0 < slots < 4096:
                        state.slots = slots
    except (TimeoutError, aiohttp.ClientError, ValueError):
        state.health = DOWN
        state.slots = None


def now() -> float:
    """The gateway's clock for cooldowns (monotonic seconds)."""
    return time.monotonic()

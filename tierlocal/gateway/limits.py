"""Per-user rate limits over a sliding minute: requests, tokens, and requests in flight.

Held in this process's memory (one gateway replica); budgets, which must hold across
replicas and restarts, live in the store. Tokens are counted at admission from the request's
worst case and corrected to what the upstream reported when it ends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import User

__all__ = ["RateLimiter", "Ticket"]

WINDOW_S = 60.0


@dataclass
class _Window:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[list[float]] = field(default_factory=deque)  # [time, tokens], corrected in place
    in_flight: int = 0


@dataclass
class Ticket:
    """An admitted request: release it exactly once with the tokens it used."""

    user: str
    entry: list[float]
    released: bool = False


class RateLimiter:
    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def _window(self, user: str, now: float) -> _Window:
        window = self._windows.setdefault(user, _Window())
        while window.requests and window.requests[0] <= now - WINDOW_S:
            window.requests.popleft()
        while window.tokens and window.tokens[0][0] <= now - WINDOW_S:
            window.tokens.popleft()
        return window

    def admit(self, user: User, tokens: int, now: float) -> Ticket | float:
        """A ticket, or the seconds to wait (for Retry-After) when a limit is reached."""
        window = self._window(user.name, now)
        if user.concurrent_requests is not None and window.in_flight >= user.concurrent_requests:
            return 1.0
        if user.requests_per_minute is not None and len(window.requests) >= user.requests_per_minute:
            return max(window.requests[0] + WINDOW_S - now, 0.001)
        if user.tokens_per_minute is not None:
            used = sum(entry[1] for entry in window.tokens)
            if window.tokens and used + tokens > user.tokens_per_minute:
                # Wait until enough of the window has passed for this request to fit.
                freed = 0.0
                for entry in window.tokens:
                    freed += entry[1]
                    if used - freed + tokens <= user.tokens_per_minute:
                        return max(entry[0] + WINDOW_S - now, 0.001)
                return WINDOW_S
        window.requests.append(now)
        entry = [now, float(tokens)]
        window.tokens.append(entry)
        window.in_flight += 1
        return Ticket(user.name, entry)

    def release(self, ticket: Ticket, tokens_used: int | None) -> None:
        """End an admitted request; its tokens become what it really used (when known)."""
        if ticket.released:
            return
        ticket.released = True
        if tokens_used is not None:
            ticket.entry[1] = float(tokens_used)
        window = self._windows.get(ticket.user)
        if window is not None:
            window.in_flight = max(window.in_flight - 1, 0)

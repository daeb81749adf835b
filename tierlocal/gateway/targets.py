"""Which of a route's targets a request tries next, and what it is told when none answered: the
order (free and healthy, then full, then down at the last poll; cooling and keyless ones out),
the wait before a target that failed is tried again, and the targets passed over on the way.

The retry loop itself, which makes each attempt, is :meth:`tierlocal.gateway.app.Gateway._serve`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator, Mapping

from .backends import DOWN, UP, TargetState, now
from .config import Route, Target
from .speed_floor import LoadSpeed, Shortfall, shortfall, speed_at
from .wire import AttemptFailed, Exchange, Reject

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "MAX_ATTEMPTS",
    "UNFIXABLE_BY_RETRY",
    "candidates",
    "next_target",
    "no_answer",
    "passed_over_reasons",
    "next_user_speed",
    "too_slow",
]

#: Backoff before trying a target again: base · 2^n seconds, jittered, capped; a target that
#: asks for a longer wait than the cap is not retried within the request (the client is told
#: when to come back). At most MAX_ATTEMPTS attempts per request, over all targets.
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
MAX_ATTEMPTS = 6
#: Failures that trying the same target again within one request cannot mend: the target is not
#: tried again for it, and when nothing else answered the 503 says not to retry.
UNFIXABLE_BY_RETRY = frozenset({"dns_error", "no_key"})

States = Mapping[Target, TargetState]


def next_user_speed(state: TargetState) -> LoadSpeed | None:
    """The target's speed with one more user than it serves now (None: no curve known)."""
    return speed_at(state.curve, state.in_flight + 1)


def too_slow(route: Route, state: TargetState) -> Shortfall | None:
    """Why a healthy local target with a free slot misses the route's per-user floor or
    first-token limit at its load with this request (None: it keeps them, or is not such a target)."""
    if state.health != UP or state.full() or state.target.hosted:
        return None
    return shortfall(route, next_user_speed(state))


def candidates(route: Route, states: States, excluded: set[Target]) -> list[TargetState]:
    """Targets to try, best first: free and healthy, then free but too slow for the route's
    floor at their load, then full (spill over rather than queue), then ones that looked down
    at the last poll. Cooling and keyless ones are out."""
    moment = now()
    ready: list[TargetState] = []
    slow: list[TargetState] = []
    full: list[TargetState] = []
    down: list[TargetState] = []
    for target in route.targets:
        state = states[target]
        if target in excluded or state.missing_key or state.cooling(moment):
            continue
        if state.health == DOWN:
            down.append(state)
        elif state.full():
            full.append(state)
        else:
            (slow if too_slow(route, state) else ready).append(state)
    return ready + slow + full + down


def _retry_waits(route: Route, states: States, excluded: set[Target]) -> list[tuple[float, TargetState]]:
    """(seconds until usable, target) for the targets this request may try again."""
    moment = now()
    return [
        (max(state.cooldown_until - moment, 0.0), state)
        for target in route.targets
        if target not in excluded and not (state := states[target]).missing_key
    ]


async def next_target(route: Route, states: States, excluded: set[Target], failed: set[Target], attempts: int, deadline: float) -> TargetState | None:
    """The next target to try: the best one not yet failed; once every target has failed
    this request, the first usable again after its cooldown or a jittered, growing backoff
    (waited here; ``attempts`` so far). None when no wait fits the cap and the deadline."""
    fresh = [state for state in candidates(route, states, excluded) if state.target not in failed]
    if fresh:
        return fresh[0]
    waits = _retry_waits(route, states, excluded)
    if not waits:
        return None
    wait_s, state = min(waits, key=lambda pair: pair[0])
    backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(attempts - 1, 0)) * random.uniform(0.5, 1.0)
    delay = max(wait_s, backoff)
    if delay > BACKOFF_CAP_S or time.monotonic() + delay >= deadline:
        return None
    await asyncio.sleep(delay)
    return state


def passed_over_reasons(
    route: Route, states: States, chosen: TargetState, excluded: set[Target], failed: set[Target], passed_over: set[Target]
) -> Iterator[tuple[str, str | None]]:
    """Why each target ahead of ``chosen`` in the route that this request skips without trying it
    was skipped (the local engine down, busy or too slow at its load, a target cooling down) and,
    for speed, the figures: a fallback too, to be logged, counted and kept in the usage row.
    Each target once (``passed_over`` remembers)."""
    moment = now()
    for target in route.targets:
        if target == chosen.target:
            return
        if target in failed or target in passed_over:
            continue  # its failed attempt was counted with its own reason
        passed_over.add(target)
        state = states[target]
        slow = None if target in excluded else too_slow(route, state)
        yield (slow.reason, f"{state.label}: {slow.detail}") if slow else (state.passed_over_reason(target in excluded, moment), None)


def no_answer(exchange: Exchange, states: States, excluded: set[Target], last_failure: AttemptFailed | None) -> Reject:
    """Why nothing answered: the request fits no target's context (400), or 503 with
    Retry-After (the shortest cooldown), naming a missing upstream key when that is why."""
    route = exchange.route
    if last_failure is not None and last_failure.verdict.reason == "context_exceeded" and not candidates(route, states, excluded):
        return Reject(
            400,
            f"the request does not fit the context of any target for {route.model!r}: {last_failure.detail}",
            "invalid_request_error",
            "context_length_exceeded",
            should_retry=False,
        )
    moment = now()
    waits = [states[t].cooldown_until - moment for t in route.targets if states[t].cooling(moment)]
    missing = [t.api_key_env or t.api_key_credential for t in route.targets if states[t].missing_key]
    detail = f"; last failure: {last_failure.verdict.reason} ({last_failure.detail})" if last_failure else ""
    if missing and len(missing) == len(route.targets):
        detail = f"; the upstream key is not set (set {missing[0]} in the gateway's environment)"
    # A configuration the operator must fix (no key, a host name that does not resolve) is
    # not worth the client's retries: the SDKs honour x-should-retry: false.
    unfixable = (bool(missing) and len(missing) == len(route.targets)) or (bool(exchange.reasons) and set(exchange.reasons) <= UNFIXABLE_BY_RETRY)
    return Reject(
        503,
        f"no upstream for {route.model!r} answered after {exchange.attempts} attempt(s){detail}",
        "service_unavailable_error",
        "no_upstream",
        retry_after_s=None if unfixable else (min(waits) if waits else 1.0),
        should_retry=not unfixable,
    )

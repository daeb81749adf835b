"""`tierlocal bench --users 1,2,4`: what each user gets when several stream at once. For each
user count N, N clients start together, each streaming a prompt of its own (token ids that differ from
the first, so llama-server reuses no cached prefix across them) and generating the same
number of tokens; the client's clock gives each one's time to first token and its decode rate
after the first token. I/O: HTTP to the engine, threads (one per client).

A user count past the server's slots queues: the extra requests wait for a slot, as users do."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import constants
from ..errors import EngineFailed, UsageError
from .bench import bench_device, bench_key, bench_path, llama_server_plan
from .records import append_record, read_records
from .state import ServeState

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "UserStream",
    "UsersPoint",
    "UsersRun",
    "bench_users",
    "parse_users",
    "MAX_USERS",
    "distinct_prompt",
    "measure_users",
    "measured_users",
    "record_users",
]

#: Most concurrent clients one point may start.
MAX_USERS = 64
#: Token ids the prompts are drawn from: ordinary entries of any vocabulary of 32k or more (the
#: prompts are token ids, so each has exactly its length, whatever the tokenizer).
_TOKEN_IDS = range(1000, 30000)


def parse_users(text: str) -> tuple[int, ...]:
    """``--users 1,2,4,8``: distinct user counts, ascending.

    Raises:
        UsageError: not a comma-separated list of counts from 1 to :data:`MAX_USERS`.
    """
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1 or counts[-1] > MAX_USERS or len(counts) > 8:
        raise UsageError(f"--users {text!r} is not a list of user counts", hint=f"give up to 8 counts from 1 to {MAX_USERS}, e.g. 1,2,4,8")
    return tuple(counts)


def distinct_prompt(tokens: int, seed: int) -> list[int]:
    """``tokens`` token ids drawn with ``seed``: prompts of different seeds differ from their
    first token, so no request finds another's prefix in the engine's cache."""
    pick = random.Random(seed)
    return [pick.choice(_TOKEN_IDS) for _ in range(max(1, tokens))]


@dataclass(frozen=True)
class UserStream:
    """One client's request as its own clock saw it (seconds from the common start): when the
    first token arrived, when the last did, tokens generated and prompt tokens (the engine's count)."""

    first_token_s: float
    last_token_s: float
    tokens: int
    prompt_tokens: int

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second between the first and the last."""
        span = self.last_token_s - self.first_token_s
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0


@dataclass(frozen=True)
class UsersPoint:
    """N users at once: each one's stream, and what they add up to."""

    users: int
    streams: tuple[UserStream, ...]

    @property
    def per_user_decode_tokens_per_s(self) -> float:
        """The median user's decode rate (tokens/s)."""
        return statistics.median(stream.decode_tokens_per_s for stream in self.streams)

    @property
    def aggregate_decode_tokens_per_s(self) -> float:
        """Tokens after each user's first, per second from the earliest first token to the latest
        last one (users who waited for a slot count)."""
        span = max(stream.last_token_s for stream in self.streams) - min(stream.first_token_s for stream in self.streams)
        return sum(stream.tokens - 1 for stream in self.streams) / span if span > 0 else 0.0

    def first_token_quantile(self, share: float) -> float:
        """Time to first token (s) at quantile ``share`` (nearest rank)."""
        ordered = sorted(stream.first_token_s for stream in self.streams)
        return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.4999) - 1))]

    def to_json(self) -> dict[str, object]:
        return {
            "users": self.users,
            "per_user_decode_tokens_per_s": round(self.per_user_decode_tokens_per_s, 2),
            "aggregate_decode_tokens_per_s": round(self.aggregate_decode_tokens_per_s, 2),
            "first_token_p50_s": round(self.first_token_quantile(0.5), 3),
            "first_token_p95_s": round(self.first_token_quantile(0.95), 3),
            "prompt_tokens": round(statistics.median(stream.prompt_tokens for stream in self.streams)),
            "tokens": round(statistics.median(stream.tokens for stream in self.streams)),
        }


def _stream(client: httpx2.Client, url: str, prompt: list[int], tokens: int, started: float) -> UserStream:
    """One streamed ``/completion``, timed on this clock from ``started``."""
    body = {"prompt": prompt, "n_predict": tokens, "cache_prompt": False, "temperature": 0, "ignore_eos": True, "stream": True}
    first = last = None
    count = prompt_tokens = 0
    with client.stream("POST", f"{url}/completion", json=body) as response:
        if response.status_code != 200:
            detail = response.read().decode("utf-8", "replace")[:200]
            raise EngineFailed(f"the engine answered {response.status_code} to a streamed prompt: {detail}", hint="see `tierlocal status`")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            now = time.monotonic() - started
            if event.get("content") or event.get("tokens"):
                count += 1
                first = now if first is None else first
                last = now
            if event.get("stop"):
                timings = event.get("timings") or {}
                prompt_tokens = int(timings.get("prompt_n") or 0)
                count = int(timings.get("predicted_n") or count)
    if first is None or last is None:
        raise EngineFailed("the engine streamed no tokens", hint="tierlocal bench measures llama-server")
    return UserStream(first, last, count, prompt_tokens)


def _point(url: str, users: int, prompt_tokens: int, tokens: int, seed: int) -> UsersPoint:
    """``users`` clients started together, each with a prompt of its own."""
    import httpx2

    results: list[UserStream | BaseException | None] = [None] * users
    gate = threading.Barrier(users + 1)
    started = 0.0

    def client(index: int) -> None:
        try:
            with httpx2.Client(timeout=constants.FIRST_ANSWER_TIMEOUT_S * 4) as http:
                gate.wait()
                results[index] = _stream(http, url, distinct_prompt(prompt_tokens, seed + index), tokens, started)
        except BaseException as error:  # reported below, once every client is done
            results[index] = error

    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(users)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    gate.wait()
    for thread in threads:
        thread.join()
    failed = [result for result in results if not isinstance(result, UserStream)]
    if failed:
        error = failed[0]
        raise error if isinstance(error, EngineFailed) else EngineFailed(f"a client failed: {error}", hint="see `tierlocal status`")
    return UsersPoint(users, tuple(result for result in results if isinstance(result, UserStream)))


def bench_users(
    url: str, counts: Sequence[int], *, prompt_tokens: int, tokens: int, say: Callable[[str], None], seed: int | None = None
) -> tuple[UsersPoint, ...]:
    """Each of ``counts`` users at once against ``url`` (a llama-server), after one warm-up
    request; prompts of ``prompt_tokens`` tokens, ``tokens`` generated each."""
    seed = seed if seed is not None else time.time_ns() % 1_000_000_000
    _point(url, 1, 16, 4, seed)  # warm-up: first-use allocations are not speed
    points = []
    for index, users in enumerate(counts):
        started = time.monotonic()
        points.append(_point(url, users, prompt_tokens, tokens, seed + 1000 * (index + 1)))
        point = points[-1]
        say(
            f"{users} user(s): {point.per_user_decode_tokens_per_s:.1f} tok/s each, {point.aggregate_decode_tokens_per_s:.1f} in all, "
            f"first token p50 {point.first_token_quantile(0.5):.2f} s ({time.monotonic() - started:.1f} s)"
        )
    return tuple(points)


@dataclass(frozen=True)
class UsersRun:
    """`tierlocal bench --users` on one server: each user count's point, the slots it had, and
    the plan's estimate (``check --json``'s ``users`` rows) beside it."""

    url: str
    model: str
    engine_version: str
    device: str
    slots: int
    prompt_tokens: int
    tokens: int
    points: tuple[UsersPoint, ...]
    estimate: tuple[dict[str, object], ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "model": self.model,
            "engine_version": self.engine_version,
            "device": self.device,
            "slots": self.slots,
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.tokens,
            "users": [point.to_json() for point in self.points],
            "estimate": list(self.estimate),
        }


def measure_users(state: ServeState, counts: Sequence[int], *, prompt_tokens: int, tokens: int, say: Callable[[str], None]) -> UsersRun:
    """:func:`bench_users` on the running `tierlocal serve` whose state file is ``state``.

    Raises:
        UsageError: it is not a llama-server.
        EngineFailed: it does not answer as llama-server does.
    """
    plan, request = llama_server_plan(state)
    per_slot = int(request.get("ctx_per_slot") or 2048)
    if prompt_tokens + tokens + 16 > per_slot:
        raise UsageError(f"a {prompt_tokens}-token prompt and {tokens} tokens do not fit a {per_slot}-token slot", hint="give a shorter --prompt")
    url = state.url
    points = bench_users(url, counts, prompt_tokens=prompt_tokens, tokens=tokens, say=say)
    rows = plan.get("users") if isinstance(plan.get("users"), list) else []
    assert isinstance(rows, list)
    estimate = tuple(row for row in rows if isinstance(row, dict))
    version = state.engine_version or "unknown"
    return UsersRun(url, state.model_file, version, bench_device(plan), int(request.get("parallel") or 1), prompt_tokens, tokens, points, estimate)


def record_users(run: UsersRun) -> None:
    """Append ``run`` to the bench records under its model file, engine build and device."""
    append_record(bench_path(), {"key": bench_key(run.model, run.engine_version, run.device), "kind": "users", **run.to_json()})


def measured_users(key: dict[str, object], path: Path | None = None) -> dict[str, object] | None:
    """The latest `bench --users` filed under ``key``: its time, slots, prompt_tokens and users rows (None: none)."""
    for record in reversed(read_records(path or bench_path())):
        if record.get("key") == key and record.get("kind") == "users":
            return {name: record.get(name) for name in ("time", "slots", "prompt_tokens", "tokens", "users")}
    return None

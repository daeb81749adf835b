"""What the Live screen shows, sampled once a second: every running ``tierlocal serve`` (its
state file — plan, what loaded, the delta — and one live sample: slots, requests waiting,
tokens/s since the last sample), the gateway's routes and targets (its ``GET /health``), and
spend against budgets (the report ``tierlocal usage --json`` prints, read from the gateway's
store). The same objects ``status --live --json`` and ``usage --json`` print.

Nothing here waits for long: each engine and the gateway are asked with a short timeout, the
store is read in a thread, and an answer that does not come is an ``error`` on its row."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from ..gateway.config import GatewayConfig
from ..serve.live import MAX_ANSWER_BYTES, Throughput, live_report
from ..serve.state import running_servers, running_sets, starting_servers

__all__ = ["LiveFeed", "LiveSample", "gateway_health_url", "HISTORY_POINTS"]

#: Points each engine's tokens/s history keeps (one per sample: a minute at one a second).
HISTORY_POINTS = 60
#: Seconds one engine or the gateway may take to answer a sample.
ANSWER_TIMEOUT_S = 0.8


@dataclass
class LiveSample:
    """One refresh: ``engines`` are the state files merged with their live sample (``live``);
    ``decode_history``/``prompt_history``: tokens/s per sample, oldest first, by engine URL;
    ``gateway``: its /health object (None: no gateway configured); ``usage``: the usage report."""

    engines: list[dict[str, object]]
    starting: list[dict[str, object]]
    decode_history: dict[str, list[float]]
    prompt_history: dict[str, list[float]]
    gateway_url: str | None = None
    gateway: dict[str, object] | None = None
    gateway_error: str | None = None
    usage: dict[str, object] | None = None
    usage_error: str | None = None
    #: Served model sets (their ``set-PORT.json``): each member's state, planned bytes, last use.
    sets: list[dict[str, object]] = field(default_factory=list)


def gateway_health_url(config: GatewayConfig) -> str:
    """Where the gateway ``config`` describes answers /health (a wildcard address: loopback)."""
    host = config.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{config.server.port}/health"


@dataclass
class LiveFeed:
    """Samples the engines, the gateway and the usage report; keeps each engine's history."""

    gateway_config: GatewayConfig | None = None
    history: dict[str, Throughput] = field(default_factory=dict)
    decode: dict[str, deque[float]] = field(default_factory=dict)
    prompt: dict[str, deque[float]] = field(default_factory=dict)

    async def sample(self, session: aiohttp.ClientSession) -> LiveSample:
        """One refresh of everything (never raises for an engine or gateway that does not answer)."""
        servers, starting, sets = await asyncio.to_thread(lambda: (running_servers(), starting_servers(), running_sets()))
        config = self.gateway_config
        url = gateway_health_url(config) if config is not None else None
        engines_task = live_report(servers, self.history, window_s=1.5, session=session) if servers else _nothing()
        gateway_task = _gateway_health(session, url) if url else _nothing_pair()
        usage_task = asyncio.to_thread(_usage, config) if config is not None else _nothing_pair()
        live, (gateway, gateway_error), (usage, usage_error) = await asyncio.gather(engines_task, gateway_task, usage_task)
        engines = []
        for server, sample in zip(servers, live, strict=True):
            key = server.url
            for store, name in ((self.decode, "decode_tokens_per_s"), (self.prompt, "prompt_tokens_per_s")):
                rate = sample.get(name)
                if isinstance(rate, int | float):
                    store.setdefault(key, deque(maxlen=HISTORY_POINTS)).append(float(rate))
            engines.append({**server.to_json(), "live": sample})
        return LiveSample(
            engines=engines,
            starting=starting,
            decode_history={key: list(values) for key, values in self.decode.items()},
            prompt_history={key: list(values) for key, values in self.prompt.items()},
            gateway_url=url,
            gateway=gateway,
            gateway_error=gateway_error,
            usage=usage,
            usage_error=usage_error,
            sets=sets,
        )


async def _nothing() -> list[dict[str, object]]:
    return []


async def _nothing_pair() -> tuple[None, None]:
    return None, None


async def _gateway_health(session: aiohttp.ClientSession, url: str) -> tuple[dict[str, object] | None, str | None]:
    """The gateway's /health object, or why there is none."""
    try:
        timeout = aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_S)
        async with session.get(url, timeout=timeout, allow_redirects=False) as response:
            body = await response.content.read(MAX_ANSWER_BYTES + 1)
            if response.status != 200 or len(body) > MAX_ANSWER_BYTES:
                return None, f"{url} answered {response.status}"
            value = json.loads(body)
            return (value, None) if isinstance(value, dict) else (None, f"{url} did not answer a JSON object")
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
        reason = "no gateway answers there" if isinstance(exc, aiohttp.ClientConnectorError) else f"{type(exc).__name__}: {exc}"
        return None, f"{url}: {reason}"[:300]


def _usage(config: GatewayConfig) -> tuple[dict[str, object] | None, str | None]:
    """``tierlocal usage --json``'s report for this month, or why it cannot be read."""
    from ..errors import TierlocalError
    from ..gateway.store import open_store
    from ..gateway.usage_report import usage_report

    try:
        store = open_store(config)
    except (TierlocalError, OSError) as exc:
        return None, str(exc)[:300]
    try:
        return usage_report(config, store, "month"), None
    except (TierlocalError, OSError) as exc:
        return None, str(exc)[:300]
    finally:
        store.close()

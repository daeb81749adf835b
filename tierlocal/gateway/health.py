"""Polling a local target: llama-server's ``/health`` (503 while it loads) and ``/props``
(``total_slots``), else Ollama's ``/api/version``."""

from __future__ import annotations

import aiohttp

from .backends import DOWN, LOADING, UP, TargetState

__all__ = ["poll_target", "engine_root"]


def engine_root(url: str) -> str:
    """A local engine's root URL (its health and props routes) from its OpenAI base URL."""
    return url[: -len("/v1")] if url.endswith("/v1") else url


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

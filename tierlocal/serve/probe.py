"""Ready means it answered: after the load verifies, serve sends one short chat (the prompt the
chat template builds, a couple of tokens out) and says ready only once it came back. An engine
that crashes there — this llama.cpp's Vulkan build segfaults on Mesa's llvmpipe at the first
prompt of a few dozen tokens when flash attention is on with any layer on the device — is
reported with its last log lines and, where the crash matches a known pattern, the flag to try.
I/O: HTTP to the engine."""

from __future__ import annotations

import subprocess

from .. import constants
from ..engines.process import EngineChild
from ..engines.prompt_formats import PROBE_MESSAGE
from ..errors import EngineFailed
from ..fit.estimate import RunEstimate
from .systemd import notify

__all__ = ["first_answer", "crash_hint"]

#: What to try when the engine died on its first request with flash attention on and layers on
#: a device (the issue 15 pattern; `-fa off` works there).
FLASH_ATTN_HINT = "try --flash-attn off: this llama.cpp crashes on some devices (Mesa's llvmpipe among them) with flash attention on"


def crash_hint(planned: RunEstimate, log: str) -> str:
    """The flag to try after the engine died on its first request, else where to look."""
    if planned.request.flash_attn and planned.layers_offloaded > 0:
        return f"{FLASH_ATTN_HINT}; see {log}"
    return f"see {log}"


def _how_it_ended(child: EngineChild, wait_s: float = 3.0) -> str | None:
    """How the engine ended (``signal 11``, ``exit code 1``), or None while it still runs."""
    try:
        code = child.process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None
    child.wait_output()
    return f"signal {-code}" if code < 0 else f"exit code {code}"


#: The first request for each role other than chat: (path, body).
_ROLE_PROBES = {
    "embeddings": ("/v1/embeddings", {"input": PROBE_MESSAGE}),
    "rerank": ("/v1/rerank", {"query": PROBE_MESSAGE, "documents": [PROBE_MESSAGE, "another document"]}),
}


def first_answer(
    engine: str, url: str, child: EngineChild, planned: RunEstimate, log: str, *, headers: dict[str, str] | None = None, role: str = "chat"
) -> float:
    """Send one short chat (for an embeddings or rerank server, one short request of its kind) to
    the engine at ``url``; returns the seconds it took.

    Raises:
        EngineFailed: the engine died or answered with an error (it is stopped first).
    """
    notify(f"EXTEND_TIMEOUT_USEC={int(constants.FIRST_ANSWER_TIMEOUT_S * 1_000_000)}", "STATUS=sending a first short chat")
    chat = {"messages": [{"role": "user", "content": PROBE_MESSAGE}], "max_tokens": constants.FIRST_ANSWER_TOKENS, "temperature": 0}
    path, request = _ROLE_PROBES.get(role, ("/v1/chat/completions", chat))
    import httpx2  # loads when a server is asked, not with every command that imports this

    try:
        response = httpx2.post(f"{url}{path}", json=request, headers=headers, timeout=constants.FIRST_ANSWER_TIMEOUT_S)
        problem = None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"
        elapsed = response.elapsed.total_seconds() if problem is None else 0.0
    except httpx2.HTTPError as exc:
        problem, elapsed = type(exc).__name__, 0.0
    if problem is None:
        return elapsed
    ended = _how_it_ended(child)
    lines = " | ".join(line for line in child.lines()[-6:] if line.strip())
    child.stop()
    if ended is not None:
        raise EngineFailed(f"{engine} crashed on its first request ({ended}); nothing is served: {lines}", hint=crash_hint(planned, log))
    raise EngineFailed(f"{engine} could not answer a first short chat ({problem}); nothing is served", hint=f"see {log}")

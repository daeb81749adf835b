"""What a running engine is doing now: slots busy and idle, requests waiting, and tokens decoded
and prompt-processed — from llama-server's ``/slots`` and ``/metrics`` (serve starts it with
``--metrics``), or Ollama's ``/api/ps``. ``tierlocal status --live --json`` prints it; the
dashboard's live page shows the same objects.

Rates ("tokens/s over the last minutes") are differences of the engine's own counters between
two samples: :class:`Throughput` keeps the samples of one engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .state import ServeState

__all__ = ["engine_live", "Throughput", "live_report", "MAX_ANSWER_BYTES"]

#: Largest /slots, /metrics or /api/ps answer read (bytes); a larger one is an error.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: Most slots or loaded models listed per engine.
MAX_ROWS = 256
#: llama-server's counters and gauges we keep, by the name we give them.
_METRICS = {
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:tokens_predicted_total": "predicted_tokens_total",
    "llamacpp:requests_processing": "requests_processing",
    "llamacpp:requests_deferred": "requests_deferred",
}


async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, headers=dict(headers), timeout=timeout, allow_redirects=False) as response:
        body = await response.content.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            raise ValueError(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
        return response.status, body


def _key_headers(server: ServeState) -> tuple[dict[str, str], str | None]:
    """The bearer header from the server's key file, or why there is none we can use."""
    path = server.api_key_file
    if not path:
        return {}, None
    try:
        words = Path(str(path)).read_text().split()
    except OSError:
        return {}, f"the engine needs its API key and {path} cannot be read by this user"
    return ({"Authorization": f"Bearer {words[0]}"}, None) if words else ({}, f"{path} is empty")


async def engine_live(session: aiohttp.ClientSession, server: ServeState, *, timeout_s: float = 3.0) -> dict[str, object]:
    """One sample of a running ``tierlocal serve`` (an object ``status --json`` prints): slots
    total and busy, requests waiting, counters of prompt and predicted tokens, the time of the
    sample (seconds since the epoch), and ``error`` when the engine could not be read.

    llama-server adds a request's tokens to its /metrics counters when the request finishes, so
    a long answer in progress would read 0 tok/s: the counters here are the finished requests'
    plus what each busy slot has done so far (/slots ``n_decoded`` and
    ``n_prompt_tokens_processed``). /metrics is read before /slots, so a request that finishes
    between the two is counted once at most (late, never twice: the counters only grow)."""
    url, engine = server.url.rstrip("/"), server.engine
    sample: dict[str, object] = {
        "url": url,
        "engine": engine,
        "port": _port(url),
        "time": time.time(),
        "slots_total": None,
        "slots_busy": None,
        "requests_deferred": None,
        "prompt_tokens_total": None,
        "predicted_tokens_total": None,
        "models": [],
        "error": None,
    }
    headers, problem = _key_headers(server)
    try:
        if engine == "ollama":
            status, body = await _get(session, url + "/api/ps", headers, timeout_s)
            if status == 200:
                loaded = _json_object(body).get("models")
                rows = loaded[:MAX_ROWS] if isinstance(loaded, list) else []
                sample["models"] = [_ollama_model(model) for model in rows if isinstance(model, Mapping)]
            else:
                sample["error"] = f"/api/ps answered {status}"
            return sample
        metrics_status, body = await _get(session, url + "/metrics", headers, timeout_s)
        if metrics_status == 200:
            for name, value in _metrics(body.decode("utf-8", "replace")).items():
                sample[name] = value
        status, body = await _get(session, url + "/slots", headers, timeout_s)
        if status == 200:
            slots = _json_list(body)[:MAX_ROWS]
            busy = [slot for slot in slots if isinstance(slot, Mapping) and slot.get("is_processing")]
            sample["slots_total"] = len(slots)
            sample["slots_busy"] = len(busy)
            _add_in_progress(sample, busy)
        elif status == 401 or metrics_status == 401:
            sample["error"] = problem or "the engine refused the request: it needs its API key"
            return sample
        elif metrics_status != 200:
            sample["error"] = f"neither /slots nor /metrics answered ({status})"
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
        sample["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return sample


def _add_in_progress(sample: dict[str, object], busy: list[Mapping[str, object]]) -> None:
    """Add the busy slots' tokens so far to the finished requests' counters (when /metrics gave them)."""
    decoded = prompt = 0
    for slot in busy:
        tokens = slot.get("next_token")
        for entry in tokens if isinstance(tokens, list) else [tokens]:
            if isinstance(entry, Mapping) and isinstance(entry.get("n_decoded"), int):
                decoded += int(entry["n_decoded"])
        processed = slot.get("n_prompt_tokens_processed")
        prompt += processed if isinstance(processed, int) else 0
    for name, extra in (("predicted_tokens_total", decoded), ("prompt_tokens_total", prompt)):
        value = sample.get(name)
        if isinstance(value, int | float):
            sample[name] = value + extra


def _port(url: str) -> int | None:
    tail = url.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _json_object(body: bytes) -> dict[str, object]:
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def _json_list(body: bytes) -> list[object]:
    value = json.loads(body)
    if not isinstance(value, list):
        raise ValueError("expected a JSON list of slots")
    return value


def _ollama_model(model: Mapping[str, object]) -> dict[str, object]:
    return {
        "name": str(model.get("name", ""))[:200],
        "size_bytes": model.get("size") if isinstance(model.get("size"), int) else None,
        "size_vram_bytes": model.get("size_vram") if isinstance(model.get("size_vram"), int) else None,
        "context_length": model.get("context_length") if isinstance(model.get("context_length"), int) else None,
    }


def _metrics(text: str) -> dict[str, float]:
    """llama-server's counters and gauges we keep, parsed with prometheus_client's parser."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _METRICS:
                values[_METRICS[sample.name]] = float(sample.value)
    return values


@dataclass
class Throughput:
    """An engine's samples over the last ``keep_s`` seconds, and the rates between them."""

    keep_s: float = 900.0
    samples: deque[tuple[float, float, float]] = field(default_factory=lambda: deque(maxlen=4096))

    def add(self, sample: Mapping[str, object]) -> None:
        """Keep a sample's time and token counters (samples without counters are skipped; a
        counter that went down means the engine restarted: the history starts again)."""
        prompt, predicted, moment = sample.get("prompt_tokens_total"), sample.get("predicted_tokens_total"), sample.get("time")
        if not isinstance(prompt, int | float) or not isinstance(predicted, int | float) or not isinstance(moment, int | float):
            return
        if self.samples and (prompt < self.samples[-1][1] or predicted < self.samples[-1][2]):
            self.samples.clear()
        self.samples.append((float(moment), float(prompt), float(predicted)))
        while self.samples and self.samples[0][0] < moment - self.keep_s:
            self.samples.popleft()

    def rates(self, window_s: float) -> dict[str, float | None]:
        """Tokens per second decoded and prompt-processed between the oldest sample in the last
        ``window_s`` seconds and the newest (None with fewer than two samples)."""
        if len(self.samples) < 2:
            return {"window_s": None, "decode_tokens_per_s": None, "prompt_tokens_per_s": None}
        newest = self.samples[-1]
        oldest = next(sample for sample in self.samples if sample[0] >= newest[0] - window_s)
        span = newest[0] - oldest[0]
        if span <= 0:
            oldest = self.samples[-2]
            span = newest[0] - oldest[0]
        if span <= 0:
            return {"window_s": None, "decode_tokens_per_s": None, "prompt_tokens_per_s": None}
        return {
            "window_s": round(span, 1),
            "decode_tokens_per_s": round((newest[2] - oldest[2]) / span, 2),
            "prompt_tokens_per_s": round((newest[1] - oldest[1]) / span, 2),
        }


async def live_report(
    servers: list[ServeState], history: dict[str, Throughput], *, window_s: float = 300.0, session: aiohttp.ClientSession | None = None
) -> list[dict[str, object]]:
    """A sample of every server, each with its rates over ``window_s`` from ``history`` (keyed
    by URL; the new sample is added to it first)."""
    own = session is None
    client = session or aiohttp.ClientSession(trust_env=False)
    try:
        samples = await asyncio.gather(*(engine_live(client, server) for server in servers))
    finally:
        if own:
            await client.close()
    for sample in samples:
        throughput = history.setdefault(str(sample["url"]), Throughput())
        throughput.add(sample)
        sample.update(throughput.rates(window_s))
    return list(samples)

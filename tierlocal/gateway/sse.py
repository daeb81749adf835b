"""Server-sent events as upstreams send them: whole events, their ``data:`` payload, and an
in-band error in any of the shapes the gateway's protocols use.

Events are split on blank lines; an event is kept whole (``event:``/``data:`` lines and all) and
forwarded as it came, except that ``\\r\\n`` line ends become ``\\n``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from . import protocol

if TYPE_CHECKING:  # the config (and the CLI commands that read it) load the dialects, not the HTTP client
    import aiohttp

__all__ = ["sse_batches", "event_data", "json_or_none", "event_error", "MAX_SSE_EVENT_BYTES"]

#: Longest SSE event, in bytes.
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024


async def sse_batches(upstream: aiohttp.ClientResponse):  # type: ignore[no-untyped-def]
    """An upstream SSE body as lists of whole events (each ending in a blank line, line ends
    made ``\\n``), one list per read, so events that arrive together are handled and sent
    together; a partial event at the end of the stream is dropped."""
    buffer = b""
    while True:
        chunk = await upstream.content.readany()
        if not chunk:
            return
        buffer += chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            if end > start:
                events.append(buffer[start : end + 2])
            start = end + 2
        buffer = buffer[start:]
        if len(buffer) > MAX_SSE_EVENT_BYTES:
            raise ValueError("an SSE event longer than the gateway's limit")
        if events:
            yield events


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of one SSE event, if it has one."""
    parts = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


def json_or_none(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def event_error(event: bytes) -> str | None:
    """An in-band error: an ``error:`` field, a data document with an ``error`` member (OpenAI's
    chat, Anthropic's ``event: error``), or one of ``"type": "error"`` (Responses' error event)."""
    for line in event.splitlines():
        if line.startswith(b"error:"):
            return line[6:].strip().decode("utf-8", "replace") or "error"
    data = event_data(event)
    document = json_or_none(data) if data is not None and data != b"[DONE]" else None
    if isinstance(document, dict) and "error" in document:
        _type, message, _code = protocol.upstream_error_fields(json.dumps(document).encode())
        return message or "error"
    if isinstance(document, dict) and document.get("type") == "error":  # Responses' error event
        text = document.get("message")
        return text if isinstance(text, str) and text else "error"
    return None

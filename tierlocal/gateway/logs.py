"""The gateway's log: one line per event, never a traceback for a client's bad input, and never
what a client sent. aiohttp's server logs a malformed request (a header with a bare CR, a NUL,
a broken chunk) as ``Error handling request`` with the parser's exception, whose message
quotes the offending bytes — an ``Authorization`` header among them. The filter here turns
those records into one line naming the peer and the parser's reason, without the bytes."""

from __future__ import annotations

import logging
import sys

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["configure_logging", "ClientErrorFilter"]


class ClientErrorFilter(logging.Filter):
    """Rewrites aiohttp.server's records about malformed requests and lost clients."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            reason = str(error.message).split("\n", 1)[0].strip().rstrip(":") or "malformed request"
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "refused a malformed HTTP request from %s (%d): %s", (peer, error.code, reason)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        elif isinstance(error, ConnectionError):
            record.msg, record.args = "a client left before its request was read: %s", (type(error).__name__,)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


def configure_logging() -> None:
    """Timestamped lines on stderr (the journal under systemd), with the filter on aiohttp's
    server logger."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(existing, ClientErrorFilter) for existing in server.filters):
        server.addFilter(ClientErrorFilter())

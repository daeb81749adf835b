"""Every error tierlocal shows to a user.

The tree::

    TierlocalError                 base; ``hint`` says what to do next
    ├── UsageError                 a bad option value (size, GPU name, source spec)
    ├── HeaderError                a GGUF header that is truncated, corrupt or hostile
    ├── SourceError                a file, URL or hub repo that cannot be read
    ├── HardwareError              a GPU override that names nothing we know
    ├── UnsupportedModelError      a model whose memory rules the estimator does not know yet
    └── CatalogError               recipes/ data that is missing or malformed

The CLI catches ``TierlocalError`` in one place, prints ``error: <message>`` and
``hint: <hint>`` to stderr and exits with ``exit_code``. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "TierlocalError",
    "UsageError",
    "HeaderError",
    "SourceError",
    "HardwareError",
    "CatalogError",
    "UnsupportedModelError",
]


class TierlocalError(Exception):
    """An error meant for the user: one line, plus an optional hint."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UsageError(TierlocalError):
    """An option or argument value that cannot be understood."""

    exit_code = 2


class HeaderError(TierlocalError):
    """A GGUF header that cannot be parsed.

    ``source`` names the file or URL, ``offset`` is the byte offset (from the start of
    that file) at which the problem was found.
    """

    exit_code = 2

    def __init__(self, source: str, offset: int, what: str, *, hint: str | None = None) -> None:
        super().__init__(f"{source}: at byte {offset}: {what}", hint=hint)
        self.source = source
        self.offset = offset
        self.what = what


class SourceError(TierlocalError):
    """A model source (path, URL, hf:// spec) that cannot be opened or read."""

    exit_code = 2

    def __init__(self, source: str, what: str, *, hint: str | None = None) -> None:
        super().__init__(f"{source}: {what}", hint=hint)
        self.source = source


class HardwareError(TierlocalError):
    """A ``--gpu`` override that does not name a known GPU or a size."""

    exit_code = 2


class UnsupportedModelError(TierlocalError):
    """A model whose cache design (MLA, recurrent, hybrid) the estimator does not model yet."""

    exit_code = 2


class CatalogError(TierlocalError):
    """recipes/ data that is missing or malformed."""

"""Every error tierlocal shows to a user.

The tree::

    TierlocalError                 base; ``hint`` says what to do next (exit code 1)
    ├── UsageError                 a bad option value (size, GPU name, source spec)       exit 2
    ├── HeaderError                a GGUF header that is truncated, corrupt or hostile   exit 2
    ├── SourceError                a file, URL or hub repo that cannot be read           exit 2
    ├── HardwareError              a GPU override that names nothing we know             exit 2
    ├── CatalogError               recipes/ data that is missing or malformed
    ├── EngineError                an engine binary that cannot be run, built or used
    │   ├── EngineFailed           the engine died, or never became healthy
    │   │   ├── AllocationFailed   it could not allocate a buffer while loading
    │   │   └── MemberLoadFailed  a model set's member did not load (or broke its plan)
    │   └── CalibrationFailed      its timings here do not determine the speed figures
    ├── DownloadError              a download that could not finish
    │   ├── PartialDownload        the connection kept failing; the bytes so far are kept
    │   └── DiskFullError          not enough free disk for it
    └── Interrupted                Ctrl-C during long work (what was done is kept)      exit 130

Exit codes, the same for every command:

    0    done
    1    it could not be done: an engine failed, a download stopped, nothing is running, the
         catalog data is broken (``TierlocalError`` and the classes above without a code)
    2    the input cannot be used: an option, a GGUF header, a GPU name, a source that cannot
         be read (missing, unreachable, refused), an engine path that points nowhere (fix it and
         rerun; tests/test_error_paths.py runs each command's)
    130  interrupted (Ctrl-C); what was done is kept

The CLI catches ``TierlocalError`` in one place, prints ``error: <message>`` and
``hint: <hint>`` to stderr and exits with ``exit_code``. Anything else is a bug and
keeps its traceback. Private control-flow exceptions (a retry signal inside one module) live
where they are raised and never reach the user.
"""

from __future__ import annotations

__all__ = [
    "TierlocalError",
    "UsageError",
    "HeaderError",
    "SourceError",
    "HardwareError",
    "CatalogError",
    "EngineError",
    "EngineFailed",
    "AllocationFailed",
    "MemberLoadFailed",
    "DownloadError",
    "PartialDownload",
    "DiskFullError",
    "Interrupted",
    "CalibrationFailed",
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


class CatalogError(TierlocalError):
    """recipes/ data that is missing or malformed."""


class EngineError(TierlocalError):
    """An engine binary (llama-server, ollama, llama-cpp-python) that cannot be run, built,
    or does not accept what the plan needs."""


class EngineFailed(EngineError):
    """The engine died or never became healthy."""


class CalibrationFailed(EngineError):
    """The engine's timings on this machine do not determine the speed figures."""


class AllocationFailed(EngineFailed):
    """The engine could not allocate a buffer while loading; ``report`` is the load log so far
    (a :class:`tierlocal.engines.loadlog.LoadReport`), which says what it refused."""

    def __init__(self, message: str, report: object, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report


class MemberLoadFailed(EngineFailed):
    """A member of a served model set did not load, or its load broke the set's plan."""


class DownloadError(TierlocalError):
    """A download that could not finish."""


class PartialDownload(DownloadError):
    """The transfer stopped; the bytes so far are kept for the next run."""


class DiskFullError(DownloadError):
    """Not enough free disk for the download."""


class Interrupted(TierlocalError):
    """Ctrl-C during long work (a download): what was done so far is kept."""

    exit_code = 130

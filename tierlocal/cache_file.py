"""One file of work derived from tierlocal's own code and recipes/ alone, kept between runs
(the catalog's planning digests, fits of the published figures, the recipes parsed): named
sections of plain data.

The file is ``$XDG_CACHE_HOME/tierlocal/planning/INSTALL-FINGERPRINT.marshal`` (``~/.cache/…``).
INSTALL names where the package is installed; FINGERPRINT what the contents follow from:
tierlocal's version, the Python that wrote them (``marshal``'s format changes between versions),
and the size and modification time of every file of the installed package (recipes/ is packed
inside a wheel; a source tree's recipes/ beside it counts too). A section missing from it, or
one that does not load, is computed and the file written again (whole, atomically: a reader sees
the old file or the new); the same install's files of other fingerprints are removed then, and
any other install's file unused for :data:`_UNUSED_DAYS` days. Two installs sharing the
directory (a virtual environment beside a user install) keep a file each instead of removing
each other's at every run. A file that cannot be read or written costs only the time:
everything is computed as if there were none.

I/O: the cache file. Stores nothing it did not compute from the package; ``marshal`` is read
only from this directory, as Python reads its own bytecode cache.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import marshal
import os
import struct
import sys
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from . import __version__, constants

__all__ = ["cache_path", "cached", "save", "section"]

T = TypeVar("T")
#: The largest cache file read back (bytes): the whole catalog's digests are under 1 MiB.
_MAX_CACHE_BYTES = 64 << 20
_PACKAGE = Path(__file__).parent
#: Another install's cache file unused (not read nor written) this many days is removed.
_UNUSED_DAYS = 30
#: The file's sections once read, for the life of this process, and whether some were added
#: since it was last written.
_sections: dict[str, Any] | None = None
_unsaved = False


def _same(value: Any) -> Any:
    return value


def cached(section: str, build: Callable[[], T], dump: Callable[[T], Any] = _same, load: Callable[[Any], T] = _same) -> T:
    """The value the cache keeps as ``section`` (``load`` of its plain form), else ``build()``'s,
    kept as ``dump`` of it (written when the process ends, or at the next :func:`save`). ``load``
    raises ValueError (or KeyError, TypeError) on a form it cannot take: the value is then built
    again. A form ``marshal`` cannot store is not kept."""
    sections = _read_sections()
    if section in sections:
        try:
            return load(sections[section])
        except (KeyError, TypeError, ValueError):
            pass
    value = build()
    plain = dump(value)
    try:
        marshal.dumps(plain)
    except ValueError:
        return value
    sections[section] = plain
    _save_at_exit()
    return value


def _save_at_exit() -> None:
    global _unsaved
    if not _unsaved:
        _unsaved = True
        atexit.register(_save_if_unsaved)


def _save_if_unsaved() -> None:
    if _unsaved:
        save()


def section(name: str) -> dict[str, Any]:
    """The cache's section ``name``: a dict of plain values to read and add to (then :func:`save`)."""
    found = _read_sections().setdefault(name, {})
    if not isinstance(found, dict):
        found = _read_sections()[name] = {}
    return found


def save() -> None:
    """Write the sections as they are now."""
    global _unsaved
    _unsaved = False
    _write(_read_sections())


def cache_path() -> Path:
    """The cache file for this tierlocal, this Python and these recipes."""
    return constants.cache_dir() / "planning" / f"{_install()}-{_fingerprint()}.marshal"


@cache
def _install() -> str:
    """Where this tierlocal is installed, hashed (the file name's first part)."""
    return hashlib.sha256(str(_PACKAGE.resolve()).encode()).hexdigest()[:8]


@cache
def _fingerprint() -> str:
    """What the cache follows from, hashed: tierlocal's version, this Python, and every file of the
    package and of a source tree's recipes/ as the file system describes it."""
    digest = hashlib.sha256(f"{__version__}|{sys.version}|{marshal.version}".encode())
    for root in (_PACKAGE, _PACKAGE.parent / "recipes"):
        for name, size, mtime_ns in sorted(_files(str(root))):
            digest.update(f"|{name}:{size}:{mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _files(directory: str, prefix: str = "") -> Iterator[tuple[str, int, int]]:
    """(path under ``directory``, size, modification time in ns) of every file at any depth but
    bytecode caches (os.scandir: the stat comes with the listing)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    yield from _files(entry.path, f"{prefix}{entry.name}/")
            else:
                stat = entry.stat()
                yield f"{prefix}{entry.name}", stat.st_size, stat.st_mtime_ns


def _read_sections() -> dict[str, Any]:
    """The cache file's sections ({} when there is none, or it is damaged), read once."""
    global _sections
    if _sections is None:
        _sections = {}
        path = cache_path()
        try:
            stat = path.stat()
            if stat.st_size <= _MAX_CACHE_BYTES:
                data = marshal.loads(path.read_bytes())
                _sections = data if isinstance(data, dict) else {}
            if stat.st_mtime < time.time() - 86400:  # in use: marked for other installs' clean-up, once a day at most
                os.utime(path)
        except (OSError, EOFError, ValueError, TypeError):
            pass
    return _sections


def _write(sections: dict[str, Any]) -> None:
    """Replace the cache file at once, and remove this install's of other fingerprints and other
    installs' unused for :data:`_UNUSED_DAYS` days; a file that cannot be written is left
    unwritten."""
    path = cache_path()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(marshal.dumps(_shared(sections, {})))
        temporary.replace(path)
        unused_since = time.time() - _UNUSED_DAYS * 86400
        for stale in path.parent.glob("*.marshal"):
            if stale != path and (stale.name.startswith(f"{_install()}-") or _used_before(stale, unused_since)):
                stale.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def _used_before(path: Path, when: float) -> bool:
    """Whether ``path`` was last read or written before ``when`` (seconds since the epoch)."""
    try:
        stat = path.stat()
    except OSError:
        return False
    return max(stat.st_atime, stat.st_mtime) < when


def _shared(value: Any, pool: dict[tuple[Any, ...], Any]) -> Any:
    """``value`` with every equal tuple, dict, number and string one object: ``marshal`` writes
    an object referenced many times once, and reads it back once. A model's layers repeat the
    same features and layouts: the whole catalog's file shrinks about 4×, and reads 9× faster.
    Dicts keep their order (the planner sums their values in it); 0.0 and -0.0, True and 1 stay
    apart."""
    if isinstance(value, tuple):
        items = tuple(_shared(item, pool) for item in value)
        return pool.setdefault((tuple, *map(id, items)), items)
    if isinstance(value, dict):
        entries = {_shared(key, pool): _shared(item, pool) for key, item in value.items()}
        return pool.setdefault((dict, *(id(part) for pair in entries.items() for part in pair)), entries)
    if isinstance(value, float):
        return pool.setdefault((float, struct.pack("<d", value)), value)
    if isinstance(value, int | str) and not isinstance(value, bool):
        return pool.setdefault((type(value), value), value)
    return value

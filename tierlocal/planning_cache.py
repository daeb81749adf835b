"""Planning work that follows from recipes/ and tierlocal's own code alone, done once and kept
between runs: every catalog entry's spec with its per-tensor work done
(:mod:`tierlocal.fit.digest`), and the fits of the published figures (quality scores, GPU
speeds) — so that ``check`` over the whole catalog parses no header, groups no tensor and fits
nothing once the cache is warm; what it still does per run is the planning for this machine.

The cache is one file, ``$XDG_CACHE_HOME/tierlocal/planning/FINGERPRINT.marshal``
(``~/.cache/…``), of named sections in plain data. Its name is a fingerprint of what the
contents follow from: their layout, tierlocal's version, the Python that wrote them
(``marshal``'s format changes between versions), and the size and modification time of every
source file of tierlocal and every file of recipes/. A section missing from it, or one that does
not load, is computed and the file written again (whole, atomically: a reader sees the old file
or the new); files of other fingerprints are removed then. A file that cannot be read or written
costs only the time: everything is computed as if there were none.

A catalog entry's digest serves a device that binds every tensor (no ``max_tensor_bytes``), one
GPU or none: a split across GPUs or a device with a binding limit plans from the headers.

I/O: the cache file, and the compact headers (through :mod:`tierlocal.catalog`).
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from . import __version__, constants
from .catalog import ModelEntry, load_entry_headers, recipes_dir
from .fit.digest import DIGEST_VERSION, spec_digest, spec_from_digest
from .fit.model import ModelSpec, model_spec
from .gguf import ModelSummary, summarize

__all__ = ["CatalogModel", "cache_path", "cached", "catalog_models"]

T = TypeVar("T")
#: A catalog entry's spec and summary.
CatalogModel = tuple[ModelSpec, ModelSummary]
#: The largest cache file read back (bytes): the whole catalog's digests are a few MiB.
_MAX_CACHE_BYTES = 64 << 20
_PACKAGE = Path(__file__).parent
#: The cache file's sections once read, and the catalog models restored from them, for the life
#: of this process (a terminal UI replans often).
_sections: dict[str, Any] | None = None
_restored: dict[str, CatalogModel] = {}


def cached(section: str, build: Callable[[], T], dump: Callable[[T], Any], load: Callable[[Any], T]) -> T:
    """The value the cache keeps as ``section`` (``load`` of its plain form), else ``build()``'s,
    kept as ``dump`` of it. ``load`` raises ValueError (or KeyError, TypeError) on a form it
    cannot take: the value is then built again."""
    sections = _read_sections()
    if section in sections:
        try:
            return load(sections[section])
        except (KeyError, TypeError, ValueError):
            pass
    value = build()
    sections[section] = dump(value)
    _write(sections)
    return value


def catalog_models(entries: Sequence[ModelEntry], *, from_digests: bool = True) -> dict[str, CatalogModel]:
    """Spec and summary of every entry with a compact header, by entry key: restored from the
    cache's digests (``from_digests``), else planned from the headers.

    Raises:
        CatalogError: a compact header is unreadable.
    """
    with_header = [(entry, entry.header_file) for entry in entries if entry.header_file is not None]
    if not from_digests:
        return {entry.key: _from_header(entry) for entry, _file in with_header}
    missing = [(entry, file) for entry, file in with_header if file not in _restored]
    if missing:
        _restore(missing)
    return {entry.key: _restored[file] for entry, file in with_header}


def _restore(missing: list[tuple[ModelEntry, str]]) -> None:
    """Restore ``missing`` entries from the cache file's digests, adding those it lacks."""
    digests = _read_sections().setdefault("models", {})
    added = False
    shared: dict[int, tuple[Any, Any]] = {}
    for entry, file in missing:
        restored = _restored_or_none(digests.get(file), shared)
        if restored is None:
            digests[file] = spec_digest(*_from_header(entry))
            restored, added = spec_from_digest(digests[file]), True
        _restored[file] = restored
    if added:
        _write(_read_sections())


def _from_header(entry: ModelEntry) -> CatalogModel:
    headers = load_entry_headers(entry) or []
    return model_spec(headers), summarize(headers)


def _restored_or_none(digest: object, shared: dict[int, tuple[Any, Any]]) -> CatalogModel | None:
    if not isinstance(digest, dict):
        return None
    try:
        return spec_from_digest(digest, shared)
    except ValueError:
        return None


def cache_path() -> Path:
    """The cache file for this tierlocal, this Python and these recipes."""
    return constants.cache_dir() / "planning" / f"{_fingerprint()}.marshal"


@cache
def _fingerprint() -> str:
    """What the cache follows from, hashed: the digest's layout, tierlocal's version, this Python,
    and every source file of tierlocal and file of recipes/ as the file system describes it."""
    digest = hashlib.sha256(f"{DIGEST_VERSION}|{__version__}|{sys.version}|{marshal.version}".encode())
    for root, suffix in ((_PACKAGE, ".py"), (recipes_dir(), "")):
        for name, size, mtime_ns in sorted(_files(str(root), suffix)):
            digest.update(f"|{name}:{size}:{mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _files(directory: str, suffix: str, prefix: str = "") -> Iterator[tuple[str, int, int]]:
    """(path under ``directory``, size, modification time in ns) of every file ending in
    ``suffix`` at any depth (os.scandir: the stat comes with the listing)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    yield from _files(entry.path, suffix, f"{prefix}{entry.name}/")
            elif entry.name.endswith(suffix):
                stat = entry.stat()
                yield f"{prefix}{entry.name}", stat.st_size, stat.st_mtime_ns


def _read_sections() -> dict[str, Any]:
    """The cache file's sections ({} when there is none, or it is damaged), read once."""
    global _sections
    if _sections is None:
        _sections = {}
        path = cache_path()
        try:
            if path.stat().st_size <= _MAX_CACHE_BYTES:
                data = marshal.loads(path.read_bytes())
                _sections = data if isinstance(data, dict) else {}
        except (OSError, EOFError, ValueError, TypeError):
            pass
    return _sections


def _write(sections: dict[str, Any]) -> None:
    """Replace the cache file at once, and remove those of other fingerprints; a file that
    cannot be written is left unwritten."""
    path = cache_path()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(marshal.dumps(_shared(sections, {})))
        temporary.replace(path)
        for stale in path.parent.glob("*.marshal"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


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

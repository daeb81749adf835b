"""The catalog's models as the planner takes them — each entry's :class:`ModelSpec` and
:class:`ModelSummary` — restored from their planning digests (:mod:`tierlocal.fit.digest`) in
the cache file (:mod:`tierlocal.cache_file`), so that ``check`` over the whole catalog parses
no header and groups no tensor once the cache is warm; what it still does per run is the
planning for this machine. An entry missing from the cache is planned from its header and
added (about 10 ms of CPU each).

A digest serves devices that bind every tensor (no ``max_tensor_bytes``: one GPU, several, or
none); a device with a binding limit plans from the headers.

I/O: the compact headers (through :mod:`tierlocal.catalog`) and the cache file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import cache_file
from .catalog import ModelEntry, load_entry_headers
from .fit.digest import DIGEST_VERSION, spec_digest, spec_from_digest
from .fit.model import ModelSpec, model_spec
from .gguf import ModelSummary, summarize

__all__ = ["CatalogModel", "catalog_models"]

#: A catalog entry's spec and summary.
CatalogModel = tuple[ModelSpec, ModelSummary]
#: The catalog models restored, by compact header file, for the life of this process (a
#: terminal UI replans often).
_restored: dict[str, CatalogModel] = {}
#: The cache section that holds the digests (its layout's version in the name).
_SECTION = f"models-v{DIGEST_VERSION}"


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
    digests = cache_file.section(_SECTION)
    added = False
    shared: dict[int, tuple[Any, Any]] = {}
    for entry, file in missing:
        restored = _restored_or_none(digests.get(file), shared)
        if restored is None:
            digests[file] = spec_digest(*_from_header(entry))
            restored, added = spec_from_digest(digests[file]), True
        _restored[file] = restored
    if added:
        cache_file.save()


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

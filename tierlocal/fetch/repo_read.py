"""A Hub repository's GGUF files as quantisations: the files grouped (every shard of a split
file together, ``mmproj`` projectors apart), and each quantisation's headers read with range
requests — in parallel, at most :data:`MAX_WORKERS` at once, and kept by each file's LFS sha256
(:class:`HeaderCache`) so that a second read of the same files fetches no byte of them.

I/O: the hub (through :mod:`.hub` and :mod:`.sources`) and the header cache's directory.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .. import constants
from ..errors import HeaderError, SourceError, TierlocalError
from ..gguf.compact import CompactError, from_compact, to_compact
from ..gguf.parse import ArraySummary, GGUFHeader, HeaderLimits, ends_at_its_data, parse_header
from .hub import SHARD_NAME, RepoFile, RepoListing, file_set_key, quant_of
from .sources import HttpRangeReader, SourceSpec, hf_reader

if TYPE_CHECKING:
    import httpx2

__all__ = ["MAX_WORKERS", "RepoQuant", "QuantHeaders", "HeaderCache", "ArrayBytes", "default_header_cache", "repo_quants", "read_quant_headers"]

#: Header reads in flight at once (each a HEAD to the hub and one or two range requests).
MAX_WORKERS = 8
#: Quantisation sets one repository may hold before the rest are left unread.
MAX_QUANTS = 200
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: The first read of a repository's later files (bytes): its first file gave their vocabulary,
#: so what is left to read is a few KB before it and the tensor list after it, not the 256 KB a
#: whole vocabulary wants.
SMALL_FIRST_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class RepoQuant:
    """One quantisation of a repository: its file, or every shard of a split one, and its label
    (``Q4_K_M``, ``UD-Q4_K_XL``; the file name where no label shows or two would clash)."""

    label: str
    files: tuple[RepoFile, ...]
    projector: bool
    #: Every shard the file names is in the listing.
    complete: bool = True

    @property
    def size(self) -> int:
        """The file's bytes, all shards."""
        return sum(f.size for f in self.files)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)

    def to_json(self) -> dict[str, object]:
        return {"quant": self.label, "files": list(self.paths), "file_bytes": self.size, "projector": self.projector, "complete": self.complete}


@dataclass(frozen=True)
class QuantHeaders:
    """A quantisation's headers as read (empty with ``error``: why they could not be), the body
    bytes fetched for them (0 from the cache) and whether the cache held them all."""

    quant: RepoQuant
    headers: tuple[GGUFHeader, ...]
    bytes_read: int
    cached: bool
    error: str | None = None


def _label(key: str) -> str:
    base = key.rsplit("/", 1)[-1].removesuffix(".gguf")
    quant = quant_of(key)
    if quant is None:
        return base
    # A publisher's prefix that is part of the recipe (unsloth's dynamic "UD-", mradermacher's imatrix "i1-").
    prefix = re.search(rf"(?<![A-Za-z0-9])(UD|i1)-{re.escape(quant)}", base, re.IGNORECASE)
    return f"{prefix.group(1)}-{quant}" if prefix else quant


def repo_quants(listing: RepoListing) -> list[RepoQuant]:
    """The listing's GGUF files as quantisations, split shards grouped, smallest first (at most
    :data:`MAX_QUANTS`)."""
    sets: dict[str, list[RepoFile]] = {}
    for repo_file in listing.files:
        sets.setdefault(file_set_key(repo_file.path), []).append(repo_file)
    labels = {key: _label(key) for key in sets}
    clashing = {label for label in labels.values() if list(labels.values()).count(label) > 1}
    quants = []
    for key, files in sets.items():
        label = labels[key] if labels[key] not in clashing else key.rsplit("/", 1)[-1].removesuffix(".gguf")
        quants.append(RepoQuant(label, tuple(sorted(files, key=lambda f: f.path)), "mmproj" in key.lower(), _complete(files)))
    return sorted(quants, key=lambda q: (q.size, q.label))[:MAX_QUANTS]


def _complete(files: Sequence[RepoFile]) -> bool:
    match = SHARD_NAME.match(files[0].path)
    if match is None:
        return len(files) == 1
    indices = sorted(int(m.group("index")) for f in files if (m := SHARD_NAME.match(f.path)))
    return indices == list(range(1, int(match.group("count")) + 1))


class HeaderCache:
    """One compact header (:mod:`tierlocal.gguf.compact`) per file, named by the file's LFS
    sha256: the same bytes on any repository, revision or publisher give the same header."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, sha256: str | None) -> Path | None:
        return self.directory / f"{sha256}.json" if sha256 is not None and _SHA256.match(sha256) else None

    def get(self, repo_file: RepoFile, name: str) -> GGUFHeader | None:
        """The cached header of ``repo_file`` named ``name`` (None: not cached, or unreadable)."""
        path = self._path(repo_file.sha256)
        if path is None or not path.is_file():
            return None
        try:
            (header,) = from_compact(json.loads(path.read_text()), name)
        except (OSError, ValueError, CompactError):
            return None
        return header if header.file_bytes == repo_file.size else None

    def put(self, repo_file: RepoFile, header: GGUFHeader) -> None:
        """Keep ``header`` (written whole, then renamed into place: a reader never sees half)."""
        path = self._path(repo_file.sha256)
        if path is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.directory, suffix=".tmp", delete=False) as handle:
                json.dump(to_compact([header], array_bytes=True), handle)
            os.replace(handle.name, path)
        except OSError:
            return  # a cache that cannot be written costs a second read, nothing else


def default_header_cache() -> HeaderCache:
    """Where Hub headers are kept by their files' sha256 (``~/.cache/tierlocal/hub-headers``)."""
    return HeaderCache(constants.cache_dir() / "hub-headers")


class ArrayBytes:
    """The byte lengths of the long string arrays (vocabularies) of every header seen, by key,
    element type and length: a later file with an array of the same three passes over it by that
    length (:func:`~tierlocal.gguf.parse.parse_header`'s ``known_bytes``). One model's
    quantisations share a vocabulary, and so do the fine-tunes of a base.

    Thread-safe, and read once: a thread that meets an array another thread is reading right now
    waits for it (at most ``wait_s`` seconds) rather than fetching the same megabytes itself."""

    def __init__(self, wait_s: float = 30.0) -> None:
        self._bytes: dict[tuple[str, str, int], int] = {}
        #: The arrays being read now, and by which thread.
        self._reading: dict[tuple[str, str, int], int] = {}
        self._changed = threading.Condition()
        self.wait_s = wait_s

    def learn(self, header: GGUFHeader) -> None:
        with self._changed:
            for key, value in header.metadata.items():
                if isinstance(value, ArraySummary) and value.element_type == "STRING" and value.byte_length:
                    self._bytes.setdefault((key, value.element_type, value.length), value.byte_length)
            self._changed.notify_all()

    def release(self) -> None:
        """This thread reads no array any longer (its header is learnt, or its read failed)."""
        me = threading.get_ident()
        with self._changed:
            for array in [array for array, reader in self._reading.items() if reader == me]:
                del self._reading[array]
            self._changed.notify_all()

    def __call__(self, key: str, element_type: str, length: int) -> int | None:
        array, me = (key, element_type, length), threading.get_ident()
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            while array not in self._bytes and self._reading.get(array, me) != me:
                if not self._changed.wait(max(deadline - time.monotonic(), 0)) and time.monotonic() >= deadline:
                    return None
            if array in self._bytes:
                return self._bytes[array]
            self._reading[array] = me  # this thread reads it; the others wait for what it learns
            return None


def read_quant_headers(
    listing: RepoListing,
    quants: Sequence[RepoQuant],
    cache: HeaderCache | None,
    *,
    revision: str | None = None,
    workers: int = MAX_WORKERS,
    progress: Callable[[RepoQuant], None] | None = None,
    known: ArrayBytes | None = None,
) -> list[QuantHeaders]:
    """Each of ``quants``' headers, read at the listing's commit or taken from ``cache``; the
    first, then the others in parallel (``workers`` at once), each passing over a vocabulary a
    header seen before held (``known``, shared between repositories by a search; else this
    repository's own) and read again in full where the header then does not end at its data.
    ``progress`` is called as each quantisation is done.

    A quantisation whose header cannot be read carries the error; a repository whose files the
    token cannot read (gated, private) raises it, since no file of it will read either.

    Raises:
        SourceError: the hub refused access or rate-limited the reads.
    """
    from huggingface_hub import get_session

    spec = SourceSpec("hf", f"hf://{listing.repo_id}", "", repo_id=listing.repo_id, revision=revision or listing.commit)
    read = partial(_read_quant, spec, get_session(), cache, progress, known or ArrayBytes())
    if not quants:
        return []
    first = read(quants[0], constants.REMOTE_FIRST_READ_BYTES)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(quants)))) as pool:
        return [first, *pool.map(partial(read, first_read=SMALL_FIRST_READ_BYTES), quants[1:])]


def _read_quant(
    spec: SourceSpec,
    client: httpx2.Client,
    cache: HeaderCache | None,
    progress: Callable[[RepoQuant], None] | None,
    known: ArrayBytes,
    quant: RepoQuant,
    first_read: int,
) -> QuantHeaders:
    headers, fetched, cached = [], 0, True
    try:
        for repo_file in quant.files:
            name = f"hf://{spec.repo_id}/{repo_file.path}"
            header = cache.get(repo_file, name) if cache is not None else None
            if header is None:
                cached = False
                header, count = _read_file(spec, client, repo_file.path, name, known, first_read)
                fetched += count
                if cache is not None:
                    cache.put(repo_file, header)
            known.learn(header)
            headers.append(header)
    except SourceError as exc:
        if _access_refused(exc):
            # Named by the repository: no file of it will read either.
            raise SourceError(spec.text, str(exc).removeprefix(f"{exc.source}: "), hint=exc.hint) from None
        return QuantHeaders(quant, (), fetched, False, str(exc))
    except TierlocalError as exc:
        return QuantHeaders(quant, (), fetched, False, str(exc))
    finally:
        if progress is not None:
            progress(quant)
    return QuantHeaders(quant, tuple(headers), fetched, cached)


def _read_file(spec: SourceSpec, client: httpx2.Client, path: str, name: str, known: ArrayBytes, first: int) -> tuple[GGUFHeader, int]:
    """One file's header and the body bytes fetched for it, reading ``first`` bytes first: passing
    over the vocabularies ``known`` holds where the header then ends at its data, else read again
    in full."""
    reader: HttpRangeReader = hf_reader(spec, path, client, first_read_bytes=first)
    try:
        try:
            header = parse_header(reader, HeaderLimits(first_read_bytes=first), known_bytes=known)
            if not ends_at_its_data(header):
                header = parse_header(reader)
        except HeaderError:
            header = parse_header(reader)
        known.learn(header)
    finally:
        known.release()
    return replace(header, source=name), reader.bytes_read


def _access_refused(error: SourceError) -> bool:
    return any(words in str(error) for words in ("gated", "access denied", "not found, or private", "rate-limiting", "HF_HUB_OFFLINE"))

"""A resumable, verified download of one file.

Bytes go to ``FINAL.partial`` beside the final path, with a ``FINAL.partial.json`` that says
which file (size and sha256) they belong to. A rerun — after Ctrl-C, kill -9 or a dropped
connection — asks for the missing range only. Only when the size and the sha256 match (and
the caller's check passes) is the file renamed to its final path, so a truncated or
unverified file is never there.

huggingface_hub's own downloader is not used for the bytes: since 1.x it writes to a
temporary file unique to each process and deletes it on failure, so a second run starts from
zero. Everything else (endpoint, token, redirects, metadata) still goes through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import constants
from ..errors import PartialDownload, SourceError, TierlocalError

if TYPE_CHECKING:  # httpx2 loads when a download starts, not with every command that imports this
    import httpx2

__all__ = ["DownloadedFile", "download_file", "partial_paths", "partial_bytes"]

#: Bytes read from the network per write.
_CHUNK = 1 << 20
#: Times one file's transfer is resumed within a run after a dropped connection.
MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class DownloadedFile:
    """A verified file at its final path: size (bytes) and sha256 (hex); ``fetched_bytes`` is
    what this run transferred (0 when it was already complete)."""

    path: Path
    size: int
    sha256: str
    fetched_bytes: int

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "bytes": self.size, "sha256": self.sha256, "fetched_bytes": self.fetched_bytes}


def partial_paths(final: Path) -> tuple[Path, Path]:
    """The partial data file and its sidecar for ``final``."""
    return final.with_name(final.name + ".partial"), final.with_name(final.name + ".partial.json")


def partial_bytes(final: Path, size: int, sha256: str | None) -> int:
    """Bytes of ``final`` already downloaded by an earlier run (0 when none or unusable)."""
    data, sidecar = partial_paths(final)
    try:
        recorded = json.loads(sidecar.read_text())
        have = data.stat().st_size
    except (OSError, ValueError):
        return 0
    if recorded != {"size": size, "sha256": sha256} or have > size:
        return 0
    return have


def _sha256_of(path: Path, limit: int | None = None) -> hashlib._Hash:
    digest = hashlib.sha256()
    remaining = path.stat().st_size if limit is None else limit
    with path.open("rb") as handle:
        while remaining > 0:
            block = handle.read(min(_CHUNK * 8, remaining))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
    return digest


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def download_file(
    name: str,
    locate: Callable[[], tuple[str, dict[str, str]]],
    final: Path,
    *,
    size: int,
    sha256: str | None,
    check: Callable[[Path], None] | None = None,
    progress: Callable[[int], None] | None = None,
    client: httpx2.Client | None = None,
) -> DownloadedFile:
    """Fetch ``size`` bytes into ``final``, resuming an earlier partial, and verify them.

    Args:
        name: how errors name the file (no secrets: no token, no signed URL).
        locate: returns the URL and headers to fetch from; called again for each attempt,
            since a signed redirect URL may expire.
        final: the final path; its directory must exist.
        size: expected size in bytes.
        sha256: expected sha256 (hex), or None when the source publishes none.
        check: called with the complete, checksum-verified partial before it is renamed
            (e.g. the GGUF header must parse); raises to refuse the file.
        progress: called with the number of new bytes as they arrive.

    Raises:
        SourceError: the server refuses, or the bytes do not match (the partial is deleted).
        PartialDownload: the connection kept failing; the bytes so far are kept.
    """
    data, sidecar = partial_paths(final)
    have = partial_bytes(final, size, sha256)
    if have == 0:
        data.unlink(missing_ok=True)
        sidecar.write_text(json.dumps({"size": size, "sha256": sha256}))
    digest = _sha256_of(data, have) if have else hashlib.sha256()
    import httpx2

    own_client = client is None
    http = client or httpx2.Client(timeout=constants.DEFAULT_HTTP_TIMEOUT_S, follow_redirects=False)
    try:
        fetched, digest = _transfer(name, http, locate, data, have, size, digest, progress)
        actual = _verify(name, data, sidecar, size, sha256, digest, check)
        with data.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(data, final)
        sidecar.unlink(missing_ok=True)
        _fsync_dir(final.parent)
        return DownloadedFile(final, size, actual, fetched)
    finally:
        if own_client:
            http.close()


def _transfer(
    name: str,
    http: httpx2.Client,
    locate: Callable[[], tuple[str, dict[str, str]]],
    data: Path,
    have: int,
    size: int,
    digest: hashlib._Hash,
    progress: Callable[[int], None] | None,
) -> tuple[int, hashlib._Hash]:
    """Append to ``data`` until it holds ``size`` bytes, resuming a dropped connection up to
    MAX_ATTEMPTS times; returns the bytes this run fetched and the digest of them all.

    Raises:
        PartialDownload: the connection kept failing (the bytes so far stay in ``data``).
        SourceError: the server refused, or sent nothing.
    """
    import httpx2

    fetched = 0
    attempt = 0
    while have < size:
        attempt += 1
        try:
            received = _fetch_range(name, http, locate, data, have, size, digest, progress)
        except _RestartFromZero:
            have, digest = 0, hashlib.sha256()
            continue
        except httpx2.TransportError as exc:
            now_have = data.stat().st_size if data.exists() else 0
            fetched += now_have - have
            have = now_have
            if attempt >= MAX_ATTEMPTS:
                raise PartialDownload(
                    f"{name}: the connection kept failing ({type(exc).__name__}); {have:,} of {size:,} bytes kept",
                    hint="run the same command again to resume",
                ) from None
            time.sleep(min(2 ** (attempt - 1), 8) * 0.25)
            continue
        have += received
        fetched += received
        if received == 0:
            raise SourceError(name, "the server sent no data", hint="try again later")
    return fetched, digest


def _verify(name: str, data: Path, sidecar: Path, size: int, sha256: str | None, digest: hashlib._Hash, check: Callable[[Path], None] | None) -> str:
    """The complete partial's sha256 (hex), once its size, checksum and ``check`` agree; a
    partial that fails is deleted.

    Raises:
        SourceError, TierlocalError: it does not (the message says which).
    """
    if data.stat().st_size != size:
        data.unlink(missing_ok=True)
        raise SourceError(name, f"got {data.stat().st_size if data.exists() else 0:,} bytes, expected {size:,}", hint="run the command again")
    actual = digest.hexdigest()
    if sha256 is not None and actual != sha256.lower():
        data.unlink(missing_ok=True)
        sidecar.unlink(missing_ok=True)
        raise SourceError(
            name,
            f"checksum mismatch: sha256 {actual[:16]}… but the hub says {sha256[:16]}…; the download was deleted",
            hint="run the command again; if it repeats, the repo's file or a proxy is corrupt",
        )
    if check is not None:
        try:
            check(data)
        except TierlocalError:
            data.unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            raise
    return actual


class _RestartFromZero(Exception):
    """The server ignored our Range and sent the whole file: the partial was truncated."""


def _fetch_range(
    name: str,
    http: httpx2.Client,
    locate: Callable[[], tuple[str, dict[str, str]]],
    data: Path,
    start: int,
    size: int,
    digest: hashlib._Hash,
    progress: Callable[[int], None] | None,
) -> int:
    """Append bytes from ``start`` to ``data``; returns how many arrived."""
    url, headers = locate()
    request_headers = dict(headers)
    if start:
        request_headers["Range"] = f"bytes={start}-"
    received = 0
    with http.stream("GET", url, headers=request_headers) as response:
        if response.status_code in (401, 403):
            raise SourceError(name, f"access denied (HTTP {response.status_code})", hint="for a private or gated repo set HF_TOKEN")
        if start and response.status_code == 200:
            data.write_bytes(b"")
            raise _RestartFromZero()
        if response.status_code not in (200, 206):
            raise SourceError(name, f"the server answered HTTP {response.status_code}", hint="try again later")
        if start and not response.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
            raise SourceError(name, "the server answered a different byte range than asked", hint="try again later")
        with data.open("ab") as handle:
            for chunk in response.iter_bytes(_CHUNK):
                if start + received + len(chunk) > size:
                    data.unlink(missing_ok=True)
                    raise SourceError(name, f"the server sent more than the {size:,} bytes the hub lists", hint="run the command again")
                handle.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                if progress is not None:
                    progress(len(chunk))
    return received

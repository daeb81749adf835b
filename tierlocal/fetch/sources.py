"""Where GGUF headers come from: a local path, an ``http(s)://`` URL read with Range
requests, or ``hf://OWNER/REPO/FILE.gguf[@REVISION]`` through huggingface_hub.

Only header bytes are fetched. Split models (``name-00001-of-00003.gguf``) are opened
shard by shard, so every shard's header is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from .. import constants
from ..errors import SourceError, UsageError
from ..gguf.parse import GGUFHeader, HeaderLimits, RangeReader, parse_header
from .hub import SHARD_NAME, locate_file, rate_limited

if TYPE_CHECKING:  # httpx2 loads when a URL is read (a local file needs no HTTP client)
    import httpx2

__all__ = ["SourceSpec", "parse_source", "shard_names", "read_headers", "LocalFileReader", "HttpRangeReader"]

_CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_MAX_SHARDS = 1000


@dataclass(frozen=True)
class SourceSpec:
    """A parsed SOURCE argument. ``kind`` is ``local``, ``http`` or ``hf``."""

    kind: str
    text: str
    location: str
    repo_id: str | None = None
    revision: str | None = None


def parse_source(text: str) -> SourceSpec:
    """Parse a SOURCE argument (a path, an http(s) URL, or an hf:// spec).

    Raises:
        UsageError: an hf:// spec without OWNER/REPO/FILE.gguf.
    """
    if text.startswith(("http://", "https://")):
        return SourceSpec("http", text, text)
    if text.startswith("hf://"):
        rest = text.removeprefix("hf://")
        revision = None
        if "@" in rest:
            rest, revision = rest.rsplit("@", 1)
        parts = rest.split("/", 2)
        if len(parts) < 3 or not all(parts) or not parts[2].endswith(".gguf"):
            raise UsageError(
                f"cannot read {text!r} as a Hugging Face GGUF file",
                hint="write hf://OWNER/REPO/FILE.gguf, optionally @REVISION (e.g. hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q8_0.gguf)",
            )
        return SourceSpec("hf", text, parts[2], repo_id=f"{parts[0]}/{parts[1]}", revision=revision or None)
    return SourceSpec("local", text, text)


def shard_names(filename: str) -> list[str]:
    """All shard file names of a split GGUF, given any one of them; ``[filename]`` if unsplit.

    ``model-00002-of-00003.gguf`` → ``model-00001-of-00003.gguf`` … ``model-00003-of-00003.gguf``.
    """
    directory, _, base = filename.rpartition("/")
    match = SHARD_NAME.match(base)
    if match is None:
        return [filename]
    count = int(match.group("count"))
    if not 1 <= count <= _MAX_SHARDS:
        return [filename]
    prefix = (directory + "/" if directory else "") + match.group("prefix")
    return [f"{prefix}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]


class LocalFileReader:
    """A :class:`RangeReader` over a local file (positioned reads, no whole-file load)."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceError(str(path), "no such file", hint="check the path, or give a URL or hf://OWNER/REPO/FILE.gguf") from None
        except IsADirectoryError:
            raise SourceError(str(path), "is a directory", hint="name the .gguf file itself") from None
        except OSError as exc:
            raise SourceError(str(path), f"cannot open: {exc.strerror}") from None
        self.size = os.fstat(self._fd).st_size
        if os.path.isdir(path):
            self.close()
            raise SourceError(str(path), "is a directory", hint="name the .gguf file itself")

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        os.close(self._fd)


class HttpRangeReader:
    """A :class:`RangeReader` over HTTP(S) with ``Range`` requests.

    The first request (bytes 0 .. ``first_read_bytes``) also learns the file size from
    ``Content-Range``; its bytes are kept so the parser's first read costs nothing more.
    A server that ignores Range (answers 200) is refused rather than downloaded.
    ``bytes_read``: the body bytes fetched so far.
    """

    def __init__(
        self,
        url: str,
        client: httpx2.Client,
        *,
        name: str | None = None,
        headers: dict[str, str] | None = None,
        first_read_bytes: int = constants.REMOTE_FIRST_READ_BYTES,
    ) -> None:
        self.url = url
        self.name = name or _redact_url(url)
        self._client = client
        self._headers = dict(headers or {})
        self.bytes_read = 0
        self._prefetch, self.size = self._fetch(0, first_read_bytes, learn_size=True)

    def read(self, offset: int, length: int) -> bytes:
        if offset == 0 and length <= len(self._prefetch):
            return self._prefetch[:length]
        if offset >= self.size or length <= 0:
            return b""
        data, _ = self._fetch(offset, min(length, self.size - offset), learn_size=False)
        return data

    def _fetch(self, offset: int, length: int, *, learn_size: bool) -> tuple[bytes, int]:
        import httpx2

        headers = {**self._headers, "Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "identity"}
        try:
            with self._client.stream("GET", self.url, headers=headers) as response:
                if response.status_code == 416 and learn_size:
                    raise SourceError(self.name, "the file is empty", hint="check the URL")
                if response.status_code == 429:
                    raise rate_limited(self.name, response.headers.get("Retry-After"))
                if response.status_code != 206:
                    raise _http_status_error(self.name, response.status_code)
                total = _content_range_total(response.headers.get("Content-Range"), offset)
                if total is None:
                    raise SourceError(self.name, "the server's Content-Range header does not match the request")
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    self.bytes_read += len(chunk)
                    if len(data) > length:
                        raise SourceError(self.name, f"the server sent more than the {length} bytes asked for")
        except httpx2.HTTPError as exc:
            raise SourceError(self.name, f"cannot fetch: {type(exc).__name__}: {exc}", hint="check the URL and the network") from None
        return bytes(data), total


def _content_range_total(value: str | None, offset: int) -> int | None:
    match = _CONTENT_RANGE_RE.match(value or "")
    if match is None or int(match.group(1)) != offset:
        return None
    return int(match.group(3))


def _http_status_error(name: str, status: int) -> SourceError:
    if status == 200:
        return SourceError(name, "the server does not support Range requests", hint="download the file and inspect the local copy")
    if status in (401, 403):
        return SourceError(name, f"access denied (HTTP {status})", hint="for a private or gated hub repo set HF_TOKEN")
    if status == 404:
        return SourceError(name, "not found (HTTP 404)", hint="check the URL or file name")
    return SourceError(name, f"HTTP {status}", hint="try again later, or check the URL")


def _redact_url(url: str) -> str:
    """The URL without credentials or query string (signed URLs carry secrets there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def hf_reader(spec: SourceSpec, filename: str, client: httpx2.Client, first_read_bytes: int = constants.REMOTE_FIRST_READ_BYTES) -> HttpRangeReader:
    """A range reader of ``filename`` in the hub repository ``spec`` names (its first read: ``first_read_bytes``)."""
    assert spec.repo_id is not None
    name = f"hf://{spec.repo_id}/{filename}" + (f"@{spec.revision}" if spec.revision else "")
    location = locate_file(spec.repo_id, filename, spec.revision)
    return HttpRangeReader(location.url, client, name=name, headers=location.headers, first_read_bytes=first_read_bytes)


@contextmanager
def _open_readers(spec: SourceSpec, client: httpx2.Client | None) -> Iterator[list[RangeReader]]:
    readers: list[RangeReader] = []
    own_client: httpx2.Client | None = None
    try:
        if spec.kind == "local":
            for path in shard_names(spec.location):
                readers.append(LocalFileReader(Path(path)))
        elif spec.kind == "http":
            import httpx2

            if client is None:
                own_client = client = httpx2.Client(follow_redirects=True, timeout=constants.DEFAULT_HTTP_TIMEOUT_S)
            for url in shard_names(spec.location):
                readers.append(HttpRangeReader(url, client))
        else:
            from huggingface_hub import get_session

            hub_client = client or get_session()
            for filename in shard_names(spec.location):
                readers.append(hf_reader(spec, filename, hub_client))
        yield readers
    finally:
        for reader in readers:
            if isinstance(reader, LocalFileReader):
                reader.close()
        if own_client is not None:
            own_client.close()


def read_headers(source: str, *, client: httpx2.Client | None = None, limits: HeaderLimits | None = None) -> list[GGUFHeader]:
    """Read the GGUF header(s) of SOURCE: one per shard, in shard order.

    Args:
        source: a local path, an http(s) URL, or ``hf://OWNER/REPO/FILE.gguf[@REVISION]``.
        client: the HTTP client for URLs (default: a new one) and hub files (default:
            huggingface_hub's session, which honours ``HF_ENDPOINT``).
        limits: parser bounds.

    Raises:
        UsageError: SOURCE cannot be understood.
        SourceError: SOURCE cannot be opened or fetched.
        HeaderError: a header is not valid GGUF.
    """
    spec = parse_source(source)
    with _open_readers(spec, client) as readers:
        return [parse_header(reader, limits) for reader in readers]

"""Real HTTP servers on loopback for the tests: a static file server with Range support and
a stand-in for the Hugging Face Hub that serves the routes and headers huggingface_hub uses.

Both count the body bytes they send, per path, so tests can assert how much was fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 64 * 1024


@dataclass
class ServerState:
    """What a test server was asked and sent."""

    sent_bytes: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, path: str, headers: dict[str, str]) -> None:
        """Record a request; header names are lower-cased (HTTP names are case-insensitive)."""
        with self.lock:
            self.requests.append((method, path, {key.lower(): value for key, value in headers.items()}))

    def add_sent(self, path: str, count: int) -> None:
        with self.lock:
            self.sent_bytes[path] += count

    @property
    def total_sent(self) -> int:
        with self.lock:
            return sum(self.sent_bytes.values())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ServerState
    server_version = "tierlocal-test"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send_file(
        self,
        path: Path,
        *,
        head: bool,
        accept_ranges: bool = True,
        extra: dict[str, str] | None = None,
        stop_after: int | None = None,
        chunk_delay_s: float = 0.0,
    ) -> None:
        """Send ``path`` (honouring Range); ``stop_after`` drops the connection once that many
        body bytes are out; ``chunk_delay_s`` sleeps between 64 KiB chunks (a slow link)."""
        size = path.stat().st_size
        start, end = 0, size - 1
        status = 200
        range_header = self.headers.get("Range")
        if accept_ranges and range_header:
            match = _RANGE_RE.match(range_header.strip())
            if match is None or int(match.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            status = 206
        self.send_response(status)
        if accept_ranges:
            self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Content-Type", "application/octet-stream")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            return
        with path.open("rb") as handle:
            handle.seek(start)
            remaining = end - start + 1
            sent = 0
            while remaining > 0:
                if stop_after is not None and sent >= stop_after:
                    # A dropped connection: no more bytes, no clean end of the body.
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                chunk = handle.read(min(_CHUNK, remaining, (stop_after - sent) if stop_after is not None else _CHUNK))
                if not chunk:
                    break
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                self.state.add_sent(self.path, len(chunk))
                sent += len(chunk)
                remaining -= len(chunk)
                if chunk_delay_s:
                    time.sleep(chunk_delay_s)

    def _send_json(self, status: int, payload: object, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _StaticHandler(_Handler):
    root: Path
    ranges: bool

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        self.state.record(self.command, self.path, dict(self.headers))
        relative = Path(os.path.normpath(unquote(urlsplit(self.path).path).lstrip("/")))
        path = self.root / relative
        if relative.parts[:1] == ("..",) or relative.is_absolute() or not path.is_file():
            self._send_json(404, {"error": "not found"})
            return
        self._send_file(path, head=head, accept_ranges=self.ranges)


@contextmanager
def _serve(handler: type[_Handler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def static_server(root: Path, *, ranges: bool = True) -> Iterator[tuple[str, ServerState]]:
    """Serve ``root`` over HTTP on loopback; ``ranges=False`` ignores Range (always 200)."""
    state = ServerState()
    handler = type("Handler", (_StaticHandler,), {"root": root, "ranges": ranges, "state": state})
    with _serve(handler) as url:
        yield url, state


# --- Hugging Face Hub stand-in -----------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubRepo:
    """A model repo: files on disk; ``private`` repos need ``token``.

    ``declared_sha256`` replaces the LFS sha256 the hub states for a file (a corrupt upload,
    or a huge sparse file not worth hashing); ``drop_after`` makes the CDN drop the
    connection after that many bytes of a file, on the first request for it only;
    ``chunk_delay_s`` slows the CDN down (seconds per 64 KiB)."""

    repo_id: str
    directory: Path
    private: bool = False
    token: str | None = None
    declared_sha256: dict[str, str] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    chunk_delay_s: float = 0.0
    #: The model card's metadata (``cardData``: base_model, license …), and the repo's record as
    #: the hub lists it. A gated repo lists its files to anyone; only ``token`` may fetch them.
    card: dict[str, object] = field(default_factory=dict)
    gated: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-06-01T00:00:00.000Z"

    def record(self) -> dict[str, object]:
        """The fields the hub's model listing and model info give for this repo."""
        return {
            "_id": hashlib.sha1(self.repo_id.encode()).hexdigest()[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "private": self.private,
            "gated": "manual" if self.gated else False,
            "downloads": self.downloads,
            "likes": self.likes,
            "lastModified": self.last_modified,
            "createdAt": self.last_modified,
            "tags": ["gguf", "endpoints_compatible", "region:us"],
            "library_name": "gguf",
        }


class _HubHandler(_Handler):
    repos: dict[str, HubRepo]
    sha_cache: dict[Path, str]
    dropped: set[tuple[str, str]]
    #: Answer 429 (with ``Retry-After: retry_after_s``) to every request after this many (None: never).
    limit_after: int | None
    retry_after_s: int

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _sha256(self, repo: HubRepo, path: Path) -> str:
        declared = repo.declared_sha256.get(str(path.relative_to(repo.directory)))
        if declared is not None:
            return declared
        if path not in self.sha_cache:
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            self.sha_cache[path] = digest.hexdigest()
        return self.sha_cache[path]

    def _authorised(self, repo: HubRepo) -> bool:
        return not repo.private or self._token_of(repo)

    def _token_of(self, repo: HubRepo) -> bool:
        return self.headers.get("Authorization") == f"Bearer {repo.token}"

    def _route(self, *, head: bool) -> None:
        self.state.record(self.command, self.path, dict(self.headers))
        path = unquote(urlsplit(self.path).path)
        if self.limit_after is not None and len(self.state.requests) > self.limit_after:
            self._send_json(429, {"error": "You have exceeded our rate limit"}, {"Retry-After": str(self.retry_after_s)})
            return
        if path == "/api/models":
            self._search()
            return
        cdn = re.match(r"^/cdn/(?P<owner>[^/]+)/(?P<repo>[^/]+)/(?P<file>.+)$", path)
        if cdn:
            repo = self.repos.get(f"{cdn['owner']}/{cdn['repo']}")
            file_path = repo.directory / cdn["file"] if repo else None
            if file_path is None or not file_path.is_file():
                self._send_json(404, {"error": "not found"})
                return
            relative = cdn["file"]
            with self.state.lock:
                first = (repo.repo_id, relative) not in self.dropped
                self.dropped.add((repo.repo_id, relative))
            stop_after = repo.drop_after.get(relative) if first and not head else None
            self._send_file(file_path, head=head, stop_after=stop_after, chunk_delay_s=repo.chunk_delay_s)
            return
        resolve = re.match(r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", path)
        info = re.match(r"^/api/models/(?P<owner>[^/]+)/(?P<repo>[^/]+)(?:/revision/(?P<rev>[^/]+))?$", path)
        match = resolve or info
        if match is None:
            self._send_json(404, {"error": "not found"})
            return
        repo = self.repos.get(f"{match['owner']}/{match['repo']}")
        if repo is None or not self._authorised(repo):
            self._send_json(401, {"error": "Repository Not Found"}, {"X-Error-Code": "RepoNotFound"})
            return
        revision = match["rev"] or "main"
        if revision not in ("main", COMMIT):
            self._send_json(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
            return
        if info:
            # With ?blobs=true the hub adds each file's size, blob id and LFS metadata.
            blobs = "blobs=true" in urlsplit(self.path).query
            siblings = []
            for p in sorted(repo.directory.rglob("*")):
                if not p.is_file():
                    continue
                sibling: dict[str, object] = {"rfilename": str(p.relative_to(repo.directory))}
                if blobs:
                    size = p.stat().st_size
                    sibling.update({"blobId": hashlib.sha1(str(p).encode()).hexdigest(), "size": size})
                    if p.suffix == ".gguf":
                        sibling["lfs"] = {"sha256": self._sha256(repo, p), "size": size, "pointerSize": 134}
                siblings.append(sibling)
            record = {**repo.record(), "sha": COMMIT, "siblings": siblings, "cardData": repo.card}
            self._send_json(200, record)
            return
        if repo.gated and not self._token_of(repo):
            message = f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated to access it."
            self._send_json(401, {"error": message}, {"X-Error-Code": "GatedRepo", "X-Error-Message": message})
            return
        file_path = repo.directory / match["file"]
        if not file_path.is_file():
            self._send_json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
            return
        size = file_path.stat().st_size
        sha = self._sha256(repo, file_path)
        if file_path.suffix == ".gguf":
            # LFS file: the hub answers with a redirect to its CDN (another host) and carries
            # the file's metadata on that redirect.
            _host, port = self.server.server_address[:2]  # type: ignore[misc]
            location = f"http://localhost:{port}/cdn/{repo.repo_id}/{match['file']}?X-Amz-Signature=secret-signature"
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Size", str(size))
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("ETag", f'"{sha[:40]}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(file_path, head=head, extra={"X-Repo-Commit": COMMIT, "ETag": f'"{sha[:40]}"'})

    def _search(self) -> None:
        """``GET /api/models``: the public repos (and the token's private ones) whose id holds
        ``search``, with every ``filter`` tag, sorted descending by ``sort``, at most ``limit``;
        ``expand`` (or ``cardData``/``full``) adds the card."""
        query = parse_qs(urlsplit(self.path).query)
        words = (query.get("search") or [""])[0].lower()
        tags = query.get("filter", [])
        sort = (query.get("sort") or ["downloads"])[0]
        limit = int((query.get("limit") or ["1000"])[0])
        with_card = "cardData" in query.get("expand", []) or "cardData" in query or "full" in query
        found = [r for r in self.repos.values() if words in r.repo_id.lower() and (not r.private or self._token_of(r))]
        found = [r for r in found if all(tag in r.record()["tags"] for tag in tags)]  # type: ignore[operator]
        key = {"downloads": "downloads", "likes": "likes", "lastModified": "lastModified", "trendingScore": "likes"}.get(sort, "downloads")
        found.sort(key=lambda r: (r.record()[key], r.repo_id), reverse=True)
        self._send_json(200, [{**r.record(), **({"cardData": r.card} if with_card else {})} for r in found[:limit]])


@contextmanager
def fake_hub(repos: list[HubRepo], *, limit_after: int | None = None, retry_after_s: int = 30) -> Iterator[tuple[str, ServerState]]:
    """A hub on loopback; point ``HF_ENDPOINT`` at the URL it yields. After ``limit_after``
    requests it answers each with 429 and ``Retry-After: retry_after_s``."""
    state = ServerState()
    members = {"repos": {r.repo_id: r for r in repos}, "sha_cache": {}, "dropped": set(), "state": state}
    handler = type("Handler", (_HubHandler,), {**members, "limit_after": limit_after, "retry_after_s": retry_after_s})
    with _serve(handler) as url:
        yield url, state

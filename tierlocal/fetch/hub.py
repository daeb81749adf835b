"""The Hugging Face Hub as tierlocal uses it: a repo's GGUF files with their sizes and
checksums, the file that matches a quantisation name, and where to fetch one file's bytes.

All calls go through huggingface_hub, so ``HF_ENDPOINT``, ``HF_TOKEN`` and the stored login
apply. The token is sent to the hub's own host only, never to a redirect target (a CDN with a
signed URL).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import SourceError, UsageError

if TYPE_CHECKING:  # huggingface_hub loads when the hub is used
    from huggingface_hub import ModelInfo

__all__ = [
    "RepoFile",
    "RepoListing",
    "FileLocation",
    "hub_errors",
    "is_repo_source",
    "rate_limited",
    "card_facts",
    "list_gguf_files",
    "locate_file",
    "select_files",
]

#: A split GGUF's shard name, ``model-00002-of-00003.gguf`` (llama.cpp's gguf-split), with or
#: without a directory: the one pattern the fetchers and header sources share.
SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
#: Most files one repo listing may hold before we stop reading it.
MAX_REPO_FILES = 100_000


@dataclass(frozen=True)
class RepoFile:
    """One GGUF file in a repo: its path in the repo, size (bytes) and LFS sha256 (hex)."""

    path: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class RepoListing:
    """A repo's GGUF files at one commit, and what its model card says about them."""

    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]
    #: The card's ``base_model`` (the weights these files were made from; a list on some cards).
    base_models: tuple[str, ...] = ()
    #: The card's ``license`` (an SPDX-style id, ``other``; None: not stated).
    licence: str | None = None
    #: Downloads over the last 30 days and likes, as the hub counts them (None: not given).
    downloads: int | None = None
    likes: int | None = None
    #: When the repo last changed (ISO 8601), and whether its files need an accepted licence.
    last_modified: str | None = None
    gated: bool = False


@dataclass(frozen=True)
class FileLocation:
    """Where one file's bytes come from: the URL after the hub's redirect, the headers to send
    there (the token only when it is the hub's own host), its size (bytes) and commit."""

    url: str
    headers: dict[str, str]
    size: int | None
    commit: str | None


@contextmanager
def hub_errors(name: str, revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's errors into one-line SourceErrors about ``name``."""
    import httpx2  # here, not at the top: huggingface_hub and httpx2 cost a quarter second of CPU to import
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except hf_errors.GatedRepoError:
        raise SourceError(name, "the repo is gated", hint="accept its licence on the hub, then set HF_TOKEN") from None
    except hf_errors.RepositoryNotFoundError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        status_text = f" (HTTP {status})" if status else ""
        raise SourceError(
            name,
            f"repository not found, or private and no valid token was sent{status_text}",
            hint="check OWNER/REPO; for a private repo set HF_TOKEN or run `hf auth login`",
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise SourceError(name, f"revision {revision!r} not found", hint="check the @REVISION (branch, tag or commit)") from None
    except hf_errors.EntryNotFoundError:
        raise SourceError(
            name, "file not found in the repo", hint="check the file name; `tierlocal pull hf://OWNER/REPO --quant ?` lists what it has"
        ) from None
    except hf_errors.OfflineModeIsEnabled:
        raise SourceError(
            name, "HF_HUB_OFFLINE is set, and this needs the hub", hint="unset HF_HUB_OFFLINE to reach the hub, or give a local GGUF file"
        ) from None
    except hf_errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status == 429:
            raise rate_limited(name, exc.response.headers.get("Retry-After") if exc.response is not None else None) from None
        raise SourceError(name, f"the hub answered HTTP {status}", hint="try again later, or check HF_ENDPOINT") from None
    except httpx2.HTTPError as exc:
        raise SourceError(name, f"cannot reach the hub: {type(exc).__name__}", hint="check HF_ENDPOINT and the network") from None


def is_repo_source(source: str) -> bool:
    """``hf://OWNER/REPO`` or ``hf://OWNER/REPO@REVISION``: a repository, no file named."""
    rest = source.removeprefix("hf://").rsplit("@", 1)[0] if source.startswith("hf://") else ""
    return rest.count("/") == 1 and all(rest.split("/"))


def rate_limited(name: str, retry_after: str | None) -> SourceError:
    """The one-line error for the hub's HTTP 429, with the wait it asked for (``Retry-After``)."""
    wait = f"; it asks to wait {int(retry_after)} s" if retry_after is not None and retry_after.strip().isdigit() else ""
    return SourceError(
        name,
        f"the hub is rate-limiting these requests (HTTP 429{wait})",
        hint="try again later; a token (HF_TOKEN or `hf auth login`) has higher limits",
    )


def list_gguf_files(repo_id: str, revision: str | None = None) -> RepoListing:
    """The ``.gguf`` files of ``repo_id`` at ``revision`` (default: main), with sizes and
    LFS checksums from the hub's file metadata."""
    from huggingface_hub import HfApi

    name = f"hf://{repo_id}" + (f"@{revision}" if revision else "")
    with hub_errors(name, revision):
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    siblings = info.siblings or []
    if len(siblings) > MAX_REPO_FILES:
        raise SourceError(name, f"the repo lists {len(siblings)} files, more than {MAX_REPO_FILES}", hint="name the file: hf://OWNER/REPO/FILE.gguf")
    files = []
    for sibling in siblings:
        if not sibling.rfilename.lower().endswith(".gguf"):
            continue
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else sibling.size
        if size is None or size < 0:
            raise SourceError(name, f"the hub gave no size for {sibling.rfilename}", hint="try again later, or check HF_ENDPOINT")
        files.append(RepoFile(sibling.rfilename, int(size), lfs.sha256 if lfs is not None else None))
    return RepoListing(repo_id, info.sha or revision or "main", tuple(sorted(files, key=lambda f: f.path)), *card_facts(info))


def card_facts(info: ModelInfo) -> tuple[tuple[str, ...], str | None, int | None, int | None, str | None, bool]:
    """What a repo's hub record says beside its files: the card's base models (bounded: 16) and
    licence, downloads, likes, when it last changed, and whether it is gated."""
    card = info.card_data
    base = card.get("base_model") if card is not None else None
    bases = tuple(str(b) for b in ([base] if isinstance(base, str) else base if isinstance(base, list) else ())[:16] if isinstance(b, str))
    licence = card.get("license") if card is not None else None
    modified = info.last_modified.isoformat() if info.last_modified is not None else None
    return bases, str(licence) if isinstance(licence, str) else None, info.downloads, info.likes, modified, bool(info.gated)


def _quant_pattern(quant: str) -> re.Pattern[str]:
    # A whole token: "Q4_K_M" matches "model-Q4_K_M.gguf" and "Q4_K_M/model-00001-of-00002.gguf"
    # but not "model-IQ4_K_M.gguf" or "model-Q4_K_M_L.gguf", and "Q4_K" does not match "Q4_K_M".
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def file_set_key(path: str) -> str:
    """The name shared by every shard of a split file (the path itself when unsplit)."""
    match = SHARD_NAME.match(path)
    return match.group("prefix") if match else path


def quant_of(path: str) -> str | None:
    match = re.search(
        r"(?<![A-Za-z0-9])(I?Q\d[A-Z0-9_]*|F16|BF16|F32|MXFP4[A-Z0-9_]*|TQ\d_\d)(?![A-Za-z0-9])", path.rsplit("/", 1)[-1], re.IGNORECASE
    )
    return match.group(1).upper() if match else None


def select_files(listing: RepoListing, *, quant: str | None = None, filename: str | None = None) -> list[RepoFile]:
    """The file (every shard of a split one) that ``quant`` or ``filename`` names.

    Raises:
        UsageError: nothing matches, or several different files do; the message lists what
            the repo has.
    """
    name = f"hf://{listing.repo_id}"
    if not listing.files:
        raise UsageError(f"{name}: the repo has no .gguf files", hint="check OWNER/REPO; tierlocal pulls GGUF files only")
    if filename is not None:
        wanted = file_set_key(filename)
        matches = [f for f in listing.files if file_set_key(f.path) == wanted]
        if not matches:
            raise UsageError(f"{name}: no file {filename!r} in the repo", hint=f"it has: {_describe(listing)}")
    else:
        if not quant:
            raise UsageError(f"{name}: which quantisation?", hint=f"give --quant; the repo has: {_describe(listing)}")
        pattern = _quant_pattern(quant)
        matches = [f for f in listing.files if pattern.search(f.path) and "mmproj" not in f.path.lower()]
        if not matches:
            raise UsageError(f"{name}: no GGUF file matches quantisation {quant!r}", hint=f"the repo has: {_describe(listing)}")
    sets: dict[str, list[RepoFile]] = {}
    for repo_file in matches:
        sets.setdefault(file_set_key(repo_file.path), []).append(repo_file)
    if len(sets) > 1:
        choices = ", ".join(sorted(sets))
        raise UsageError(f"{name}: {quant or filename!r} matches {len(sets)} different files: {choices}", hint="name one: hf://OWNER/REPO/FILE.gguf")
    (chosen,) = sets.values()
    _check_shards_complete(name, chosen)
    return sorted(chosen, key=lambda f: f.path)


def _check_shards_complete(name: str, files: list[RepoFile]) -> None:
    match = SHARD_NAME.match(files[0].path)
    if match is None:
        return
    count = int(match.group("count"))
    indices = sorted(int(m.group("index")) for f in files if (m := SHARD_NAME.match(f.path)))
    if indices != list(range(1, count + 1)):
        raise SourceError(
            name,
            f"{file_set_key(files[0].path)} is split into {count} shards but the repo has {len(indices)}",
            hint="the upload may be incomplete; try another revision",
        )


def _describe(listing: RepoListing) -> str:
    """What a repo offers, one entry per file set: the quantisation when the name shows one."""
    entries: dict[str, str] = {}
    for repo_file in listing.files:
        key = file_set_key(repo_file.path)
        entries.setdefault(key, quant_of(key) or key.rsplit("/", 1)[-1])
    labels = sorted(set(entries.values()))
    return ", ".join(labels[:40]) + (f" … ({len(labels)} in all)" if len(labels) > 40 else "")


def locate_file(repo_id: str, path: str, revision: str | None) -> FileLocation:
    """Where to fetch ``path`` of ``repo_id`` at ``revision`` (default main): follows the
    hub's redirect."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    name = f"hf://{repo_id}/{path}" + (f"@{revision}" if revision else "")
    url = hf_hub_url(repo_id, path, revision=revision)
    with hub_errors(name, revision):
        # token=None: huggingface_hub's own rules (HF_TOKEN, then the stored login).
        metadata = get_hf_file_metadata(url, token=None)
    same_host = urlsplit(metadata.location).netloc == urlsplit(url).netloc
    headers = build_hf_headers(token=None) if same_host else {}
    return FileLocation(metadata.location, headers, metadata.size, metadata.commit_hash)


def read_safetensors_model(source: str, repo_id: str, revision: str | None) -> tuple[dict[str, int], dict[str, object]]:
    """A safetensors repo's parameter count per dtype (from its safetensors headers) and its
    ``config.json``, through huggingface_hub (``source``: how errors name it).

    Raises:
        SourceError: the repo is missing, private, not safetensors, or unreachable, or its
            config.json is not JSON.
    """
    import httpx2
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import get_safetensors_metadata, hf_hub_download

    try:
        metadata = get_safetensors_metadata(repo_id, revision=revision)
        config_path = hf_hub_download(repo_id, "config.json", revision=revision)
    except hf_errors.RepositoryNotFoundError:
        raise SourceError(source, "repository not found, or private", hint="check OWNER/REPO; for a private repo set HF_TOKEN") from None
    except hf_errors.NotASafetensorsRepoError:
        raise SourceError(source, "not a safetensors repo", hint="for a GGUF repo name the file: hf://OWNER/REPO/FILE.gguf") from None
    except (hf_errors.EntryNotFoundError, hf_errors.RevisionNotFoundError) as exc:
        raise SourceError(source, f"not found: {type(exc).__name__}", hint="check the repo and @REVISION") from None
    except (hf_errors.HfHubHTTPError, httpx2.HTTPError) as exc:
        raise SourceError(source, f"cannot read the hub: {type(exc).__name__}", hint="check HF_ENDPOINT and the network") from None
    with open(config_path, encoding="utf-8") as handle:
        try:
            config = json.load(handle)
        except json.JSONDecodeError:
            raise SourceError(source, "config.json is not valid JSON") from None
    return {str(dtype): int(count) for dtype, count in metadata.parameter_count.items()}, config

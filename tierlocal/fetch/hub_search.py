"""``tierlocal search``'s reads: GGUF repositories on the Hub whose names hold the words, and,
for each, its files and the headers of the quantisations that may fit the memory there is.

Which headers are read: a file cannot need less memory than its own bytes, so of each
repository's complete model files the :data:`PLANNED_PER_REPO` largest that are no larger than
the machine's memory (GPUs and RAM together) are read and planned — the largest that may fit,
where the best of them usually is (a smaller one that answers sooner can still be ranked higher
by ``check hf://OWNER/REPO``) — or, when none is that small, the smallest (to say by how much it
misses).
``check hf://OWNER/REPO`` plans every one.

I/O: the hub, through huggingface_hub (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply), and the
header cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import SourceError
from .hub import RepoListing, card_facts, hub_errors, list_gguf_files
from .repo_read import MAX_WORKERS, ArrayBytes, HeaderCache, QuantHeaders, RepoQuant, read_quant_headers, repo_quants

__all__ = ["SORTS", "PLANNED_PER_REPO", "MAX_RESULTS", "FoundRepo", "SearchSkip", "search_repos", "read_found"]

#: ``--sort``: the hub's sort key for each choice (every one descending).
SORTS = {"downloads": "downloads", "likes": "likes", "recent": "lastModified", "trending": "trendingScore"}
#: Quantisations planned per repository (the largest that may fit).
PLANNED_PER_REPO = 3
#: Most repositories one search plans.
MAX_RESULTS = 100


@dataclass(frozen=True)
class FoundRepo:
    """A repository the search found, with its listing and the headers read for it."""

    listing: RepoListing
    quants: tuple[RepoQuant, ...]
    reads: tuple[QuantHeaders, ...]


@dataclass(frozen=True)
class SearchSkip:
    """A repository found but not planned, and why (gated, no GGUF model file, unreadable)."""

    repo_id: str
    why: str

    def to_json(self) -> dict[str, object]:
        return {"repo": self.repo_id, "why": self.why}


def search_repos(words: str, *, sort: str, limit: int) -> list[RepoListing]:
    """The GGUF repositories whose id holds ``words``, best first by ``sort`` (:data:`SORTS`),
    at most ``limit``: each with its card's facts (no file list yet).

    Raises:
        SourceError: the hub refused, rate-limited or could not be reached.
    """
    from huggingface_hub import ModelInfo, get_session
    from huggingface_hub import constants as hf_constants
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    # The hub's model search, one page (at most MAX_RESULTS). Not HfApi.list_models: its retry
    # loop sleeps through each Retry-After, five times over, where a one-line error is wanted.
    limit = min(limit, MAX_RESULTS)
    params: list[tuple[str, str | int | float | bool | None]] = [("search", words), ("filter", "gguf"), ("sort", SORTS[sort]), ("limit", str(limit))]
    params += [("expand", key) for key in ("cardData", "downloads", "likes", "lastModified", "gated", "sha")]
    name = f"hub search {words!r}"
    with hub_errors(name):
        response = get_session().get(f"{hf_constants.ENDPOINT}/api/models", params=params, headers=build_hf_headers())
        hf_raise_for_status(response)
    try:
        items = response.json()
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(item, dict) and isinstance(item.get("id"), str) for item in items):
        raise SourceError(name, "the hub's answer is not a list of models", hint="check HF_ENDPOINT")
    found = [ModelInfo(**{**item, "siblings": None}) for item in items[:limit]]
    return [RepoListing(info.id, info.sha or "main", (), *card_facts(info)) for info in found]


def _chosen(quants: Sequence[RepoQuant], memory_bytes: int) -> list[RepoQuant]:
    models = sorted((q for q in quants if not q.projector and q.complete), key=lambda q: q.size)
    fitting = [q for q in models if q.size <= memory_bytes]
    return fitting[-PLANNED_PER_REPO:] if fitting else models[:1]


def read_found(found: Sequence[RepoListing], memory_bytes: int, cache: HeaderCache | None) -> tuple[list[FoundRepo], list[SearchSkip]]:
    """Each found repository's files, and the headers of the quantisations that may fit
    ``memory_bytes`` (module docstring), read in parallel; a repository that cannot be read is
    skipped with why, unless the hub refuses them all the same way (rate limit, offline).

    Raises:
        SourceError: the hub rate-limited the reads, or is unreachable or offline.
    """

    known = ArrayBytes()  # vocabularies learnt from one repository serve the others

    def read(listing: RepoListing) -> FoundRepo | SearchSkip:
        try:
            full = list_gguf_files(listing.repo_id)
            quants = repo_quants(full)
            chosen = _chosen(quants, memory_bytes)
            if not chosen:
                return SearchSkip(listing.repo_id, "no complete .gguf model file")
            reads = read_quant_headers(full, chosen, cache, workers=PLANNED_PER_REPO, known=known)
        except SourceError as exc:
            if _fatal(exc):
                raise
            return SearchSkip(listing.repo_id, str(exc).removeprefix(f"{exc.source}: "))
        return FoundRepo(full, tuple(quants), tuple(reads))

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_WORKERS, len(found)))) as pool:
        results = list(pool.map(read, found))
    return [r for r in results if isinstance(r, FoundRepo)], [r for r in results if isinstance(r, SearchSkip)]


def _fatal(error: SourceError) -> bool:
    return any(words in str(error) for words in ("rate-limiting", "HF_HUB_OFFLINE", "cannot reach the hub"))

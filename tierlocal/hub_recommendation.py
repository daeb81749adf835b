"""A Hub repository's quantisations planned and ranked for a machine (``check hf://OWNER/REPO``),
and the evidence they take from the catalog.

Each quantisation whose headers were read (:mod:`tierlocal.fetch.repo_read`) becomes an entry
like a catalog one, planned from its own headers by the estimator and ranked by
:func:`tierlocal.recommendation.catalog_recommendation`, so the table is the one ``check`` prints
for the catalog. Evidence follows the weights: a repository whose card names a base model the
catalog holds (or that the catalog pulls from) takes that model's quality figures, modes, answer
lengths and licence, marked as inherited; its quantisation's measured loss applies to each file.
A repository with no known base is planned and ranked by size, as catalog models without
figures are.

No network here: the listing and headers come in as arguments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from . import constants
from .catalog import ModelEntry, load_models
from .errors import UsageError
from .fetch.hub import RepoListing, list_gguf_files
from .fetch.hub_search import FoundRepo, SearchSkip, read_found, search_repos
from .fetch.repo_read import QuantHeaders, RepoQuant, default_header_cache, read_quant_headers, repo_quants
from .fit.model import model_spec
from .gguf import summarize
from .gguf.parse import GGUFHeader
from .hardware.types import Hardware
from .plan.candidates import Candidate, CatalogRecommendation
from .planning_cache import CatalogModel
from .recommendation import catalog_recommendation
from .units import format_bytes, format_count

__all__ = [
    "RepoRecommendation",
    "SearchResult",
    "SearchRecommendation",
    "base_entry",
    "repo_entries",
    "repo_choice",
    "repo_recommendation",
    "search_hub",
    "search_recommendation",
]

_HF_REPO = re.compile(r"huggingface\.co/([\w.-]+/[\w.-]+)")


@dataclass(frozen=True)
class RepoRecommendation:
    """Every quantisation of one repository planned on a machine: the ranking, the catalog model
    whose evidence it inherits (None: no known base), the projectors, and what was read."""

    listing: RepoListing
    revision: str | None
    reads: tuple[QuantHeaders, ...]
    #: The repository's mmproj files, and the split files with shards missing from the listing.
    projectors: tuple[RepoQuant, ...]
    incomplete: tuple[RepoQuant, ...]
    base: ModelEntry | None
    recommendation: CatalogRecommendation

    @property
    def bytes_read(self) -> int:
        """Body bytes fetched for the headers this run (0: all from the cache)."""
        return sum(read.bytes_read for read in self.reads)

    @property
    def file_bytes(self) -> int:
        """The bytes of every file whose header was asked for."""
        return sum(read.quant.size for read in self.reads)

    def read_of(self, candidate: Candidate) -> QuantHeaders | None:
        return next((r for r in self.reads if r.quant.label == candidate.entry.quant), None)

    def to_json(self) -> dict[str, object]:
        """The documented ``check hf://OWNER/REPO --json`` object: the repository, what was read,
        and the catalog recommendation's fields with each candidate's files."""
        recommendation = self.recommendation.to_json()
        best = self.recommendation.best
        recommendation["recommendation"] = self._candidate_json(best, recommendation["recommendation"]) if best else None
        rows = recommendation["candidates"]
        assert isinstance(rows, list)
        recommendation["candidates"] = [self._candidate_json(c, row) for c, row in zip(self.recommendation.candidates, rows, strict=True)]
        return {
            "repo": self.listing.repo_id,
            "revision": self.revision,
            "commit": self.listing.commit,
            "base_models": list(self.listing.base_models),
            "card_licence": self.listing.licence,
            "inherits_from": self.base.family if self.base else None,
            "projectors": [q.to_json() for q in self.projectors],
            "incomplete": [q.to_json() for q in self.incomplete],
            "unreadable": [{"quant": r.quant.label, "files": list(r.quant.paths), "error": r.error} for r in self.reads if r.error],
            "header_bytes_read": self.bytes_read,
            "file_bytes": self.file_bytes,
            "from_cache": all(r.cached for r in self.reads if not r.error),
            **recommendation,
        }

    def _candidate_json(self, candidate: Candidate, row: object) -> dict[str, object]:
        read = self.read_of(candidate)
        assert isinstance(row, dict)
        return {
            **row,
            "files": list(read.quant.paths) if read else [],
            "header_bytes_read": read.bytes_read if read else 0,
            "quality_inherited": self.base is not None and candidate.quality is not None,
            "pull": f"hf://{self.listing.repo_id} --quant {candidate.entry.quant}",
        }


def base_entry(listing: RepoListing, entries: Sequence[ModelEntry]) -> ModelEntry | None:
    """The catalog model these files are quantisations of: one the catalog pulls from this very
    repository, else one whose published weights (its ``source``'s repository) the card names
    as ``base_model`` (case-insensitive). None: no known base."""
    chat = [e for e in entries if not e.frontier]
    own = next((e for e in chat if e.gguf_repo and e.gguf_repo.lower() == listing.repo_id.lower()), None)
    if own is not None:
        return own
    bases = {b.lower() for b in listing.base_models}
    for entry in chat:
        match = _HF_REPO.search(entry.source)
        if match and match.group(1).lower() in bases:
            return entry
    return None


def _active_params(headers: Sequence[GGUFHeader], params: int, used: int | None, count: int | None) -> int:
    """Parameters per token: all, less the routed experts' not used (a mixture of experts)."""
    if not used or not count or used >= count:
        return params
    experts = sum(t.n_elements for h in headers for t in h.tensors if "_exps." in t.name)
    return round(params - experts * (1 - used / count))


def repo_entries(listing: RepoListing, reads: Sequence[QuantHeaders], base: ModelEntry | None) -> tuple[list[ModelEntry], dict[str, CatalogModel]]:
    """An entry per read quantisation (keyed ``OWNER/REPO:LABEL``), with its spec and summary.
    With a ``base``, its family name, licence and dates (the catalog's evidence is found by
    them); else the repository's name and the card's licence."""
    name = listing.repo_id.split("/", 1)[1].removesuffix("-GGUF").removesuffix("-gguf")
    entries: list[ModelEntry] = []
    models: dict[str, CatalogModel] = {}
    for read in reads:
        if read.error or not read.headers:
            continue
        headers = list(read.headers)
        summary = summarize(headers)
        spec = model_spec(headers)
        params = summary.params or 1
        active = base.active_params if base else _active_params(headers, params, summary.expert_used_count, summary.expert_count)
        key = f"{listing.repo_id}:{read.quant.label}"
        entries.append(
            ModelEntry(
                key=key,
                family=base.family if base else name,
                params=params,
                active_params=active,
                quant=read.quant.label,
                bits_per_weight=read.quant.size * 8 / params,
                file_bytes=read.quant.size,
                file_bytes_measured=True,
                floor_bytes=read.quant.size,
                layers=summary.layers or 0,
                context_length=summary.context_length or 0,
                kv_bytes_per_token=None,
                fixed_state_bytes=0,
                frontier=False,
                ollama=None,
                gguf_repo=listing.repo_id,
                licence=base.licence if base else (listing.licence or "unknown"),
                facts_date=base.facts_date if base else (listing.last_modified or "")[:7],
                note="",
                series=base.series if base else name,
                architecture=summary.architecture,
                source=f"hf://{listing.repo_id}",
                role="embeddings" if summary.pooled_role == "embeddings" else "chat",
            )
        )
        models[key] = (spec, summary)
    return entries, models


def repo_choice(repo_id: str, revision: str | None, hardware: Hardware, ctx: int | None) -> tuple[str, str]:
    """The quantisation of ``repo_id`` that ranks first on ``hardware`` at ``ctx`` tokens (None:
    the default, up to the trained context), and why: what ``serve hf://OWNER/REPO`` takes.

    Raises:
        UsageError: no quantisation fits, or the repository holds no model file.
        SourceError: the hub refused or could not answer.
    """
    listing = list_gguf_files(repo_id, revision)
    quants = repo_quants(listing)
    models = [q for q in quants if not q.projector and q.complete]
    if not models:
        raise UsageError(f"hf://{repo_id}: the repo has no complete .gguf model file", hint="check OWNER/REPO; tierlocal serves GGUF files")
    reads = read_quant_headers(listing, models, default_header_cache(), revision=revision)
    ask = {
        "ctx": ctx or constants.DEFAULT_CTX,
        "parallel": 1,
        "min_tokens_per_s": constants.DEFAULT_MIN_TOKENS_PER_S,
        "ctx_up_to_training": ctx is None,
    }
    best = repo_recommendation(listing, reads, quants, hardware, revision=revision, **ask).recommendation.best
    if best is None:
        raise UsageError(f"hf://{repo_id}: no quantisation fits this machine", hint=f"see `tierlocal check hf://{repo_id}`, or give --quant")
    return best.entry.quant, best.reason


def repo_recommendation(
    listing: RepoListing, reads: Sequence[QuantHeaders], quants: Sequence[RepoQuant], hardware: Hardware, *, revision: str | None, **ask: object
) -> RepoRecommendation:
    """Plan and rank every read quantisation of ``listing`` on ``hardware`` (``quants``: all of
    the repository's, projectors and incomplete splits included; ``ask``: what
    :func:`catalog_recommendation` takes: ctx, parallel, min_tokens_per_s, purpose …)."""
    base = base_entry(listing, load_models())
    entries, models = repo_entries(listing, reads, base)
    if entries and all(e.role == "embeddings" for e in entries) and ask.get("purpose", "chat") == "chat":
        ask = {**ask, "purpose": "embeddings"}
    recommendation = catalog_recommendation(entries, hardware, models=models, **ask)  # type: ignore[arg-type]
    projectors = tuple(q for q in quants if q.projector)
    incomplete = tuple(q for q in quants if not q.projector and not q.complete)
    return RepoRecommendation(listing, revision, tuple(reads), projectors, incomplete, base, recommendation)


@dataclass(frozen=True)
class SearchResult:
    """One repository a search found, at its best quantisation on the machine (None: none of
    those read could be planned), with the catalog model it inherits from."""

    found: FoundRepo
    base: ModelEntry | None
    candidate: Candidate | None

    def cells(self) -> dict[str, str]:
        """The row both views show, as plain text: repo, base (the catalog model it inherits from,
        else the card's first base model), quant, needs (every device), where, tok/s, score
        (``†``: inherited) and downloads; ``-`` where not known."""
        listing, candidate = self.found.listing, self.candidate
        base = self.base.family if self.base else (listing.base_models[0] if listing.base_models else "-")
        row = {"repo": listing.repo_id, "base": base, "quant": "-", "needs": "-", "where": "-", "tok/s": "-", "score": "-"}
        row["downloads"] = format_count(listing.downloads) if listing.downloads is not None else "-"
        if candidate is None:
            return row
        total = candidate.needed_total_bytes if candidate.needed_total_bytes is not None else candidate.needed_bytes
        row |= {"quant": candidate.entry.quant, "where": candidate.where, "needs": format_bytes(total) if total is not None else "-"}
        if candidate.decode_tokens_per_s is not None:
            row["tok/s"] = f"{candidate.decode_tokens_per_s:,.1f}"
        if candidate.quality is not None:
            row["score"] = f"{candidate.quality.score:.1f}" + ("†" if self.base is not None else "")
        return row

    def to_json(self) -> dict[str, object]:
        listing, candidate = self.found.listing, self.candidate
        read = next((r for r in self.found.reads if candidate and r.quant.label == candidate.entry.quant), None)
        return {
            "repo": listing.repo_id,
            "downloads": listing.downloads,
            "likes": listing.likes,
            "last_modified": listing.last_modified,
            "base_models": list(listing.base_models),
            "inherits_from": self.base.family if self.base else None,
            "quants": [q.label for q in self.found.quants if not q.projector],
            "planned_quants": [r.quant.label for r in self.found.reads],
            "header_bytes_read": sum(r.bytes_read for r in self.found.reads),
            "files": list(read.quant.paths) if read else [],
            "candidate": candidate.to_json() | {"plan": None} if candidate else None,
            "quality_inherited": self.base is not None and candidate is not None and candidate.quality is not None,
            "pull": f"hf://{listing.repo_id} --quant {candidate.entry.quant}" if candidate else None,
        }


@dataclass(frozen=True)
class SearchRecommendation:
    """What a search found, in the hub's order, each planned on one machine, and the best of
    them all here (None: nothing fits)."""

    results: tuple[SearchResult, ...]
    skipped: tuple[SearchSkip, ...]
    recommendation: CatalogRecommendation

    @property
    def best(self) -> SearchResult | None:
        best = self.recommendation.best
        return next((r for r in self.results if best is not None and r.candidate is not None and r.candidate.key == best.key), None)

    def to_json(self) -> dict[str, object]:
        best = self.best
        rec = self.recommendation
        return {
            "hardware": rec.hardware.to_json(),
            "ctx": rec.ctx,
            "parallel": rec.parallel,
            "purpose": rec.purpose,
            "min_tokens_per_s": rec.min_tokens_per_s,
            "best": best.found.listing.repo_id if best else None,
            "results": [r.to_json() for r in self.results],
            "skipped": [s.to_json() for s in self.skipped],
        }


def search_hub(words: str, hardware: Hardware, *, sort: str = "downloads", limit: int = 20, **ask: object) -> SearchRecommendation:
    """``tierlocal search``: the GGUF repositories whose names hold ``words``, each planned on
    ``hardware`` (:mod:`tierlocal.fetch.hub_search` says which of its files; ``ask``: what
    :func:`catalog_recommendation` takes).

    Raises:
        SourceError: the hub refused, rate-limited or could not be reached.
    """
    found = search_repos(words, sort=sort, limit=limit)
    memory = sum(gpu.free_bytes for gpu in hardware.gpus if not gpu.unified_pool_bytes) + hardware.ram_available_bytes
    read, skipped = read_found(found, memory, default_header_cache())
    return search_recommendation(read, skipped, hardware, **ask)


def search_recommendation(found: Sequence[FoundRepo], skipped: Sequence[SearchSkip], hardware: Hardware, **ask: object) -> SearchRecommendation:
    """Every found repository's read quantisations planned together on ``hardware`` and ranked
    as the catalog is (``ask``: what :func:`catalog_recommendation` takes); each repository is
    shown at its own best-ranked quantisation. Embedding models are ranked among themselves (as
    ``check --for embeddings`` ranks them); the best of all is the best generation model."""
    catalog = load_models()
    entries: list[ModelEntry] = []
    models: dict[str, CatalogModel] = {}
    bases = {}
    for repo in found:
        bases[repo.listing.repo_id] = base_entry(repo.listing, catalog)
        repo_list, repo_models = repo_entries(repo.listing, repo.reads, bases[repo.listing.repo_id])
        entries += repo_list
        models.update(repo_models)
    chat = [e for e in entries if e.role == "chat"]
    embeddings = [e for e in entries if e.role == "embeddings"]
    recommendation = catalog_recommendation(chat, hardware, models=models, **ask)  # type: ignore[arg-type]
    ranked = list(recommendation.candidates)
    if embeddings:
        ranked += catalog_recommendation(embeddings, hardware, models=models, **{**ask, "purpose": "embeddings"}).candidates  # type: ignore[arg-type]
    results = []
    for repo in found:
        own = [c for c in ranked if c.entry.gguf_repo == repo.listing.repo_id]
        results.append(SearchResult(repo, bases[repo.listing.repo_id], own[0] if own else None))
    return SearchRecommendation(tuple(results), tuple(skipped), recommendation)

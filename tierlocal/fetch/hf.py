"""`tierlocal pull hf://…`: choose the file(s), check the disk, download resumably, verify,
and place them — in huggingface_hub's cache layout (so the hub's own tools and llama.cpp find
them) or in a directory the user names.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants

from ..errors import DiskFullError, SourceError, UsageError
from ..gguf.parse import parse_header
from ..units import format_bytes
from .download import DownloadedFile, download_file, partial_bytes
from .hub import RepoFile, RepoListing, list_gguf_files, locate_file, select_files
from .sources import LocalFileReader

__all__ = ["HfPullSpec", "PlannedFile", "PullPlan", "parse_hf_pull", "cached_gguf", "plan_hf_pull", "check_disk", "run_pull"]


@dataclass(frozen=True)
class HfPullSpec:
    """What the user asked for: a repo, and a file in it or a quantisation."""

    repo_id: str
    filename: str | None
    revision: str | None


@dataclass(frozen=True)
class PlannedFile:
    """One file to fetch: where it ends up, and bytes already there from an earlier run."""

    repo_file: RepoFile
    final_path: Path
    blob_path: Path
    present: bool
    partial_bytes: int


@dataclass(frozen=True)
class PullPlan:
    """Every file of one pull, with its sizes (bytes)."""

    source: str
    repo_id: str
    commit: str
    revision: str | None
    files: tuple[PlannedFile, ...]
    cache_dir: Path | None

    @property
    def total_bytes(self) -> int:
        return sum(f.repo_file.size for f in self.files)

    @property
    def remaining_bytes(self) -> int:
        return sum(0 if f.present else f.repo_file.size - f.partial_bytes for f in self.files)


def parse_hf_pull(text: str) -> HfPullSpec:
    """``hf://OWNER/REPO[@REV]`` or ``hf://OWNER/REPO/FILE.gguf[@REV]``."""
    rest = text.removeprefix("hf://")
    revision = None
    if "@" in rest:
        rest, revision = rest.rsplit("@", 1)
    parts = rest.split("/", 2)
    if len(parts) < 2 or not all(parts) or (len(parts) == 3 and not parts[2].endswith(".gguf")):
        raise UsageError(
            f"cannot read {text!r} as a Hugging Face repo or GGUF file",
            hint="write hf://OWNER/REPO --quant Q4_K_M, or hf://OWNER/REPO/FILE.gguf[@REVISION]",
        )
    return HfPullSpec(f"{parts[0]}/{parts[1]}", parts[2] if len(parts) == 3 else None, revision or None)


def _repo_cache_dir(repo_id: str) -> Path:
    return Path(hf_constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


def cached_gguf(spec: HfPullSpec, *, quant: str | None) -> Path | None:
    """The file ``spec`` (and ``quant``) names — the first of a split set — when the local hub
    cache already holds the whole set at the revision it was pulled at (``main`` or
    ``spec.revision``), found without asking the hub; None when any of it is missing."""
    cache_dir = _repo_cache_dir(spec.repo_id)
    revision = spec.revision or "main"
    ref = cache_dir / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = cache_dir / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    present = [path for path in sorted(snapshot.rglob("*.gguf")) if path.is_file()]  # a link to a blob that is there
    listing = RepoListing(spec.repo_id, commit, tuple(RepoFile(path.relative_to(snapshot).as_posix(), path.stat().st_size, None) for path in present))
    try:
        chosen = select_files(listing, quant=quant, filename=spec.filename)
    except UsageError:
        return None
    return snapshot / chosen[0].path


def plan_hf_pull(spec: HfPullSpec, *, quant: str | None, dest_dir: Path | None) -> PullPlan:
    """Resolve the file set on the hub and decide each file's final path."""
    listing = list_gguf_files(spec.repo_id, spec.revision)
    chosen = select_files(listing, quant=quant, filename=spec.filename)
    cache_dir = None if dest_dir is not None else _repo_cache_dir(spec.repo_id)
    planned = []
    for repo_file in chosen:
        if dest_dir is not None:
            final = dest_dir / repo_file.path.rsplit("/", 1)[-1]
            blob = final
        else:
            assert cache_dir is not None
            if repo_file.sha256 is None:
                raise SourceError(f"hf://{spec.repo_id}/{repo_file.path}", "the hub lists no sha256 for this file", hint="pull it with --dir DIR")
            blob = cache_dir / "blobs" / repo_file.sha256
            final = cache_dir / "snapshots" / listing.commit / repo_file.path
        present = blob.is_file() and blob.stat().st_size == repo_file.size
        have = 0 if present else partial_bytes(blob, repo_file.size, repo_file.sha256)
        planned.append(PlannedFile(repo_file, final, blob, present, have))
    source = f"hf://{spec.repo_id}" + (f"@{spec.revision}" if spec.revision else "")
    return PullPlan(source, spec.repo_id, listing.commit, spec.revision, tuple(planned), cache_dir)


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_disk(plan: PullPlan, keep_free_bytes: int) -> None:
    """Refuse before any byte moves when the target's free space is below what remains to
    download plus ``keep_free_bytes``."""
    target = plan.files[0].blob_path.parent
    free = shutil.disk_usage(_existing_ancestor(target)).free
    needed = plan.remaining_bytes + keep_free_bytes
    if plan.remaining_bytes and free < needed:
        raise DiskFullError(
            f"not enough disk: {_existing_ancestor(target)} has {format_bytes(free)} free; the download needs "
            f"{format_bytes(plan.remaining_bytes)} more and {format_bytes(keep_free_bytes)} kept free",
            hint="free some space, pull to a larger disk with --dir DIR, or lower --keep-free",
        )


def _check_gguf(path: Path) -> None:
    reader = LocalFileReader(path)
    try:
        parse_header(reader)
    finally:
        reader.close()


def _link_into_snapshot(plan: PullPlan, planned: PlannedFile) -> None:
    """huggingface_hub's layout: snapshots/COMMIT/PATH → ../../blobs/SHA256, refs/REV."""
    assert plan.cache_dir is not None
    link = planned.final_path
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(planned.blob_path, link.parent)
    if link.is_symlink() or link.exists():
        if link.is_symlink() and os.readlink(link) == target:
            return
        link.unlink()
    temporary = link.with_name(link.name + ".tierlocal-link")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, link)
    revision = plan.revision or "main"
    if revision != plan.commit:
        refs = plan.cache_dir / "refs" / revision
        refs.parent.mkdir(parents=True, exist_ok=True)
        temporary_ref = refs.with_name(refs.name + ".tierlocal-tmp")
        temporary_ref.write_text(plan.commit)
        os.replace(temporary_ref, refs)


def run_pull(
    plan: PullPlan, *, progress: Callable[[int], None] | None = None, on_file: Callable[[PlannedFile], None] | None = None
) -> list[DownloadedFile]:
    """Download every file of ``plan`` that is not already present; returns them in order."""
    results = []
    for planned in plan.files:
        repo_file = planned.repo_file
        if on_file is not None:
            on_file(planned)
        planned.blob_path.parent.mkdir(parents=True, exist_ok=True)
        if planned.present:
            result = DownloadedFile(planned.final_path, repo_file.size, repo_file.sha256 or "", 0)
        else:

            def locate(repo_file: RepoFile = repo_file) -> tuple[str, dict[str, str]]:
                location = locate_file(plan.repo_id, repo_file.path, plan.commit)
                return location.url, location.headers

            name = f"hf://{plan.repo_id}/{repo_file.path}"
            downloaded = download_file(
                name, locate, planned.blob_path, size=repo_file.size, sha256=repo_file.sha256, check=_check_gguf, progress=progress
            )
            result = DownloadedFile(planned.final_path, downloaded.size, downloaded.sha256, downloaded.fetched_bytes)
        if plan.cache_dir is not None:
            _link_into_snapshot(plan, planned)
        results.append(result)
    return results

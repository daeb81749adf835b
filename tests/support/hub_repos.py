"""Hub repositories of real layouts for the loopback hub (:func:`tests.support.servers.fake_hub`):
the file names, folders and splits the big GGUF publishers use (unsloth, bartowski, lmstudio-community,
ggml-org, Qwen, mradermacher), mmproj projectors beside vision models, cards that name a base
model, and gated, private and incomplete repositories.

Every model file is a sparse GGUF written from a catalog model's compact header
(recipes/headers/, the tensor types llama.cpp's own ``llama-quantize --dry-run`` gives that
quantisation of the published shape), split as gguf-split splits it where the publisher splits
it; its data is a hole, so a 75 GB file costs a few MB of disk. The one label whose recipe the
catalog has no header for (unsloth's ``UD-Q4_K_XL``) carries Q4_K_M's tensor types: the name
is what is under test there. Built once into the test cache (outside the checkout), keyed by
this module and the headers it reads.

The layouts follow paths quoted in public download scripts and configs (the Hub itself is not
reachable where this was written, 2026-12-06): unsloth's older repos put a split quantisation in
a folder named like the file (``Llama-3.3-70B-Instruct-Q8_0/…-00001-of-00002.gguf``), its newer
ones in one named by the label (``Q8_0/Qwen3-Coder-Next-Q8_0-00001-of-00003.gguf``); Qwen splits
even a 7B's files beside the others (``qwen2.5-7b-instruct-q8_0-00001-of-00003.gguf``); ggml-org's
gpt-oss-120b is ``gpt-oss-120b-mxfp4-0000N-of-00003.gguf``; bartowski names older repos' files
without the organisation (``Llama-3.3-70B-Instruct-Q4_K_M.gguf``) and newer ones with it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.catalog_headers import header_path
from tests.support.compact_file import write_compact_as_gguf, write_compact_as_split
from tests.support.servers import HubRepo
from tests.support.sparse_projectors import SparseProjector, write_sparse_projector

__all__ = ["Layout", "LAYOUTS", "hub_repos", "PRIVATE_TOKEN"]

PRIVATE_TOKEN = "hf_private_token_for_tests_0123456789"


@dataclass(frozen=True)
class Layout:
    """One repository: which catalog model's headers its files carry, each file's path per
    quantisation (``{q}`` / ``{Q}``: the label lower / upper case), the quantisations split into
    ``splits[label]`` shards (``{i}`` and ``{n}`` in ``split_path``), its projector and card."""

    repo_id: str
    model: str
    path: str
    quants: tuple[str, ...] = ("Q4_K_M", "Q6_K", "Q8_0")
    splits: dict[str, int] = field(default_factory=dict)
    split_path: str = ""
    projector: str | None = None
    projector_embd: int = 0
    base_model: str | list[str] | None = None
    licence: str = "apache-2.0"
    downloads: int = 1000
    likes: int = 10
    gated: bool = False
    private: bool = False
    #: Shards left out of the listing (an upload cut short).
    missing: tuple[str, ...] = ()
    #: The catalog header a label's file carries where the label is not a catalog quantisation.
    header_of: dict[str, str] = field(default_factory=dict)


LAYOUTS: tuple[Layout, ...] = (
    Layout("unsloth/Qwen3-8B-GGUF", "qwen3-8b", "Qwen3-8B-{Q}.gguf", base_model="Qwen/Qwen3-8B", downloads=250_000, likes=180),
    Layout("bartowski/Qwen_Qwen3-14B-GGUF", "qwen3-14b", "Qwen_Qwen3-14B-{Q}.gguf", base_model="Qwen/Qwen3-14B", downloads=90_000, likes=40),
    Layout("lmstudio-community/Qwen3-30B-A3B-GGUF", "qwen3-30b-a3b", "Qwen3-30B-A3B-{Q}.gguf", base_model="Qwen/Qwen3-30B-A3B", downloads=120_000),
    Layout("mradermacher/Qwen3-4B-GGUF", "qwen3-4b", "Qwen3-4B.{Q}.gguf", base_model="Qwen/Qwen3-4B", downloads=3_000),
    Layout(
        "Qwen/Qwen2.5-7B-Instruct-GGUF",
        "qwen2.5-7b",
        "qwen2.5-7b-instruct-{q}.gguf",
        splits={"Q6_K": 2, "Q8_0": 3},
        split_path="qwen2.5-7b-instruct-{q}-{i}-of-{n}.gguf",
        base_model="Qwen/Qwen2.5-7B-Instruct",
        downloads=60_000,
    ),
    Layout(
        "unsloth/Llama-3.3-70B-Instruct-GGUF",
        "llama-3.3-70b",
        "Llama-3.3-70B-Instruct-{Q}.gguf",
        splits={"Q6_K": 2, "Q8_0": 2},
        split_path="Llama-3.3-70B-Instruct-{Q}/Llama-3.3-70B-Instruct-{Q}-{i}-of-{n}.gguf",
        base_model="meta-llama/Llama-3.3-70B-Instruct",
        licence="llama3.3",
        downloads=40_000,
    ),
    Layout(
        "bartowski/Llama-3.3-70B-Instruct-GGUF",
        "llama-3.3-70b",
        "Llama-3.3-70B-Instruct-{Q}.gguf",
        splits={"Q8_0": 2},
        split_path="Llama-3.3-70B-Instruct-{Q}/Llama-3.3-70B-Instruct-{Q}-{i}-of-{n}.gguf",
        base_model="meta-llama/Llama-3.3-70B-Instruct",
        licence="llama3.3",
        downloads=35_000,
    ),
    Layout(
        "ggml-org/gemma-3-4b-it-GGUF",
        "gemma-3-4b",
        "gemma-3-4b-it-{Q}.gguf",
        quants=("Q4_K_M", "Q8_0"),
        projector="mmproj-model-f16.gguf",
        projector_embd=2560,
        base_model="google/gemma-3-4b-it",
        licence="gemma",
        downloads=80_000,
    ),
    Layout(
        "unsloth/gemma-3-12b-it-GGUF",
        "gemma-3-12b",
        "gemma-3-12b-it-{Q}.gguf",
        projector="mmproj-F16.gguf",
        projector_embd=3840,
        base_model="google/gemma-3-12b-it",
        licence="gemma",
        downloads=70_000,
    ),
    Layout(
        "unsloth/Qwen3-Next-80B-A3B-Instruct-GGUF",
        "qwen3-next-80b-a3b",
        "Qwen3-Next-80B-A3B-Instruct-{Q}.gguf",
        splits={"Q6_K": 2, "Q8_0": 2},
        split_path="{Q}/Qwen3-Next-80B-A3B-Instruct-{Q}-{i}-of-{n}.gguf",
        base_model="Qwen/Qwen3-Next-80B-A3B-Instruct",
        downloads=20_000,
    ),
    Layout(
        "ggml-org/gpt-oss-20b-GGUF",
        "gpt-oss-20b",
        "gpt-oss-20b-mxfp4.gguf",
        quants=("MXFP4_MOE",),
        base_model="openai/gpt-oss-20b",
        downloads=150_000,
    ),
    Layout(
        "ggml-org/gpt-oss-120b-GGUF",
        "gpt-oss-120b",
        "gpt-oss-120b-mxfp4.gguf",
        quants=("MXFP4_MOE",),
        splits={"MXFP4_MOE": 3},
        split_path="gpt-oss-120b-mxfp4-{i}-of-{n}.gguf",
        base_model="openai/gpt-oss-120b",
        downloads=100_000,
    ),
    Layout("bartowski/microsoft_phi-4-GGUF", "phi-4", "microsoft_phi-4-{Q}.gguf", base_model="microsoft/phi-4", licence="mit", downloads=15_000),
    Layout(
        "unsloth/Mistral-Small-3.2-24B-Instruct-2506-GGUF",
        "mistral-small-3.2-24b",
        "Mistral-Small-3.2-24B-Instruct-2506-{Q}.gguf",
        base_model="mistralai/Mistral-Small-3.2-24B-Instruct-2506",
        downloads=25_000,
    ),
    Layout(
        "lmstudio-community/gemma-3-27b-it-GGUF",
        "gemma-3-27b",
        "gemma-3-27b-it-{Q}.gguf",
        quants=("Q4_K_M", "Q8_0"),
        projector="mmproj-model-f16.gguf",
        projector_embd=5376,
        base_model="google/gemma-3-27b-it",
        licence="gemma",
        downloads=45_000,
    ),
    Layout(
        "example-lab/Qwen3-8B-abliterated-GGUF",
        "qwen3-8b",
        "Qwen3-8B-abliterated-{Q}.gguf",
        base_model="example-lab/Qwen3-8B-abliterated",
        downloads=800,
    ),
    Layout(
        "mradermacher/Mistral-Nemo-Instruct-2407-i1-GGUF",
        "mistral-nemo-12b",
        "Mistral-Nemo-Instruct-2407.i1-{Q}.gguf",
        quants=("Q4_K_M", "Q6_K"),
        base_model="mistralai/Mistral-Nemo-Instruct-2407",
        downloads=2_000,
    ),
    Layout(
        "Qwen/Qwen3-Embedding-0.6B-GGUF",
        "qwen3-embedding-0.6b",
        "Qwen3-Embedding-0.6B-{Q}.gguf",
        quants=("Q8_0", "F16"),
        base_model="Qwen/Qwen3-Embedding-0.6B",
        downloads=30_000,
    ),
    Layout(
        "unsloth/DeepSeek-R1-Distill-Llama-8B-GGUF",
        "deepseek-r1-distill-llama-8b",
        "DeepSeek-R1-Distill-Llama-8B-{Q}.gguf",
        base_model="deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
        licence="mit",
        downloads=18_000,
    ),
    Layout(
        "bartowski/DeepSeek-R1-Distill-Qwen-14B-GGUF",
        "deepseek-r1-distill-qwen-14b",
        "DeepSeek-R1-Distill-Qwen-14B-{Q}.gguf",
        base_model="deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        licence="mit",
        downloads=16_000,
    ),
    Layout(
        "unsloth/Qwen3-0.6B-GGUF",
        "qwen3-0.6b",
        "Qwen3-0.6B-{Q}.gguf",
        quants=("Q4_K_M", "UD-Q4_K_XL", "Q8_0"),
        header_of={"UD-Q4_K_XL": "Q4_K_M"},
        base_model="Qwen/Qwen3-0.6B",
        downloads=50_000,
    ),
    Layout(
        "tiiuae/Falcon-H1-1.5B-Instruct-GGUF",
        "falcon-h1-1.5b",
        "Falcon-H1-1.5B-Instruct-{Q}.gguf",
        base_model="tiiuae/Falcon-H1-1.5B-Instruct",
        licence="other",
        downloads=1_500,
    ),
    Layout(
        "google/gemma-3-1b-it-qat-q4_0-gguf",
        "gemma-3-1b",
        "gemma-3-1b-it-q4_0.gguf",
        quants=("Q4_K_M",),
        base_model="google/gemma-3-1b-it",
        licence="gemma",
        gated=True,
        downloads=9_000,
    ),
    Layout("acme/private-Qwen3-1.7B-GGUF", "qwen3-1.7b", "Qwen3-1.7B-{Q}.gguf", quants=("Q4_K_M",), base_model="Qwen/Qwen3-1.7B", private=True),
    Layout(
        "bartowski/Qwen_Qwen3-32B-GGUF",
        "qwen3-32b",
        "Qwen_Qwen3-32B-{Q}.gguf",
        splits={"Q8_0": 2},
        split_path="Qwen_Qwen3-32B-{Q}/Qwen_Qwen3-32B-{Q}-{i}-of-{n}.gguf",
        missing=("Qwen_Qwen3-32B-Q8_0/Qwen_Qwen3-32B-Q8_0-00002-of-00002.gguf",),
        base_model="Qwen/Qwen3-32B",
        downloads=28_000,
    ),
)


def _fill(template: str, label: str, **more: object) -> str:
    return template.format(Q=label, q=label.lower(), **more)


def _build(layout: Layout, directory: Path) -> None:
    for label in layout.quants:
        compact = json.loads(header_path(layout.model, layout.header_of.get(label, label)).read_text())
        shards = layout.splits.get(label)
        if shards:
            first = directory / _fill(layout.split_path, label, i="00001", n=f"{shards:05d}")
            prefix = first.name.rsplit("-00001-of-", 1)[0]
            first.parent.mkdir(parents=True, exist_ok=True)
            write_compact_as_split(compact, first.parent / f"{prefix}.gguf", shards)
        else:
            path = directory / _fill(layout.path, label)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_compact_as_gguf(compact, path)
    if layout.projector:
        tower = SparseProjector(f"{layout.model}-mmproj", "gemma3", 27, 1152, 4304, 16, 896, 14, layout.projector_embd)
        write_sparse_projector(directory / layout.projector, tower)
    for missing in layout.missing:
        (directory / missing).unlink()


def _cache_key() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for source in ("compact_file.py", "sparse_projectors.py"):
        digest.update((Path(__file__).parent / source).read_bytes())
    for layout in LAYOUTS:
        for label in layout.quants:
            digest.update(header_path(layout.model, layout.header_of.get(label, label)).read_bytes())
    return digest.hexdigest()[:16]


def _built(cache_root: Path) -> Path:
    """The repositories' directory, built once per cache key."""
    root = cache_root / f"hub-repos-{_cache_key()}"
    if root.is_dir():
        return root
    cache_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache_root, prefix=".hub-repos-"))
    for layout in LAYOUTS:
        _build(layout, scratch / layout.repo_id)
    try:
        scratch.rename(root)
    except OSError:  # another process built it first
        shutil.rmtree(scratch, ignore_errors=True)
    return root


def hub_repos(cache_root: Path) -> list[HubRepo]:
    """Every layout as a :class:`HubRepo` over the built files; each file's LFS sha256 is
    declared (a digest of the repo and path: no 75 GB file is hashed)."""
    root = _built(cache_root)
    repos = []
    for layout in LAYOUTS:
        directory = root / layout.repo_id
        declared = {
            str(p.relative_to(directory)): hashlib.sha256(f"{layout.repo_id}/{p.relative_to(directory)}".encode()).hexdigest()
            for p in directory.rglob("*.gguf")
        }
        card: dict[str, object] = {"license": layout.licence, "tags": ["gguf"]}
        if layout.base_model is not None:
            card["base_model"] = layout.base_model
        repos.append(
            HubRepo(
                layout.repo_id,
                directory,
                private=layout.private,
                token=PRIVATE_TOKEN if layout.private or layout.gated else None,
                declared_sha256=declared,
                card=card,
                gated=layout.gated,
                downloads=layout.downloads,
                likes=layout.likes,
            )
        )
    return repos

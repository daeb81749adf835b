"""Host memory as the kernel sees it: what a llama-server process holds in system RAM, split the
way an OOM killer, a cgroup ``MemoryMax`` or a container limit counts it. Pure.

- **mapped** (``RssFile``): with mmap (llama-server's default load mode) the weights on the CPU
  are pages of the model file in the page cache, mapped into the process: reclaimable, but
  resident and counted while mapped. Without mmap they are read into anonymous memory instead.
- **anonymous** (``RssAnon``): what only this process holds — the CPU backend's repacked copies
  of weight matrices (``CPU_REPACK``), the KV cache, the compute and output buffers, the weights
  themselves without mmap, and the engine's own heap (vocabulary, threads, HTTP server).
- **peak** (``VmHWM``): mapped + anonymous + the engine's own binary pages, reached as the load
  finishes. The compute buffer is reserved then but its pages are touched only as prompts
  grow: **in use** adds it, the figure a memory limit has to allow.

The CPU backend repacks a weight matrix into an interleaved anonymous copy when its type has
a kernel for this CPU and its row count divides the interleave (ggml-cpu/repack.cpp,
``ggml_repack_get_optimal_repack_type``): on x86 with AVX2, Q4_0, Q4_K, IQ4_NL and MXFP4 in
blocks of 8 rows, and Q2_K with AVX-512; on ARM with dot-product or int8-matmul instructions,
Q4_0, Q4_K, Q5_K, Q6_K, IQ4_NL, MXFP4 and Q8_0. Only matrices the backend multiplies are
repacked — never the token embedding, which it reads row by row, except for a tied output, which
loads the embedding a second time as the output projection. With mmap the file stays mapped
beside the copy, so a Q4_K_M model on the CPU holds most of its weights twice.

Usage adds to this afterwards, bounded by llama-server's own limits: saved prompts (the prompt
cache, ``--cache-ram``, 8 GiB by default) and, for sliding-window and recurrent models, context
checkpoints (``--ctx-checkpoints``) — reported beside the figures, not in them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .estimate import Machine, RunEstimate
from .memory import WeightsSplit, gpu_layers, weights_split
from .model import ModelSpec
from .placement import RepackClass, repack_classes

__all__ = [
    "HostMemory",
    "host_memory",
    "prompt_cache_cap",
    "repacked_bytes",
    "repack_rules",
    "token_embedding_repack",
    "LOAD_MODES",
    "ENGINE_FILE_BYTES",
    "PROMPT_CACHE_DEFAULT_BYTES",
]

#: llama-server's --load-mode values tierlocal plans for.
LOAD_MODES = ("mmap", "none", "mlock")
#: The llama-server binary's and its libraries' own resident file pages: RssFile of a process
#: whose model is not mapped. 12.0–12.4 MiB for a static CPU build (2026-11-30); 15.5–16.2 MiB
#: for the shared-library build `tierlocal engine build` makes, as llama.cpp's own release
#: archives are built (libllama, libggml*, libmtmd beside the binary; 2026-12-02).
ENGINE_FILE_BYTES = 16 * 2**20
#: The engine's own anonymous memory besides the buffers it reports: a fixed part and a part
#: per vocabulary entry (token strings, the token-to-piece cache, each slot's sampler arrays).
#: Fitted, 2026-11-30, to two loads of this llama.cpp (Gemma 3 270M, 262,144 tokens: 55.1 MiB;
#: a Llama-3-8B-shaped file, 128,256 tokens: 27.7 MiB); the rest of bench/host_memory.py is
#: held out.
ENGINE_BASE_BYTES = 6 * 2**20
ENGINE_BYTES_PER_VOCAB_ENTRY = 190
#: llama-server's --cache-ram default: saved prompts may take this much more, as they are used.
PROMPT_CACHE_DEFAULT_BYTES = 8 * 2**30

# (CPU feature that enables the kernel, rows per interleave) per type, from repack.cpp.
_X86_RULES = {"Q4_0": ("avx2", 8), "Q4_K": ("avx2", 8), "IQ4_NL": ("avx2", 8), "MXFP4": ("avx2", 8), "Q2_K": ("avx512f", 8)}
_ARM_RULES = {
    "Q4_0": ("asimddp", 4),
    "Q4_K": ("asimddp", 8),
    "Q5_K": ("asimddp", 8),
    "Q6_K": ("asimddp", 8),
    "IQ4_NL": ("asimddp", 4),
    "MXFP4": ("asimddp", 4),
    "Q8_0": ("asimddp", 4),
}


def repack_rules(cpu_arch: str, cpu_features: Iterable[str]) -> dict[str, int]:
    """Types the CPU backend repacks on this CPU, with the row multiple each needs."""
    features = set(cpu_features)
    rules = _X86_RULES if cpu_arch in ("x86_64", "amd64", "i686") else _ARM_RULES if cpu_arch in ("aarch64", "arm64") else {}
    return {ggml_type: rows for ggml_type, (feature, rows) in rules.items() if feature in features}


def repacked_bytes(classes: Iterable[RepackClass], rules: dict[str, int]) -> int:
    """Bytes of the CPU_REPACK copies of matrices in ``classes`` (the same size as the matrices
    they copy): those of a type ``rules`` name whose row count divides its interleave."""
    return sum(cls.n_bytes for cls in classes if (multiple := rules.get(cls.ggml_type)) is not None and cls.rows % multiple == 0)


def token_embedding_repack(spec: ModelSpec) -> tuple[RepackClass, ...]:
    """The token embedding's matrices by type and row count (a tied output multiplies by them;
    computed once per spec)."""
    found = spec.plan_cache.get("token_embd_repack")
    if found is None:
        found = spec.plan_cache["token_embd_repack"] = repack_classes([t for t in spec.tensors if t.layer == -1 and t.name.startswith("token_embd.")])
    return found


@dataclass(frozen=True)
class HostMemory:
    """One load mode's host memory, in bytes (see the module docstring for what each holds).
    ``repack_bytes`` and ``engine_bytes`` are inside ``anonymous_bytes``; ``locked_bytes`` is
    what ``mlock`` pins; ``grows_by_bytes`` what use may add (the prompt cache's limit)."""

    load_mode: str
    mapped_bytes: int
    anonymous_bytes: int
    peak_bytes: int
    repack_bytes: int
    engine_bytes: int
    #: The compute buffer: reserved at load, its pages touched as prompts grow (not in the
    #: load figures; in :attr:`in_use_bytes`).
    compute_bytes: int = 0
    locked_bytes: int = 0
    grows_by_bytes: int = PROMPT_CACHE_DEFAULT_BYTES
    #: The output buffer's growth at the first full batch when every token is an output
    #: (embeddings; not in the load figures; in :attr:`in_use_bytes`).
    output_grows_by_bytes: int = 0

    @property
    def in_use_bytes(self) -> int:
        """The most the process holds serving full-size prompts: the load peak, every page
        of the compute buffer and, serving embeddings, the grown output buffer (the prompt
        cache's growth aside)."""
        return self.peak_bytes + self.compute_bytes + self.output_grows_by_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "load_mode": self.load_mode,
            "mapped_bytes": self.mapped_bytes,
            "anonymous_bytes": self.anonymous_bytes,
            "peak_bytes": self.peak_bytes,
            "in_use_bytes": self.in_use_bytes,
            "repack_bytes": self.repack_bytes,
            "engine_bytes": self.engine_bytes,
            "compute_bytes": self.compute_bytes,
            "output_grows_by_bytes": self.output_grows_by_bytes,
            "locked_bytes": self.locked_bytes,
            "grows_by_bytes": self.grows_by_bytes,
        }


def prompt_cache_cap(in_use_bytes: int, host_free_bytes: int, margin_bytes: int) -> int:
    """How much RAM llama-server's prompt cache may take (``--cache-ram``, bytes, whole MiB):
    what the host has left once the plan's process is in use and the margin is kept, at most the
    engine's 8 GiB default — so a plan that fits at load still fits once saved prompts pile up."""
    left = max(host_free_bytes - in_use_bytes - margin_bytes, 0)
    return min(left, PROMPT_CACHE_DEFAULT_BYTES) // 2**20 * 2**20


def host_memory(spec: ModelSpec, estimate: RunEstimate, machine: Machine, load_mode: str = "mmap") -> HostMemory:
    """The host's share of ``estimate`` for ``load_mode`` (``mmap``, ``none``: read into
    anonymous memory, ``mlock``: read and pinned), on a CPU with ``machine.cpu_features``."""
    request = estimate.request
    ngl, n_cpu_moe = request.ngl or 0, request.n_cpu_moe or 0
    split = weights_split(spec, ngl, n_cpu_moe=n_cpu_moe, max_tensor_bytes=machine.max_tensor_bytes)
    rules = repack_rules(machine.cpu_arch, machine.cpu_features)
    repacked_in_place = _repacked_in_place(spec, split, rules, (ngl, n_cpu_moe, machine.max_tensor_bytes))  # copies of tensors the file holds once
    repack = repacked_in_place
    if spec.tied_output and not gpu_layers(spec, request.ngl or 0)[spec.n_layer]:
        # A tied output on the CPU is the token embedding loaded a second time for the output
        # projection, a matrix multiplication: repacked where its type allows.
        repack += repacked_bytes(token_embedding_repack(spec), rules)
    host = estimate.devices[-1]
    engine = ENGINE_BASE_BYTES + ENGINE_BYTES_PER_VOCAB_ENTRY * spec.n_vocab
    buffers = host.kv_bytes + host.output_bytes + repack + engine  # the KV cache is cleared at load: every page touched
    if load_mode == "mmap":
        mapped, anonymous, locked = split.cpu_mapped_bytes, buffers, 0
    else:  # the weights that are not repacked are read into an anonymous CPU buffer
        mapped, anonymous = 0, buffers + split.cpu_bytes - repacked_in_place
        locked = split.cpu_bytes - repacked_in_place if load_mode == "mlock" else 0
    peak = mapped + anonymous + ENGINE_FILE_BYTES
    return HostMemory(
        load_mode, mapped, anonymous, peak, repack, engine, host.compute_bytes, locked, output_grows_by_bytes=host.output_grows_by_bytes
    )


def _repacked_in_place(spec: ModelSpec, split: WeightsSplit, rules: dict[str, int], key: tuple[int, int, int | None]) -> int:
    """:func:`repacked_bytes` of ``split``'s CPU matrices, once per split (``key``) and CPU rules:
    each load mode of a plan asks."""
    table = spec.plan_cache.setdefault("repacked_in_place", {})
    rules_key = (*key, *sorted(rules.items()))
    found = table.get(rules_key)
    if found is None:
        found = table[rules_key] = repacked_bytes(split.cpu_repack, rules)
    return found

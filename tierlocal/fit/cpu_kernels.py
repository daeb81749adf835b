"""How llama.cpp's CPU backend multiplies a decode batch of several rows, by weight type: the
kernel each type runs (repacked gemm, tinyBLAS, or one mat-vec per row) and the share of a mat-vec
a further row pays where rows are multiplied one by one (:mod:`tierlocal.fit.concurrency` prices
a step with them). Pure."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CPU_ROW_COMPUTE_SHARE", "CpuKernels", "cpu_kernels"]

#: The share of a CPU mat-vec that a further row of the same batch pays: its compute, the rest
#: being the weights' read, which the next row finds in cache (ggml runs each chunk of weight rows
#: against every row of the batch). Fitted 2026-12-05 on this repository's 2-core Sapphire Rapids
#: CPU to the 2- and 3-user points of a Qwen3-1.7B-shaped file (bench/concurrency_accuracy.py);
#: the Llama-3-8B shape and Gemma 3 270M are held out. Cross-check: the weights' bytes at two
#: threads × the one-thread RAM read `hw --calibrate` measures leave 0.47–0.60 for compute.
CPU_ROW_COMPUTE_SHARE = 0.54

#: Weight types llama.cpp's CPU backend multiplies with llamafile's tinyBLAS when a batch has two
#: or more rows on x86 (``llamafile_sgemm`` in ggml/src/ggml-cpu/llamafile/sgemm.cpp: F32, BF16,
#: F16, Q8_0, Q4_0, Q5_0, IQ4_NL; ``n < 2`` is refused): the sequences of a step share each
#: weight block read, so a further one costs its FLOPs only.
_X86_SHARED_TYPES = frozenset({"F32", "BF16", "F16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"})


@dataclass(frozen=True)
class CpuKernels:
    """How the CPU backend multiplies a batch of B rows, by weight type: ``repacked`` types run
    ggml's repacked gemm on each block of 4 rows and its gemv on the rest one by one
    (``forward_mul_mat`` in ggml/src/ggml-cpu/repack.cpp); ``shared`` types share the weights'
    reads across rows (tinyBLAS); any other type pays one mat-vec per row (ggml's vec_dot)."""

    repacked: frozenset[str] = frozenset()
    shared: frozenset[str] | None = None

    def kind(self, ggml_type: str) -> str:
        """``repacked``, ``shared`` or ``per-row`` for a weight type."""
        if ggml_type in self.repacked:
            return "repacked"
        return "shared" if self.shared is None or ggml_type in self.shared else "per-row"


def cpu_kernels(cpu_arch: str, repacked: frozenset[str]) -> CpuKernels:
    """The CPU's batch kernels: the types it repacks (:func:`~.host_memory.repack_rules`), and on
    x86 the tinyBLAS types; elsewhere every type is taken to share its reads."""
    shared = _X86_SHARED_TYPES if cpu_arch in ("x86_64", "amd64", "i686") else None
    return CpuKernels(repacked, shared)

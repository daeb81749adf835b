"""Which blocks of a model see a sliding window, and how wide, as llama.cpp decides it. Pure.

The rules follow llama.cpp's src/models/<arch>.cpp (the version vendored in llama-cpp-python
0.3.36): ``{arch}.attention.sliding_window`` gives the window; ``sliding_window_pattern`` (an
array, or a period) gives the blocks, else the architecture's own default period.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SWA_DEFAULT_PATTERNS", "sliding_window", "swa_layers"]

#: Architectures whose sliding-window layers follow a period when the header gives none:
#: (period, dense_first). From llama.cpp's src/models/<arch>.cpp load_swa_pattern calls.
SWA_DEFAULT_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gpt-oss": (2, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "afmoe": (4, False),
    "olmo2": (4, False),
}


def sliding_window(metadata: Mapping[str, object], arch: str, n_layer: int) -> int:
    """The sliding window llama.cpp applies (tokens; 0: none). phi3.cpp turns a Phi header's
    window off; exaone4.cpp uses one only for the 64-block 32B (4,096 unless the header says)."""
    if arch == "phi3" or (arch == "exaone4" and n_layer != 64):
        return 0
    default = 4096 if arch == "exaone4" else 0
    return int(metadata.get(f"{arch}.attention.sliding_window", default))  # type: ignore[call-overload]


def swa_layers(metadata: Mapping[str, object], arch: str, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    """Per block: whether it sees only the last ``n_swa`` tokens."""
    if n_swa <= 0:
        return (False,) * n_layer
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return tuple(bool(v) for v in pattern[:n_layer]) + (False,) * max(0, n_layer - len(pattern))
    period, dense_first = SWA_DEFAULT_PATTERNS.get(arch, (0, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    if period == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layer))
    return tuple(il % period < period - 1 for il in range(n_layer))

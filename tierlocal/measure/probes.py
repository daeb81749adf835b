"""The probe models `tierlocal hw --calibrate` times: Llama-shaped sparse GGUFs
(:mod:`tierlocal.gguf.synthetic`) whose timings fix each weight type's rates and the fixed
costs (:func:`tierlocal.fit.calibration.fit_device_speed`). Pure data.

Every probe whose decode the fit prices by its matrices holds at least :data:`PROBE_MIN_BYTES`
of weights, more than a desktop's or a VPS share's last-level cache, so its weights stream from
RAM as a real model's do. Smaller probes ran from cache on a 2-core VPS (a share of a 480 MiB
L3) up to 3x faster per byte than the same layers in a 200 MB model: fitted on them, the cost
per matrix row came out zero and the small models people run (Gemma 3 270M, a 1.7B) ran 25-50%
slower than estimated. The tiny probe (4 blocks of 256) and the long-prompt one keep their
weights in cache: they time prefill's per-token cost and attention, and stay out of the decode fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..gguf.synthetic import ProbeShape

__all__ = ["PROBE_TYPES", "PROBES", "PROBE_MIN_BYTES", "Probe"]

#: Weight types timed: those the common GGUF quantisations are made of.
PROBE_TYPES = ("Q2_K", "Q3_K", "Q4_0", "Q4_K", "IQ4_NL", "Q5_0", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16")


@dataclass(frozen=True)
class Probe:
    """A probe model and the prompt it is timed with."""

    shape: ProbeShape
    prompt: int = 512
    #: Whether its decode timing enters the fit (not when its weights stay in cache).
    decode_fitted: bool = True


def _layers_for(shape: ProbeShape, least: int) -> int:
    """Blocks of ``shape`` that hold :data:`PROBE_MIN_BYTES` of weights, and at least ``least``."""
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[shape.weight_type]]
    q_dim, kv_dim = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    per_layer = shape.n_embd * (2 * q_dim + 2 * kv_dim + 3 * shape.n_ff) * block_bytes // block
    return max(least, -(-PROBE_MIN_BYTES // per_layer))


def _wide(weight_type: str) -> Probe:
    shape = ProbeShape(f"wide-{weight_type}", 8, 2048, 4 * 2048, 16, 4, 128, 4096, weight_type)
    return Probe(replace(shape, n_layer=_layers_for(shape, 8)))


def _medium(weight_type: str) -> Probe:
    """Rows of 768: with the wide probe, the type's cost per row apart from its byte rate."""
    shape = ProbeShape(f"medium-{weight_type}", 12, 768, 4 * 768, 6, 2, 128, 4096, weight_type)
    return Probe(replace(shape, n_layer=_layers_for(shape, 12)), prompt=256)


#: Weights a probe priced by its matrices holds at least (bytes): more than a last-level cache.
PROBE_MIN_BYTES = 160 << 20
_NARROW = ProbeShape("narrow", 32, 256, 768, 2, 2, 128, 4096, "Q8_0")
PROBES: tuple[Probe, ...] = (
    *(_wide(weight_type) for weight_type in PROBE_TYPES),
    *(_medium(weight_type) for weight_type in PROBE_TYPES),
    # many short layers: the cost per layer apart from rows and bytes (a short prompt: the KV
    # cache of 190 layers at 512 tokens would be read as much as the weights)
    Probe(replace(_NARROW, name="narrow-deep", n_layer=_layers_for(_NARROW, 32)), prompt=128),
    Probe(replace(_NARROW, name="narrow-32-long"), prompt=2048, decode_fitted=False),
    # the per-token cost of prefill (its weights stay in cache: read faster than a model's)
    Probe(replace(_NARROW, name="narrow-4", n_layer=4), decode_fitted=False),
    # a large vocabulary in a 1024-wide model: sampling's cost per vocabulary entry
    Probe(ProbeShape("vocab", 4, 1024, 4 * 1024, 8, 2, 128, 131072, "Q8_0")),
    # experts: zero weights route every token to the same experts (as the sparse test models do)
    # 12 blocks: a prompt long enough (seconds) to run at the CPU's sustained speed, as real ones do
    Probe(ProbeShape("experts-Q4_K", 12, 2048, 768, 16, 4, 128, 4096, "Q4_K", n_expert=32, n_expert_used=8)),
)

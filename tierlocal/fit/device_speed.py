"""What a device does per second for llama.cpp: effective rates per weight type and fixed
costs (:class:`DeviceSpeed`), measured on this CPU by `tierlocal hw --calibrate` or, for a GPU,
fitted to published llama-bench results (:mod:`tierlocal.fit.gpu_speed`). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..gguf.tables import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["DeviceSpeed", "bits_per_weight"]


def bits_per_weight(ggml_type: str) -> float | None:
    """Bits per weight of a ggml type name (``Q4_K`` 4.5), None for an unknown name."""
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    except KeyError:
        return None
    return size * 8 / block


@dataclass(frozen=True)
class DeviceSpeed:
    """One device's effective figures for llama.cpp: rates per ggml type (bytes/s streamed by
    decode's mat-vec; FLOP/s in prefill's mat-mul; ``*`` for any type not listed), attention
    FLOP/s, and fixed costs in seconds. ``source`` is ``measured`` (this CPU, calibrated),
    ``published`` or ``derived`` (a GPU, :mod:`tierlocal.fit.gpu_speed`) or ``bound`` (its
    memory bandwidth alone); ``note`` says how."""

    device: str
    source: str
    note: str
    decode_bytes_per_s: Mapping[str, float]
    prefill_flops_per_s: Mapping[str, float]
    attention_flops_per_s: float
    token_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    vocab_overhead_s: float = 0.0
    #: Seconds per matrix row multiplied in decode, by type: a mat-vec pays per row as well as
    #: per byte, so short rows (narrow models, a large vocabulary's output projection) run
    #: below the type's byte rate.
    decode_row_s: Mapping[str, float] = field(default_factory=dict)
    prefill_token_overhead_s: float = 0.0
    prefill_layer_overhead_s: float = 0.0
    #: Per element of a layer's width (n_embd + FFN width) per prompt token: element-wise work.
    prefill_element_s: float = 0.0
    #: The share of its prefill FLOP/s a decode batch's further sequences run at
    #: (:mod:`tierlocal.fit.concurrency`): 1.0 unless fitted.
    batch_flops_share: float = 1.0
    #: A CPU's share of a mat-vec that a further gemv row of the same decode batch pays
    #: (:data:`tierlocal.fit.cpu_kernels.CPU_ROW_COMPUTE_SHARE` unless `hw --calibrate` timed it).
    batch_row_share: float | None = None
    #: A CPU's seconds per matrix row that each further sequence of a decode batch pays beyond
    #: its FLOPs in a type multiplied as a batch (tinyBLAS): short rows use the kernel's tiles
    #: poorly; timed by `hw --calibrate` on a deep narrow probe, else 0.
    sequence_row_s: float = 0.0
    #: How many times a GPU's expert mat-mul (mul_mat_id) streams the weights of the experts a
    #: prompt batch touches, at its decode byte rate, beside the FLOPs: few rows per expert keep it
    #: bound by the reads. 0: not counted (a CPU's experts are timed by its calibration's probe).
    expert_batch_reads: float = 0.0
    #: From how many tokens of one decode step the backend's expert mat-mul reads an expert once
    #: for all the tokens routed to it; below it, once per token (llama.cpp's Metal: 32, CUDA: 5,
    #: recipes/batched_bench.toml [kernels]). 1: always once.
    expert_grouped_from: int = 1
    #: Tokens of one tile of the grouped expert mat-mul: an expert given fewer tokens still runs
    #: the whole tile's multiply-adds (llama.cpp's Metal kernel_mul_mm_id: 32, recipes/batched_bench.toml
    #: [kernels]), priced at the F16 prefill rate. 0: not counted.
    expert_tile_tokens: int = 0

    def expert_factor(self, table: Mapping[str, float], ggml_type: str) -> float:
        """Expert tensors' rate relative to dense ones: measured for ``x:TYPE`` entries (a
        probe with experts), else the ratio of the measured type nearest in bits."""
        measured = [name[2:] for name in table if name.startswith("x:") and name[2:] in table]
        if not measured:
            return 1.0
        bits = bits_per_weight(ggml_type) or 16.0
        nearest = min(measured, key=lambda name: abs((bits_per_weight(name) or 16.0) - bits))
        return table[f"x:{nearest}"] / table[nearest]

    def rate(self, table: Mapping[str, float], ggml_type: str) -> tuple[float, bool]:
        """The rate for ``ggml_type`` and whether it was measured for that type (else: the
        listed type nearest in bits per weight, or ``*``)."""
        if ggml_type in table:
            return table[ggml_type], True
        if "*" in table:  # one published figure for every type (a GPU's table row)
            return table["*"], True
        bits = bits_per_weight(ggml_type) or 16.0
        known = [(abs((bits_per_weight(name) or 16.0) - bits), name) for name in table if not name.startswith("x:")]
        return table[min(known)[1]], False

    def row_seconds(self, ggml_type: str) -> float:
        """Decode's cost per matrix row of ``ggml_type`` (0 without figures)."""
        return self.rate(self.decode_row_s, ggml_type)[0] if self.decode_row_s else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "source": self.source,
            "note": self.note,
            "decode_bytes_per_s": {name: round(rate) for name, rate in sorted(self.decode_bytes_per_s.items())},
            "prefill_flops_per_s": {name: round(rate) for name, rate in sorted(self.prefill_flops_per_s.items())},
            "attention_flops_per_s": round(self.attention_flops_per_s),
            "token_overhead_s": self.token_overhead_s,
            "layer_overhead_s": self.layer_overhead_s,
            "vocab_overhead_s": self.vocab_overhead_s,
            "decode_row_s": dict(sorted(self.decode_row_s.items())),
            "prefill_token_overhead_s": self.prefill_token_overhead_s,
            "prefill_layer_overhead_s": self.prefill_layer_overhead_s,
            "prefill_element_s": self.prefill_element_s,
            "batch_flops_share": self.batch_flops_share,
            "batch_row_share": self.batch_row_share,
            "sequence_row_s": self.sequence_row_s,
            "expert_batch_reads": self.expert_batch_reads,
            "expert_grouped_from": self.expert_grouped_from,
            "expert_tile_tokens": self.expert_tile_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DeviceSpeed:
        """Read :meth:`to_json`'s form back.

        Raises:
            ValueError: a field is missing or not a number (a damaged cache).
        """

        def rates(name: str) -> dict[str, float]:
            value = data.get(name)
            if not isinstance(value, dict) or not value or len(value) > 64:
                raise ValueError(f"{name} is not a table of rates")
            out = {str(key): float(rate) for key, rate in value.items()}
            if not all(math.isfinite(rate) and rate > 0 for rate in out.values()):
                raise ValueError(f"{name} has a rate that is not positive")
            return out

        def costs(name: str) -> dict[str, float]:
            value = data.get(name, {})
            if not isinstance(value, dict) or len(value) > 64:
                raise ValueError(f"{name} is not a table of costs")
            out = {str(key): float(cost) for key, cost in value.items()}
            if not all(math.isfinite(cost) and cost >= 0 for cost in out.values()):
                raise ValueError(f"{name} has a cost that is negative")
            return out

        def number(name: str) -> float:
            value = data.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} is not a non-negative number")
            return float(value)

        attention = number("attention_flops_per_s")
        if attention <= 0:
            raise ValueError("attention_flops_per_s is not positive")
        return cls(
            device=str(data.get("device", "cpu")),
            source=str(data.get("source", "measured")),
            note=str(data.get("note", ""))[:500],
            decode_bytes_per_s=rates("decode_bytes_per_s"),
            prefill_flops_per_s=rates("prefill_flops_per_s"),
            attention_flops_per_s=attention,
            token_overhead_s=number("token_overhead_s"),
            layer_overhead_s=number("layer_overhead_s"),
            vocab_overhead_s=number("vocab_overhead_s"),
            decode_row_s=costs("decode_row_s"),
            prefill_token_overhead_s=number("prefill_token_overhead_s"),
            prefill_layer_overhead_s=number("prefill_layer_overhead_s"),
            prefill_element_s=number("prefill_element_s"),
            batch_flops_share=number("batch_flops_share") or 1.0,
            batch_row_share=number("batch_row_share") if data.get("batch_row_share") is not None else None,
            sequence_row_s=number("sequence_row_s"),
            expert_batch_reads=number("expert_batch_reads"),
            expert_grouped_from=max(1, min(int(number("expert_grouped_from")), 4096)),
            expert_tile_tokens=max(0, min(int(number("expert_tile_tokens")), 4096)),
        )

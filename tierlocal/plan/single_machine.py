"""A frontier model on the largest single machine, honestly: its published GGUF quantisations
with llama.cpp keeping the routed experts in RAM — what each needs in RAM and on the GPU, the
decode speed RAM bandwidth allows at best, and the quality each loses, from the publisher.

The split comes from the architecture (recipes/frontier.toml ``[model.single_machine]``): the
routed experts' parameters are ``moe_blocks × routed_experts × 3 × expert_ffn × expert_latent``
(gate, up and down of each expert); everything else is assumed at ``other_bits_per_weight``.
Each token reads ``experts_per_token / routed_experts`` of the experts from RAM and the rest
from the GPU, so ``RAM bandwidth ÷ those bytes`` bounds decode from above (measured speeds, where
posted, sit beside it). Pure. Sizes in bytes, bandwidths in bytes/s, speeds in tokens/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["QuantOnOneMachine", "SingleMachinePlan", "single_machine_plan"]


@dataclass(frozen=True)
class QuantOnOneMachine:
    """One published quantisation on one machine. ``gpu_bytes``: the tensors outside the routed
    experts plus the KV cache and state; ``ram_bytes``: the routed experts (mapped from the file)."""

    name: str
    file_bytes: int
    routed_bytes: int
    gpu_bytes: int
    ram_bytes: int
    publisher_memory_bytes: int | None
    mean_kld: float | None
    top1_agreement: float | None
    perplexity: float | None
    ram_bytes_per_token: int
    decode_bound_tokens_per_s: float | None
    fits_here: bool

    @property
    def total_bytes(self) -> int:
        return self.gpu_bytes + self.ram_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "quant": self.name,
            "file_bytes": self.file_bytes,
            "routed_experts_bytes": self.routed_bytes,
            "gpu_bytes": self.gpu_bytes,
            "ram_bytes": self.ram_bytes,
            "total_bytes": self.total_bytes,
            "publisher_memory_bytes": self.publisher_memory_bytes,
            "mean_kld": self.mean_kld,
            "top1_agreement": self.top1_agreement,
            "perplexity": self.perplexity,
            "ram_bytes_per_token": self.ram_bytes_per_token,
            "decode_bound_tokens_per_s": None if self.decode_bound_tokens_per_s is None else round(self.decode_bound_tokens_per_s, 2),
            "fits_here": self.fits_here,
        }


@dataclass(frozen=True)
class SingleMachinePlan:
    """Every published quantisation on this machine, with the facts' sources."""

    quants: tuple[QuantOnOneMachine, ...]
    ctx: int
    ram_bandwidth_bytes_per_s: int
    engine: str
    placement: str
    baseline: str
    source: str
    date: str
    other_bits_per_weight: float
    measured: tuple[tuple[float, str, str], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "placement": self.placement,
            "ctx": self.ctx,
            "ram_bandwidth_bytes_per_s": self.ram_bandwidth_bytes_per_s,
            "other_bits_per_weight_assumed": self.other_bits_per_weight,
            "quality_baseline": self.baseline,
            "quants": [quant.to_json() for quant in self.quants],
            "measured": [{"tokens_per_s": speed, "setup": setup, "source": source} for speed, setup, source in self.measured],
            "source": self.source,
            "date": self.date,
        }


def _quant(
    raw: Mapping[str, object],
    *,
    other_params: int,
    other_bits: float,
    share: float,
    kv_bytes: int,
    gpu_bytes_here: int,
    ram_bytes_here: int,
    ram_bandwidth: int,
    gpu_bandwidth: int | None,
) -> QuantOnOneMachine:
    file_bytes = int(raw["file_bytes"])  # type: ignore[call-overload]
    other_bytes = min(round(other_params * other_bits / 8), file_bytes)
    routed = file_bytes - other_bytes
    per_token = round(routed * share)
    gpu_part, ram_part = other_bytes + kv_bytes, routed
    on_gpu = gpu_bytes_here >= gpu_part
    # Each token reads its experts' share from RAM, and the rest from the GPU (or RAM, without one).
    seconds = per_token / ram_bandwidth + (other_bytes / gpu_bandwidth if on_gpu and gpu_bandwidth else other_bytes / ram_bandwidth)
    fits = (on_gpu and ram_bytes_here >= ram_part) or ram_bytes_here >= gpu_part + ram_part
    optional = {key: (None if raw.get(key) is None else float(raw[key])) for key in ("mean_kld", "top1_agreement", "perplexity")}  # type: ignore[arg-type]
    memory = raw.get("publisher_memory_bytes")
    return QuantOnOneMachine(
        str(raw["name"]),
        file_bytes,
        routed,
        gpu_part,
        ram_part,
        None if memory is None else int(memory),  # type: ignore[call-overload]
        optional["mean_kld"],
        optional["top1_agreement"],
        optional["perplexity"],
        per_token,
        1 / seconds,
        fits,
    )


def single_machine_plan(
    raw: Mapping[str, object],
    *,
    params: int,
    kv_bytes: int,
    ctx: int,
    gpu_bytes_here: int,
    ram_bytes_here: int,
    ram_bandwidth_bytes_per_s: int,
    gpu_bandwidth_bytes_per_s: int | None,
) -> SingleMachinePlan:
    """``raw``'s quantisations on a machine with ``gpu_bytes_here`` of GPU memory and
    ``ram_bytes_here`` of RAM; ``kv_bytes``: the KV cache and state for ``ctx`` tokens.

    Raises:
        KeyError, TypeError, ValueError: the recipe table is malformed.
    """
    experts, used = int(raw["routed_experts"]), int(raw["experts_per_token"])  # type: ignore[call-overload]
    routed_params = int(raw["moe_blocks"]) * experts * 3 * int(raw["expert_ffn"]) * int(raw["expert_latent"])  # type: ignore[call-overload]
    other_bits = float(raw["other_bits_per_weight"])  # type: ignore[arg-type]
    quant_rows: Sequence[Mapping[str, object]] = raw["quant"]  # type: ignore[assignment]
    quants = tuple(
        _quant(
            row,
            other_params=params - routed_params,
            other_bits=other_bits,
            share=used / experts,
            kv_bytes=kv_bytes,
            gpu_bytes_here=gpu_bytes_here,
            ram_bytes_here=ram_bytes_here,
            ram_bandwidth=ram_bandwidth_bytes_per_s,
            gpu_bandwidth=gpu_bandwidth_bytes_per_s,
        )
        for row in quant_rows
    )
    measured_rows: Sequence[Mapping[str, object]] = raw.get("measured", ())  # type: ignore[assignment]
    return SingleMachinePlan(
        quants=quants,
        ctx=ctx,
        ram_bandwidth_bytes_per_s=ram_bandwidth_bytes_per_s,
        engine=str(raw["engine"]),
        placement=str(raw["placement"]),
        baseline=str(raw["baseline"]),
        source=str(raw["source"]),
        date=str(raw["date"]),
        other_bits_per_weight=other_bits,
        measured=tuple((float(row["tokens_per_s"]), str(row["setup"]), str(row["source"])) for row in measured_rows),  # type: ignore[arg-type]
    )

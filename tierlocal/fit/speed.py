"""Decode speed of a planned run: the bytes each token reads from the GPU and from system RAM,
against each side's memory bandwidth. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from .estimate import Machine, RunEstimate

__all__ = ["DecodeSpeed", "decode_speed"]


@dataclass(frozen=True)
class DecodeSpeed:
    """Bytes read per generated token on each side, the bandwidths they are read at (bytes/s;
    the host's is an assumption), and tokens/s if every layer were on the GPU."""

    gpu_read_bytes_per_token: int
    host_read_bytes_per_token: int
    gpu_bandwidth_bytes_per_s: int | None
    host_bandwidth_bytes_per_s: int
    host_bandwidth_assumed: bool
    all_on_gpu_tokens_per_s: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_read_bytes_per_token": self.gpu_read_bytes_per_token,
            "host_read_bytes_per_token": self.host_read_bytes_per_token,
            "gpu_bandwidth_bytes_per_s": self.gpu_bandwidth_bytes_per_s,
            "host_bandwidth_bytes_per_s": self.host_bandwidth_bytes_per_s,
            "host_bandwidth_assumed": self.host_bandwidth_assumed,
            "all_on_gpu_tokens_per_s": self.all_on_gpu_tokens_per_s,
        }


def decode_speed(estimate: RunEstimate, machine: Machine) -> DecodeSpeed:
    """Decode speed by memory bandwidth, the GPU part and the part spilled to RAM apart."""
    gpu_read, host_read = estimate.gpu_read_bytes_per_token, estimate.host_read_bytes_per_token
    all_on_gpu = None
    if machine.gpu_bandwidth and machine.gpu_name is not None:
        all_on_gpu = round(machine.gpu_bandwidth / max(gpu_read + host_read, 1), 1)
    return DecodeSpeed(gpu_read, host_read, machine.gpu_bandwidth, machine.host_bandwidth, True, all_on_gpu)

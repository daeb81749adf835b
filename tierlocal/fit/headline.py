"""The speed a plan is judged by: the best figure there is, with its basis, and the
memory-bandwidth bound beside it as a ceiling. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .estimate import RunEstimate
from .speed import DecodeSpeed

__all__ = ["HeadlineSpeed", "headline_speed"]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass(frozen=True)
class HeadlineSpeed:
    """Decode and prefill tokens/s from the best basis there is — ``measured`` by `tierlocal
    bench`, else the estimate from the devices' figures (``calibrated``, ``published``,
    ``derived``; see :data:`tierlocal.fit.speed.BASES`), else the memory-bandwidth ``bound``
    (``unknown``: no figure) — and the bound beside it (a ceiling, tokens/s)."""

    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    basis: str
    bound_decode_tokens_per_s: float | None

    def to_json(self) -> dict[str, object]:
        """``check --json``'s headline fields."""
        return {
            "est_decode_tokens_per_s": _rounded(self.decode_tokens_per_s),
            "est_prefill_tokens_per_s": _rounded(self.prefill_tokens_per_s),
            "speed_basis": self.basis,
            "bound_decode_tokens_per_s": _rounded(self.bound_decode_tokens_per_s),
        }


def headline_speed(estimate: RunEstimate | None, speed: DecodeSpeed | None, measured: Mapping[str, object] | None) -> HeadlineSpeed:
    """The headline of a plan: ``measured`` is what `tierlocal bench` recorded for this file,
    engine build and device (``decode_tokens_per_s``, ``prefill_tokens_per_s``), if anything."""
    bound = estimate.est_decode_tokens_per_s if estimate else None
    decode, prefill = (measured or {}).get("decode_tokens_per_s"), (measured or {}).get("prefill_tokens_per_s")
    if isinstance(decode, int | float) and decode > 0:
        return HeadlineSpeed(float(decode), float(prefill) if isinstance(prefill, int | float) else None, "measured", bound)
    fitted = speed.estimate if speed else None
    if fitted is not None and fitted.decode_tokens_per_s is not None:
        return HeadlineSpeed(fitted.decode_tokens_per_s, fitted.prefill_tokens_per_s, fitted.basis, bound)
    if bound is None and estimate is not None and estimate.host_read_bytes_per_token and speed:
        # The GPU's bandwidth is unknown (a --gpu size): the part read from RAM alone bounds it.
        bound = speed.host_bandwidth_bytes_per_s / estimate.host_read_bytes_per_token
    return HeadlineSpeed(bound, None, "bound" if bound else "unknown", bound)

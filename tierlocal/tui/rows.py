"""What the What-fits table holds and how it filters and sorts: one row per catalog entry of a
:class:`~tierlocal.plan.recommend.CatalogRecommendation`, and the per-device bars of a plan.
Pure: no terminal, no I/O (the screens in this package draw what these return)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..fit.estimate import DeviceUsage
from ..plan.candidates import Candidate, CatalogRecommendation

__all__ = ["FitsRow", "SORTS", "FIT_FILTERS", "rows_of", "visible_rows", "BarPart", "device_bar", "next_quant"]

#: The sort keys, in the order the sort key cycles through them.
SORTS = ("rank", "score", "speed", "size", "context", "licence", "status")
#: The fit filters, in the order the filter key cycles through them: which statuses each keeps.
FIT_FILTERS: dict[str, frozenset[str]] = {
    "all": frozenset(),
    "fits": frozenset({"best", "fits"}),
    "tight": frozenset({"tight"}),
    "no room": frozenset({"no room"}),
}


@dataclass(frozen=True)
class FitsRow:
    """One catalog entry as the table shows it. ``rank``: its place in the recommendation
    (0 = best); sizes in bytes, speed in tokens/s, context in tokens."""

    key: str
    rank: int
    model: str
    quant: str
    status: str
    score: float | None
    decode_tokens_per_s: float | None
    speed_basis: str
    file_bytes: int
    context_tokens: int
    licence: str
    reason: str
    candidate: Candidate

    @property
    def fits(self) -> bool:
        """It runs on the machine (fully or partly in RAM), whatever its rank."""
        return self.status in ("best", "fits", "tight", "too slow")

    def matches(self, text: str) -> bool:
        """Every word of ``text`` is in the model name, quantisation, licence or status."""
        haystack = f"{self.model} {self.quant} {self.licence} {self.status} {self.candidate.entry.series}".lower()
        return all(word in haystack for word in text.lower().split())


def rows_of(recommendation: CatalogRecommendation) -> list[FitsRow]:
    """Every candidate of ``recommendation`` as a row, in its ranking order."""
    rows = []
    for rank, candidate in enumerate(recommendation.candidates):
        entry = candidate.entry
        file_bytes = candidate.plan.file_bytes if candidate.plan else entry.file_bytes
        rows.append(
            FitsRow(
                key=candidate.key,
                rank=rank,
                model=entry.family,
                quant=entry.quant,
                status=candidate.status,
                score=candidate.quality.score if candidate.quality else None,
                decode_tokens_per_s=candidate.decode_tokens_per_s,
                speed_basis=candidate.speed_basis,
                file_bytes=file_bytes,
                context_tokens=entry.context_length,
                licence=entry.licence or "",
                reason=candidate.reason,
                candidate=candidate,
            )
        )
    return rows


def _sort_key(sort: str, row: FitsRow) -> tuple[object, ...]:
    """Best first for every key: the highest score, speed, size and context; licence and
    status alphabetically; ties in the recommendation's order."""
    if sort == "score":
        return (row.score is None, -(row.score or 0.0), row.rank)
    if sort == "speed":
        return (row.decode_tokens_per_s is None, -(row.decode_tokens_per_s or 0.0), row.rank)
    if sort == "size":
        return (-row.file_bytes, row.rank)
    if sort == "context":
        return (-row.context_tokens, row.rank)
    if sort == "licence":
        return (row.licence, row.rank)
    if sort == "status":
        return (not row.fits, row.status, row.rank)
    return (row.rank,)


def visible_rows(rows: Sequence[FitsRow], *, text: str = "", fit_filter: str = "all", sort: str = "rank", reverse: bool = False) -> list[FitsRow]:
    """The rows that match ``text`` and the fit filter (a :data:`FIT_FILTERS` name), sorted by
    ``sort`` (a :data:`SORTS` name; ``reverse``: worst first)."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}: one of {', '.join(SORTS)}")
    keep = FIT_FILTERS[fit_filter]
    shown = [row for row in rows if (not keep or row.status in keep) and row.matches(text)]
    return sorted(shown, key=lambda row: _sort_key(sort, row), reverse=reverse)


def next_quant(rows: Sequence[FitsRow], current: FitsRow) -> FitsRow:
    """The same model's next quantisation after ``current`` among ``rows`` (by bits per weight,
    wrapping around); ``current`` itself when the model has one."""
    same = sorted(
        (row for row in rows if row.model == current.model and row.candidate.mode == current.candidate.mode),
        key=lambda row: (row.candidate.bits_per_weight, row.quant),
    )
    index = next(i for i, row in enumerate(same) if row.key == current.key)
    return same[(index + 1) % len(same)]


@dataclass(frozen=True)
class BarPart:
    """One segment of a device's bar: what it holds, its size (bytes) and its width (cells)."""

    label: str
    size_bytes: int
    cells: int


def device_bar(device: DeviceUsage, width: int) -> list[BarPart]:
    """The device's memory as ``width`` cells: weights, KV cache, compute (compute, output and
    overhead buffers, and a projector's weights), then what stays free; the bar spans the
    device's free memory, or what is needed when that is more (it does not fit). A part that
    is not empty gets at least one cell."""
    compute = device.compute_bytes + device.output_bytes + device.overhead_bytes + device.projector_bytes
    used = (("weights", device.weights_bytes), ("KV", device.kv_bytes), ("compute", compute))
    needed = sum(size for _, size in used)
    span = max(device.free_bytes, needed, 1)
    parts = [*used, ("free", max(device.free_bytes - needed, 0))]
    cells = [round(size / span * width) if size else 0 for _, size in parts]
    cells = [max(count, 1) if size else 0 for count, (_, size) in zip(cells, parts, strict=True)]
    while sum(cells) > width and max(cells) > 1:  # rounding up the small parts: take from the largest
        cells[cells.index(max(cells))] -= 1
    return [BarPart(label, size, count) for (label, size), count in zip(parts, cells, strict=True)]

"""Charts drawn server-side as SVG, for the pages an operator opens in a browser: no JavaScript,
no font or stylesheet fetched from anywhere, every label escaped. Pure.

Each mark carries the value it draws in a ``data-value`` (bars) or ``data-x``/``data-y``
(points) attribute beside its geometry, so what a chart shows can be read back and checked —
by a test, or by a screen reader's user.

- :func:`memory_bars`: per device, the planned memory as a stacked bar (weights, KV cache,
  compute, output, overhead, then what stays free) and, beneath it, what the load reported.
- :func:`break_even_chart`: monthly cost against monthly tokens — the hosted API's line, the
  smallest cluster's flat line, where they cross, and today's measured volume on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

__all__ = ["DeviceBar", "memory_bars", "break_even_chart", "PARTS", "WIDTH"]

#: The parts of a device's memory, in the order the bars stack them, with their fill colours.
PARTS = (("weights", "#4e79a7"), ("kv", "#f28e2b"), ("compute", "#59a14f"), ("output", "#b07aa1"), ("overhead", "#9c755f"))
_FREE = "#e5e5e5"
#: Width of a chart in SVG user units; bars take the part right of the labels.
WIDTH = 640
_LABEL = 170
_BAR_HEIGHT = 18
_ROW = 2 * _BAR_HEIGHT + 22


@dataclass(frozen=True)
class DeviceBar:
    """One device: its size and, by part name (PARTS), the bytes planned and — when a load
    reported them — the bytes it allocated."""

    name: str
    total_bytes: int
    planned: dict[str, int]
    actual: dict[str, int] | None = None


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-family="sans-serif">{escape(text)}</text>'


def _stack(parts: dict[str, int], total: int, y: float, kind: str) -> list[str]:
    """A stacked bar of ``parts`` scaled to ``total`` bytes, with the free remainder last."""
    scale = (WIDTH - _LABEL) / max(total, 1)
    marks, x = [], float(_LABEL)
    for name, colour in PARTS:
        value = max(int(parts.get(name, 0)), 0)
        width = value * scale
        marks.append(
            f'<rect class="{kind}" data-part="{name}" data-value="{value}" x="{x:.3f}" y="{y:.1f}" width="{width:.3f}" height="{_BAR_HEIGHT}" '
            f'fill="{colour}"/>'
        )
        x += width
    free = max(total - sum(max(int(parts.get(name, 0)), 0) for name, _ in PARTS), 0)
    marks.append(
        f'<rect class="{kind}" data-part="free" data-value="{free}" x="{x:.3f}" y="{y:.1f}" width="{free * scale:.3f}" height="{_BAR_HEIGHT}" '
        f'fill="{_FREE}"/>'
    )
    return marks


def memory_bars(devices: Sequence[DeviceBar], *, title: str = "Memory per device") -> str:
    """An SVG of every device's planned (and reported) memory, scaled to the device's size."""
    height = 30 + _ROW * len(devices) + 20
    body = [_text(4, 18, title, size=14)]
    for index, device in enumerate(devices):
        top = 30 + index * _ROW
        body.append(f'<g class="device" data-name={quoteattr(device.name)} data-total="{device.total_bytes}">')
        body.append(_text(4, top + 13, device.name))
        body.append(_text(4, top + _BAR_HEIGHT + 13, "planned / loaded", size=10))
        body += _stack(device.planned, device.total_bytes, top, "planned")
        if device.actual is not None:
            body += _stack(device.actual, device.total_bytes, top + _BAR_HEIGHT + 2, "actual")
        body.append("</g>")
    legend_x = float(_LABEL)
    for name, colour in (*PARTS, ("free", _FREE)):
        body.append(f'<rect x="{legend_x:.1f}" y="{height - 14}" width="10" height="10" fill="{colour}"/>')
        body.append(_text(legend_x + 13, height - 5, name, size=10))
        legend_x += 70
    return _svg(height, body, title)


def break_even_chart(
    cluster_usd_per_month: float, api_usd_per_million_tokens: float, measured_tokens_per_month: float, *, title: str = "Hosted API against renting"
) -> str:
    """Monthly cost (USD) against monthly tokens: the API's cost rises with the volume, the
    cluster's does not; they cross at the break-even volume; today's measured volume is marked
    on the API line. The x axis runs to twice the larger of the two volumes."""
    per_token = api_usd_per_million_tokens / 1e6
    break_even = cluster_usd_per_month / per_token if per_token > 0 else float("inf")
    x_max = 2 * max(break_even if break_even != float("inf") else 0.0, measured_tokens_per_month, 1.0)
    y_max = max(cluster_usd_per_month, per_token * x_max) * 1.05
    left, right, top, bottom, height = 60.0, WIDTH - 20.0, 30.0, 230.0, 260

    def px(tokens: float) -> float:
        return left + (right - left) * tokens / x_max

    def py(usd: float) -> float:
        return bottom - (bottom - top) * usd / y_max

    body = [
        _text(4, 18, title, size=14),
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>',
        _text(right, bottom + 18, f"{_tokens(x_max)} tokens/month", anchor="end", size=10),
        _text(left - 4, top + 4, f"${y_max:,.0f}", anchor="end", size=10),
        f'<line class="api" data-usd-per-million="{api_usd_per_million_tokens}" x1="{px(0):.3f}" y1="{py(0):.3f}" '
        f'x2="{px(x_max):.3f}" y2="{py(per_token * x_max):.3f}" stroke="#e15759" stroke-width="2"/>',
        f'<line class="cluster" data-usd-per-month="{cluster_usd_per_month}" x1="{px(0):.3f}" y1="{py(cluster_usd_per_month):.3f}" '
        f'x2="{px(x_max):.3f}" y2="{py(cluster_usd_per_month):.3f}" stroke="#4e79a7" stroke-width="2"/>',
        _text(right, py(per_token * x_max) - 6, "hosted API", anchor="end", size=10),
        _text(right, py(cluster_usd_per_month) - 6, "smallest cluster", anchor="end", size=10),
    ]
    if break_even != float("inf"):
        body.append(
            f'<line class="break-even" data-x="{break_even:.0f}" x1="{px(break_even):.3f}" y1="{top}" x2="{px(break_even):.3f}" y2="{bottom}" '
            f'stroke="#999" stroke-dasharray="4 3"/>'
        )
        body.append(_text(px(break_even), top - 4, f"break-even {_tokens(break_even)}/month", anchor="middle", size=10))
    today_usd = per_token * measured_tokens_per_month
    body.append(
        f'<circle class="today" data-x="{measured_tokens_per_month:.0f}" data-y="{today_usd:.2f}" cx="{px(measured_tokens_per_month):.3f}" '
        f'cy="{py(today_usd):.3f}" r="5" fill="#222"/>'
    )
    body.append(
        _text(px(measured_tokens_per_month) + 8, py(today_usd) + 4, f"today: {_tokens(measured_tokens_per_month)}/month, ${today_usd:,.2f}", size=10)
    )
    return _svg(height, body, title)


def _tokens(value: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def _svg(height: int, body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )

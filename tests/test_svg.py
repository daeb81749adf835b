"""The dashboard's SVG charts draw the values they are given: parsed back, every bar's width
and every point's position give the figure it stands for; labels are escaped."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.engines import free_port
from tests.support.serving import serving
from tierlocal.report.plan_view import device_bars
from tierlocal.report.svg import PARTS, WIDTH, DeviceBar, break_even_chart, memory_bars

_NS = {"svg": "http://www.w3.org/2000/svg"}
_GIB = 2**30


def test_memory_bars_scale_each_part_to_the_device() -> None:
    planned = {"weights": 4 * _GIB, "kv": _GIB, "compute": _GIB // 4, "output": 0, "overhead": _GIB // 2}
    actual = {"weights": 4 * _GIB, "kv": _GIB, "compute": _GIB // 5, "output": 0, "overhead": 0}
    svg = ET.fromstring(memory_bars([DeviceBar("GPU0", 8 * _GIB, planned, actual), DeviceBar("host", 16 * _GIB, {"weights": _GIB})]))
    groups = svg.findall("svg:g", _NS)
    assert [g.get("data-name") for g in groups] == ["GPU0", "host"]
    for group, bars in ((groups[0], {"planned": planned, "actual": actual}), (groups[1], {"planned": {"weights": _GIB}})):
        total = int(group.get("data-total"))  # type: ignore[arg-type]
        for kind, parts in bars.items():
            rects = [r for r in group.findall("svg:rect", _NS) if r.get("class") == kind]
            assert [r.get("data-part") for r in rects] == [name for name, _ in PARTS] + ["free"]
            scale = (WIDTH - 170) / total
            x = 170.0
            for rect in rects:
                value = int(rect.get("data-value"))  # type: ignore[arg-type]
                part = str(rect.get("data-part"))
                expected = total - sum(parts.values()) if part == "free" else parts.get(part, 0)
                assert value == expected
                assert float(rect.get("width")) == pytest.approx(value * scale, abs=0.001)  # type: ignore[arg-type]
                assert float(rect.get("x")) == pytest.approx(x, abs=0.002)  # type: ignore[arg-type]
                x += value * scale
            assert x == pytest.approx(WIDTH, abs=0.01)  # the bar fills the device's width exactly
    assert not groups[1].findall("svg:rect[@class='actual']", _NS)


def test_break_even_chart_puts_the_crossing_and_today_where_the_arithmetic_does() -> None:
    # $7,200/month for the cluster, $2.50 per million tokens: they cross at 2.88B tokens/month.
    svg = ET.fromstring(break_even_chart(7200.0, 2.5, 1.0e9))
    api = svg.find("svg:line[@class='api']", _NS)
    cluster = svg.find("svg:line[@class='cluster']", _NS)
    crossing = svg.find("svg:line[@class='break-even']", _NS)
    today = svg.find("svg:circle[@class='today']", _NS)
    assert api is not None and cluster is not None and crossing is not None and today is not None
    assert int(crossing.get("data-x")) == 2_880_000_000  # type: ignore[arg-type]
    # The crossing's x on the cluster's (flat) line is where the API line reaches the same y.
    x1, y1, x2, y2 = (float(api.get(k)) for k in ("x1", "y1", "x2", "y2"))  # type: ignore[arg-type]
    cluster_y = float(cluster.get("y1"))  # type: ignore[arg-type]
    crossing_x = x1 + (x2 - x1) * (cluster_y - y1) / (y2 - y1)
    assert float(crossing.get("x1")) == pytest.approx(crossing_x, abs=0.01)  # type: ignore[arg-type]
    # Today's point sits on the API line, at $2,500 for 1B tokens.
    assert float(today.get("data-y")) == pytest.approx(2500.0)  # type: ignore[arg-type]
    cx, cy = float(today.get("cx")), float(today.get("cy"))  # type: ignore[arg-type]
    assert cy == pytest.approx(y1 + (y2 - y1) * (cx - x1) / (x2 - x1), abs=0.01)


def test_labels_are_escaped_not_markup() -> None:
    name = '<script>alert("x")</script> & GPU'
    text = memory_bars([DeviceBar(name, _GIB, {"weights": 1})], title="<b>title</b>")
    svg = ET.fromstring(text)
    assert "<script>" not in text and "<b>" not in text
    assert not list(svg.iter("{http://www.w3.org/2000/svg}script"))
    assert name in [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert svg.find("svg:g", _NS).get("data-name") == name  # type: ignore[union-attr]


def test_the_plan_bars_are_the_numbers_status_prints(assets: Assets, tmp_path: Path) -> None:
    """A real `tierlocal serve` of Gemma on the Vulkan device (some layers there): the bars drawn
    from `tierlocal status --json` carry exactly its planned and reported bytes."""
    port = free_port()
    with serving(assets, tmp_path, "--gpu", "1650MiB", "--ctx", "4096", "--port", str(port), vulkan=True):
        status = run_cli("status", "--port", str(port), "--json", env={"TIERLOCAL_HOME": str(tmp_path)})
    assert status.returncode == 0, status.stderr
    payload = json.loads(status.stdout)
    svg = ET.fromstring(memory_bars(device_bars(payload)))
    groups = svg.findall("svg:g", _NS)
    planned_devices = payload["plan"]["devices"]
    assert [g.get("data-name") for g in groups] == [d["name"] for d in planned_devices]
    reported = {d["name"]: d for d in payload["actual"]["devices"]}
    for group, device in zip(groups, planned_devices, strict=True):
        drawn = {r.get("data-part"): int(r.get("data-value")) for r in group.findall("svg:rect[@class='planned']", _NS)}  # type: ignore[arg-type]
        for part, _ in PARTS:
            assert drawn[part] == device[f"{part}_bytes"]
        loaded = {r.get("data-part"): int(r.get("data-value")) for r in group.findall("svg:rect[@class='actual']", _NS)}  # type: ignore[arg-type]
        source = reported["host"] if device["backend"] == "cpu" else next(d for n, d in reported.items() if n != "host")
        for part in ("weights", "kv", "compute", "output"):
            assert loaded[part] == source[f"{part}_bytes"]

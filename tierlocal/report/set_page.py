"""The dashboard's Live page part for served model sets: each member's state, planned bytes per
device, requests in flight, idle time, time to its idle unload and loads (``set-status``). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["sets_section"]

_MIB = 2**20


def sets_section(sets: Sequence[Mapping[str, Any]]) -> str:
    """One table per served model set ("" when none is served)."""
    parts = []
    for state in sets:
        devices = [str(device) for device in state.get("devices") or []]
        held = ", ".join(f"{d} {_mib(b)}" for d, b in zip(devices, state.get("resident_bytes") or [], strict=False))
        budget = ", ".join(f"{d} {_mib(b)}" for d, b in zip(devices, state.get("budget_bytes") or [], strict=False))
        head = "".join(
            f"<th>{escape(h)}</th>"
            for h in ("member", "role", "state", *(f"{d} planned" for d in devices), "in flight", "idle", "unloads in", "loads")
        )
        rows = "".join(_row(member) for member in state.get("members") or [] if isinstance(member, Mapping))
        parts.append(
            f"<h3>Model set {escape(str(state.get('url')))}: resident {escape(held)} of {escape(budget)}</h3>"
            f'<table class="set"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
        )
    return "<h2>Model sets</h2>" + "".join(parts) if parts else ""


def _row(member: Mapping[str, Any]) -> str:
    cells = [
        escape(str(member.get("name"))) + (" (pinned)" if member.get("pinned") else ""),
        escape(str(member.get("role"))),
        f'<span data-field="state">{escape(str(member.get("state")))}</span>',
        *(_mib(b) for b in member.get("planned_bytes") or []),
        escape(str(member.get("in_flight", 0))),
        _seconds(member.get("idle_s")),
        _seconds(member.get("unloads_in_s")),
        escape(str(member.get("loads", 0))),
    ]
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _mib(value: object) -> str:
    return f"{value / _MIB:,.0f} MiB" if isinstance(value, int | float) else "–"


def _seconds(value: object) -> str:
    return f"{value:g} s" if isinstance(value, int | float) else "–"

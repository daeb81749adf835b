"""The Live screen: each running ``tierlocal serve`` (plan against what loaded, slots busy and
idle, requests waiting, decode and prompt tokens/s over the last minute as sparklines), the
gateway's routes and targets (state, in flight, cooldown, which is the fallback), and spend
against budgets — refreshed every second by :class:`~tierlocal.tui.live_data.LiveFeed`, in a
worker, so a slow engine delays only its own row."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Label, Sparkline, Static

from ..gateway.config import GatewayConfig
from .live_data import LiveFeed, LiveSample

__all__ = ["LiveScreen", "engine_text", "gateway_table", "set_table", "spend_text"]

#: Seconds between refreshes.
REFRESH_S = 1.0
_MIB = 2**20


def engine_text(engine: dict[str, Any]) -> Text:
    """One serve: where, which model, the plan against what loaded per device, and now."""
    live = engine.get("live") or {}
    plan = engine.get("plan") or {}
    text = Text()
    text.append(f"{engine.get('url')}", style="bold")
    model = plan.get("model") or {}
    source = str(model.get("source", "")) if isinstance(model, dict) else ""
    text.append(f"  {engine.get('engine')} pid {engine.get('engine_pid')}  {source.rsplit('/', 1)[-1]}\n")
    delta = engine.get("delta") or {}
    for device in delta.get("devices", []) if engine.get("engine") != "ollama" else []:
        error = device.get("error")
        text.append(
            f"  {device['name']}: planned {device['planned_bytes'] / _MIB:.0f} MiB, allocated {device['actual_bytes'] / _MIB:.0f} MiB"
            + (f" ({error:+.1%})" if isinstance(error, int | float) else "")
            + "\n"
        )
    if engine.get("engine") == "ollama":
        text.append(
            f"  Ollama: {delta.get('size_vram_bytes', 0) / _MIB:.0f} MiB in VRAM, planned {delta.get('planned_gpu_bytes', 0) / _MIB:.0f} MiB\n"
        )
    held = delta.get("verified")
    text.append(
        "  plan held" if held else "  PLAN NOT HELD: " + "; ".join(str(p) for p in delta.get("problems", [])), style="green" if held else "bold red"
    )
    text.append("\n")
    if users := _users_line(plan):
        text.append(users + "\n")
    if live.get("error"):
        text.append(f"  now: {live['error']}", style="yellow")
        return text
    busy, total = live.get("slots_busy"), live.get("slots_total")
    slots = f"slots {busy} busy / {total - busy} idle" if isinstance(busy, int) and isinstance(total, int) else "slots -"
    decode, prompt = live.get("decode_tokens_per_s"), live.get("prompt_tokens_per_s")
    rates = f", decode {decode:,.1f} tok/s, prompt {prompt:,.1f} tok/s" if isinstance(decode, int | float) and isinstance(prompt, int | float) else ""
    text.append(f"  now: {slots}, {live.get('requests_deferred') or 0} waiting{rates}")
    return text


def _users_line(plan: dict[str, Any]) -> str | None:
    """The plan's users table in one line: each user's decode and the first-token wait per count."""
    rows = [row for row in plan.get("users") or [] if isinstance(row, dict) and isinstance(row.get("per_user_decode_tokens_per_s"), int | float)]
    if not rows:
        return None
    parts = []
    for row in rows:
        wait = row.get("first_token_p50_s")
        parts.append(
            f"{row.get('users')}: {row['per_user_decode_tokens_per_s']:,.1f} tok/s" + (f", {wait:,.1f} s" if isinstance(wait, int | float) else "")
        )
    return "  users at once (each user's decode, first token): " + " · ".join(parts)


def set_table(state: dict[str, Any]) -> Table:
    """A served model set: each member's state, its planned bytes per device, requests in flight,
    how long it has been idle and when its idle time unloads it, and its loads."""
    devices = [str(d) for d in state.get("devices") or []]
    held = ", ".join(f"{d} {b / _MIB:,.0f}" for d, b in zip(devices, state.get("resident_bytes") or [], strict=False))
    budget = ", ".join(f"{d} {b / _MIB:,.0f}" for d, b in zip(devices, state.get("budget_bytes") or [], strict=False))
    table = Table(box=None, pad_edge=False, title=f"model set {state.get('url')}: resident {held} of {budget} MiB", title_justify="left")
    for column in ("member", "role", "state", *(f"{d} MiB" for d in devices), "in flight", "idle", "unloads in", "loads"):
        table.add_column(column, justify="left" if column in ("member", "role", "state") else "right")
    for member in state.get("members") or []:
        current = str(member.get("state"))
        style = {"loaded": "green", "loading": "yellow", "unloading": "yellow"}.get(current, "dim")
        table.add_row(
            Text(str(member.get("name")) + (" (pinned)" if member.get("pinned") else "")),
            Text(str(member.get("role"))),
            Text(current, style=style),
            *(f"{b / _MIB:,.0f}" for b in member.get("planned_bytes") or []),
            str(member.get("in_flight", 0)),
            f"{member['idle_s']:g} s" if isinstance(member.get("idle_s"), int | float) else "-",
            f"{member['unloads_in_s']:g} s" if isinstance(member.get("unloads_in_s"), int | float) else "-",
            str(member.get("loads", 0)),
        )
    return table


def gateway_table(health: dict[str, Any]) -> Table:
    """The gateway's routes: each target in the order it is tried (the first is primary; the
    others are its fallbacks), its state, requests in flight, slots, cooldown left, and — where a
    route sets a speed floor — each user's decode with one more user (marked when it is passed over)."""
    table = Table(box=None, pad_edge=False, title="gateway routes (cool: seconds of cooldown left)", title_justify="left")
    routes = {route: targets for route, targets in (health.get("routes") or {}).items() if isinstance(targets, list)}
    speeds = any(isinstance(target, dict) and target.get("next_user") for targets in routes.values() for target in targets)
    for column in ("route", "role", "target", "model", "state", "busy", "slots", "cool", *(["next user"] if speeds else [])):
        table.add_column(column, justify="right" if column in ("busy", "slots", "cool", "next user") else "left")
    for route, targets in routes.items():
        for index, target in enumerate(targets):
            state = str(target.get("state", ""))
            style = {"up": "green", "cooldown": "yellow", "down": "red", "no_key": "red"}.get(state, "")
            cooldown = target.get("cooldown_s") or 0
            table.add_row(
                Text(str(route) if index == 0 else ""),
                Text("primary" if index == 0 else f"fallback {index}"),
                Text(_without_credentials(str(target.get("url", "")))),
                Text(str(target.get("model"))),
                Text(state, style=style),
                Text(str(target.get("in_flight", 0))),
                Text(str(target.get("slots") if target.get("slots") is not None else "-")),
                Text(f"{cooldown:g}" if cooldown else "-"),
                *([_next_user(target)] if speeds else []),
            )
    return table


def _next_user(target: dict[str, Any]) -> Text:
    """Each user's decode with one more user (tok/s), red with the reason when the route passes it over."""
    speed = target.get("next_user")
    if not isinstance(speed, dict) or not isinstance(speed.get("per_user_decode_tokens_per_s"), int | float):
        return Text("-")
    passed = target.get("passed_over_for")
    text = f"{speed['per_user_decode_tokens_per_s']:,.1f} tok/s" + (f" ({passed})" if passed else "")
    return Text(text, style="red" if passed else "")


def _without_credentials(url: str) -> str:
    """``url``'s host, port and path: no scheme, and no user, password or query (where a key
    could ride along)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    return netloc + (f":{parts.port}" if parts.port else "") + parts.path


def spend_text(usage: dict[str, Any]) -> RenderableType:
    """This month's requests and spend per user, and each budget's spend against it."""
    table = Table(box=None, pad_edge=False, title="spend this month", title_justify="left")
    for column in ("user", "requests", "tokens in", "tokens out", "spent", "budget"):
        table.add_column(column, justify="left" if column == "user" else "right")
    budgets = usage.get("budgets") or {}
    for name, row in (usage.get("users") or {}).items():
        budget = budgets.get(name)
        table.add_row(
            Text(str(name)),
            str(row.get("requests", 0)),
            f"{row.get('prompt_tokens', 0):,}",
            f"{row.get('completion_tokens', 0):,}",
            f"${row.get('cost_usd', 0):,.4f}",
            f"${budget['spent_usd']:,.2f} of ${budget['budget_usd']:,.2f}/{budget['budget_period']}" if budget else "-",
        )
    tiers = "; ".join(f"{row.get('name')}: {row.get('requests', 0)} requests" for row in (usage.get("by_tier") or {}).values())
    return Group(table, Text(tiers or "no request recorded this month", style="dim"))


class LiveScreen(Screen[None]):
    """What runs now: the serves, the gateway and spend, refreshed every second."""

    def __init__(self, gateway_config: GatewayConfig | None) -> None:
        super().__init__()
        self.feed = LiveFeed(gateway_config)
        self.latest: LiveSample | None = None
        self._session: aiohttp.ClientSession | None = None
        self._sampling = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="live-body"):
            yield Static("sampling…", id="live-summary")
            yield Static(id="live-sets")
            yield Vertical(id="live-engines")
            yield Static(id="live-gateway")
            yield Static(id="live-spend")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self._tick)
        self._tick()

    async def on_unmount(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _tick(self) -> None:
        if not self._sampling:  # one sample at a time: a slow one skips ticks, never piles them up
            self._sampling = True
            self._sample()

    @work(exclusive=True, group="live")
    async def _sample(self) -> None:
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(trust_env=False)
            self.latest = await self.feed.sample(self._session)
            await self._show(self.latest)
        finally:
            self._sampling = False

    async def _show(self, sample: LiveSample) -> None:
        starting = "".join(f"; starting {s.get('url')} ({s.get('phase')})" for s in sample.starting)
        count = len(sample.engines)
        self.query_one("#live-summary", Static).update(
            Text(
                f"{count} tierlocal serve{'' if count == 1 else 's'} running{starting}"
                if count or starting
                else "no tierlocal serve running" + starting
            )
        )
        self.query_one("#live-sets", Static).update(Group(*(set_table(state) for state in sample.sets)))
        box = self.query_one("#live-engines", Vertical)
        wanted = {f"engine-{index}" for index in range(count)}
        for child in list(box.children):
            if child.id not in wanted:
                await child.remove()
        for index, engine in enumerate(sample.engines):
            url = str(engine.get("url"))
            view = box.query(f"#engine-{index}")
            if not view:
                await box.mount(
                    Vertical(
                        Static(classes="engine-text"),
                        Horizontal(Label("decode tok/s "), Sparkline(classes="decode"), classes="spark"),
                        Horizontal(Label("prompt tok/s "), Sparkline(classes="prompt"), classes="spark"),
                        id=f"engine-{index}",
                        classes="engine",
                    )
                )
            panel = box.query_one(f"#engine-{index}", Vertical)
            panel.query_one(".engine-text", Static).update(engine_text(engine))
            panel.query_one(".decode", Sparkline).data = sample.decode_history.get(url, [])
            panel.query_one(".prompt", Sparkline).data = sample.prompt_history.get(url, [])
        gateway = self.query_one("#live-gateway", Static)
        if sample.gateway_url is None:
            gateway.update(Text("no gateway configured (tierlocal ui --gateway-config FILE)", style="dim"))
        elif sample.gateway is not None:
            gateway.update(gateway_table(sample.gateway))
        else:
            gateway.update(Text(f"gateway: {sample.gateway_error}", style="yellow"))
        spend = self.query_one("#live-spend", Static)
        if sample.usage is not None:
            spend.update(spend_text(sample.usage))
        elif sample.usage_error:
            spend.update(Text(f"usage: {sample.usage_error}", style="yellow"))

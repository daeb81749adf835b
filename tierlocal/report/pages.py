"""The dashboard's HTML: three pages (machine and plan, live, spend) drawn from the objects the
JSON commands print — ``tierlocal hw --json``, ``status --json``, ``status --live --json``, the
gateway's ``/health``, ``tierlocal usage --json`` — with no second computation. Pure.

Every value that came from outside (model names, user names, URLs, error text) goes through
:func:`html.escape`; the charts are :mod:`.svg`'s. No inline script or style: the page's one
script and stylesheet are the constants below, served from the dashboard's own origin under a
Content-Security-Policy that allows nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ..units import format_usd
from .plan_view import USERS_COLUMNS, device_bars, users_rows
from .svg import break_even_chart, memory_bars

__all__ = ["ICON", "PAGES", "page", "login_page", "machine_section", "live_section", "spend_section", "SCRIPT", "STYLESHEET"]

#: Page name → its title, in the order the navigation lists them.
PAGES = {"machine": "Machine and plan", "live": "Live", "spend": "Spend"}

_MIB = 2**20
_GIB = 2**30


def _text(value: object) -> str:
    return escape(str(value), quote=True)


def _size(value: object) -> str:
    if not isinstance(value, int | float):
        return "–"
    return f"{value / _GIB:.2f} GiB" if abs(value) >= _GIB else f"{value / _MIB:.1f} MiB"


def _number(value: object, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "–"


#: The Live page's columns for the gateway's targets.
_TARGET_COLUMNS = ("route", "target", "upstream model", "state", "in flight", "slots", "cooldown s", "next user tok/s")


def _next_user(target: Mapping[str, Any]) -> str:
    """Each user's decode with one more user on a local target, and the reason when the route's
    floor passes the target over at that load (``/health``'s ``next_user``, ``passed_over_for``)."""
    speed = target.get("next_user")
    if not isinstance(speed, Mapping):
        return "–"
    passed = target.get("passed_over_for")
    return _number(speed.get("per_user_decode_tokens_per_s")) + (f' <span class="state down">{_text(passed)}</span>' if passed else "")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, css: str = "") -> str:
    """A table from already escaped cells."""
    head = "".join(f"<th>{_text(header)}</th>" for header in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(name: str, body: str, *, user: str, csrf: str, data_url: str, updated: str) -> str:
    """A whole page: navigation, who is logged in, a logout form (POST with the CSRF token),
    ``body`` (a section, already escaped) inside ``<main>``, which the script refreshes from
    ``data_url`` (JSON: ``{"html": …}``) every few seconds."""
    nav = "".join(f'<a href="/ui/{key}"{" aria-current=page" if key == name else ""}>{_text(title)}</a>' for key, title in PAGES.items())
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
        f"<title>tierlocal · {_text(PAGES[name])}</title>"
        '<link rel="stylesheet" href="/ui/static/ui.css"><link rel="icon" href="/ui/static/icon.svg"></head><body>'
        f'<header><strong>tierlocal</strong><nav>{nav}</nav><span class="who">signed in as <b id="user">{_text(user)}</b></span>'
        f'<form method="post" action="/ui/logout"><input type="hidden" name="csrf" value="{_text(csrf)}"><button type="submit">Sign '
        "out</button></form>"
        "</header>"
        f'<main id="content" data-refresh="{_text(data_url)}">{body}</main>'
        f'<footer>updated <span id="updated">{_text(updated)}</span> · refreshed every 5 s with JavaScript, or reload</footer>'
        '<script src="/ui/static/ui.js"></script></body></html>'
    )


def login_page(*, csrf: str, error: str | None = None) -> str:
    """The sign-in form: a gateway key (posted, never in the URL) and the CSRF token."""
    problem = f'<p class="error" role="alert">{_text(error)}</p>' if error else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tierlocal · sign in</title>'
        '<link rel="stylesheet" href="/ui/static/ui.css"><link rel="icon" href="/ui/static/icon.svg"></head><body class="login">'
        "<main><h1>tierlocal</h1>"
        f"{problem}"
        '<form method="post" action="/ui/login">'
        f'<input type="hidden" name="csrf" value="{_text(csrf)}">'
        '<label for="key">Gateway key</label>'
        '<input id="key" name="key" type="password" autocomplete="current-password" required>'
        '<button type="submit">Sign in</button></form>'
        "<p>A key from <code>tierlocal gateway keys add NAME</code>, or the one the gateway wrote to "
        "<code>STATE_DIR/local.key</code>.</p></main></body></html>"
    )


# --- machine and plan ----------------------------------------------------------------------


def machine_section(hardware: Mapping[str, Any], servers: Sequence[Mapping[str, Any]]) -> str:
    """Detected devices (``hw --json``), then per running ``tierlocal serve`` (``status --json``)
    its memory bars per device, planned beside reported, and the delta."""
    gpus = hardware.get("gpus") or []
    rows = [[_text(gpu.get("name")), _text(gpu.get("backend")), _size(gpu.get("total_bytes")), _size(gpu.get("free_bytes"))] for gpu in gpus]
    rows.append(["host RAM", "cpu", _size(hardware.get("ram_total_bytes")), _size(hardware.get("ram_available_bytes"))])
    parts = [
        "<h1>Machine and plan</h1>",
        f"<p>{_text(hardware.get('cpu_cores'))} cores, {_text(hardware.get('cpu_arch') or '')}</p>",
        _table(["device", "backend", "total", "free"], rows, css="devices"),
    ]
    if not servers:
        parts.append("<p>No <code>tierlocal serve</code> is running.</p>")
    for server in servers:
        parts.append(_server_plan(server))
    return "".join(parts)


def _server_plan(server: Mapping[str, Any]) -> str:
    plan, actual, delta = server.get("plan") or {}, server.get("actual") or {}, server.get("delta") or {}
    model = plan.get("model") or {}
    name = str(model.get("source", "?")).rsplit("/", 1)[-1]
    verdict = "plan held" if delta.get("verified") else "plan not held: " + "; ".join(str(problem) for problem in delta.get("problems", []))
    rows = []
    for device in delta.get("devices", []):
        error = device.get("error")
        rows.append(
            [
                _text(device.get("name")),
                f'<span data-field="planned_bytes">{_size(device.get("planned_bytes"))}</span>',
                f'<span data-field="actual_bytes">{_size(device.get("actual_bytes"))}</span>',
                "–" if not isinstance(error, int | float) else f"{error:+.1%}",
            ]
        )
    return (
        f'<section class="server" data-url="{_text(server.get("url"))}">'
        f"<h2>{_text(name)} <small>{_text(server.get('engine'))} on {_text(server.get('url'))}</small></h2>"
        f'<p class="{"ok" if delta.get("verified") else "bad"}">{_text(verdict)}</p>'
        f"<p>layers on the GPU: <b data-field=layers>{_text(actual.get('layers_offloaded'))}/{_text(actual.get('layers_total') or '–')}</b>"
        f" · context <b data-field=n_ctx>{_text(actual.get('n_ctx'))}</b> = {_text(actual.get('parallel'))} slot(s) ×"
        f" <b data-field=n_ctx_per_slot>{_text(actual.get('n_ctx_per_slot'))}</b></p>"
        + memory_bars(device_bars(server), title="Memory per device: planned (top) and loaded (bottom)")
        + _table(["device", "planned", "loaded", "delta"], rows, css="delta")
        + (f"<h3>Users at once</h3>{_table(USERS_COLUMNS, users, css='users')}" if (users := users_rows(plan)) else "")
        + "</section>"
    )


# --- live ----------------------------------------------------------------------------------


def live_section(
    engines: Sequence[Mapping[str, Any]], routes: Mapping[str, Sequence[Mapping[str, Any]]] | None, fallbacks: Mapping[str, float]
) -> str:
    """Per engine (``status --live --json``): slots busy/idle, requests waiting, tokens/s over
    the window; per gateway route and target (``/health``): state, in flight, cooldown; the
    fallbacks taken (``/metrics``). ``routes`` None: no gateway serves this page."""
    parts = ["<h1>Live</h1><h2>Engines</h2>"]
    rows = []
    for engine in engines:
        if engine.get("engine") == "ollama":
            loaded = ", ".join(f"{model.get('name')} ({_size(model.get('size_vram_bytes'))} on GPU)" for model in engine.get("models", []))
            rows.append([_text(engine.get("url")), "ollama", _text(loaded or "no model loaded"), "–", "–", "–", _text(engine.get("error") or "")])
            continue
        busy, total = engine.get("slots_busy"), engine.get("slots_total")
        slots = (
            "–"
            if total is None
            else f'<span data-field="slots_busy">{_text(busy)}</span> busy / <span data-field="slots_total">{_text(total)}</span>'
        )
        rows.append(
            [
                _text(engine.get("url")),
                _text(engine.get("engine")),
                slots,
                f'<span data-field="requests_deferred">{_number(engine.get("requests_deferred"), 0)}</span>',
                f'<span data-field="decode_tokens_per_s">{_number(engine.get("decode_tokens_per_s"))}</span>',
                f'<span data-field="prompt_tokens_per_s">{_number(engine.get("prompt_tokens_per_s"))}</span>',
                _text(engine.get("error") or (f"over {engine.get('window_s'):g} s" if engine.get("window_s") else "first sample")),
            ]
        )
    parts.append(
        _table(["engine", "kind", "slots", "waiting", "decode tok/s", "prompt tok/s", "note"], rows, css="engines")
        if rows
        else "<p>No <code>tierlocal serve</code> is running.</p>"
    )
    parts.append("<h2>Gateway targets</h2>")
    if routes is None:
        parts.append("<p>No gateway serves this page: start <code>tierlocal gateway</code> to see its targets.</p>")
    else:
        target_rows = [
            [
                _text(model),
                _text(target.get("url")),
                _text(target.get("model")),
                f'<span class="state {_text(target.get("state"))}">{_text(target.get("state"))}</span>',
                _text(target.get("in_flight")),
                _text(target.get("slots") if target.get("slots") is not None else "–"),
                _number(target.get("cooldown_s")),
                _next_user(target),
            ]
            for model, targets in routes.items()
            for target in targets
        ]
        parts.append(_table(_TARGET_COLUMNS, target_rows, css="targets"))
        fallback_rows = [[_text(label), _number(count, 0)] for label, count in sorted(fallbacks.items())]
        parts.append("<h2>Fallbacks taken</h2>")
        parts.append(
            _table(["route · reason", "count"], fallback_rows, css="fallbacks") if fallback_rows else "<p>None since the gateway started.</p>"
        )
    return "".join(parts)


# --- spend ---------------------------------------------------------------------------------


def spend_section(report: Mapping[str, Any], *, user: str, everyone: bool) -> str:
    """Per user, spend this period against the budget; requests and tokens by model and for
    local and hosted targets; the break-even chart per hosted frontier model (``usage --json``).
    ``everyone`` False: ``report`` holds the signed-in user's rows only, and the page says so."""
    parts = [f"<h1>Spend <small>this {_text(report.get('period'))}</small></h1>"]
    if not everyone:
        parts.append(f"<p>Showing {_text(user)}'s own use; an admin key sees every user.</p>")
    rows = _user_rows(report)
    parts.append(
        "<h2>Users</h2>"
        + (
            _table(["user", "requests", "prompt tokens", "completion tokens", "spend", "budget"], rows, css="users")
            if rows
            else "<p>No requests yet.</p>"
        )
    )
    if everyone:
        model_rows = [
            [
                f'<span data-field="model">{_text(name)}</span>',
                _text(row.get("requests")),
                _number(row.get("prompt_tokens"), 0),
                _number(row.get("completion_tokens"), 0),
                f"${_number(row.get('cost_usd'), 4)}",
            ]
            for name, row in (report.get("models") or {}).items()
        ]
        parts.append(
            "<h2>Models</h2>"
            + (
                _table(["model", "requests", "prompt tokens", "completion tokens", "spend"], model_rows, css="models")
                if model_rows
                else "<p>No requests yet.</p>"
            )
        )
        tier_rows = [
            [
                _text(f"{tier} · {row.get('name')}" if tier != "none" else row.get("name")),
                _text(row.get("requests")),
                _number(row.get("prompt_tokens", 0) + row.get("completion_tokens", 0), 0),
                f"${_number(row.get('cost_usd'), 4)}",
            ]
            for tier, row in (report.get("by_tier") or {}).items()
        ]
        if tier_rows:
            parts.append("<h2>By tier</h2>" + _table(["tier", "requests", "tokens", "spend"], tier_rows, css="tiers"))
        for label, cluster in (report.get("clusters") or {}).items():
            parts.append(_cluster(label, cluster))
        if local_rows := [_local_row(label, local) for label, local in (report.get("local") or {}).items()]:
            parts.append(
                "<h2>Local engines at the API price</h2>" + _table(["engine", "routes", "requests", "tokens", "at the API"], local_rows, css="local")
            )
        for model, verdict in (report.get("break_even") or {}).items():
            parts.append(_break_even(model, verdict))
    return "".join(parts)


def _user_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """A row per user with requests this period, then per budgeted user without any."""
    budgets = report.get("budgets") or {}
    rows = []
    for name, row in (report.get("users") or {}).items():
        budget = budgets.get(name)
        budget_cell = "none" if budget is None else _budget_bar(budget)
        rows.append(
            [
                f'<span data-field="user">{_text(name)}</span>',
                f'<span data-field="requests">{_text(row.get("requests"))}</span>',
                _number(row.get("prompt_tokens"), 0),
                _number(row.get("completion_tokens"), 0),
                f'<span data-field="cost_usd">${_number(row.get("cost_usd"), 4)}</span>',
                budget_cell,
            ]
        )
    for name, budget in budgets.items():  # budgeted users with no request this period
        if name not in (report.get("users") or {}):
            rows.append([f'<span data-field="user">{_text(name)}</span>', "0", "0", "0", "$0.0000", _budget_bar(budget)])
    return rows


def _budget_bar(budget: Mapping[str, Any]) -> str:
    limit, spent = float(budget.get("budget_usd") or 0), float(budget.get("spent_usd") or 0)
    share = min(spent / limit, 1.0) if limit > 0 else 1.0
    return (
        f'<span class="budget" data-spent="{spent}" data-budget="{limit}">'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="10" viewBox="0 0 120 10" role="img"><title>{share:.0%} of the budget</title>'
        f'<rect width="120" height="10" fill="#e5e5e5"/><rect class="spent" data-value="{spent}" width="{120 * share:.2f}" height="10" '
        f'fill="{"#e15759" if share >= 0.9 else "#4e79a7"}"/></svg>'
        f" {format_usd(spent)} of {format_usd(limit)} this {_text(budget.get('budget_period'))}</span>"
    )


def _cluster(label: str, cluster: Mapping[str, Any]) -> str:
    """A cluster of your own (tier 1): its cost over the period against the API price of its tokens."""
    api = cluster.get("api_usd")
    verdict = "no API price for this route to compare with"
    if api is not None:
        cheaper = "the cluster" if cluster.get("cheaper") == "cluster" else "the API"
        verdict = f"the API would have cost ${float(api):,.2f}: {cheaper} was cheaper"
        if cluster.get("break_even_tokens_per_hour"):
            verdict += f" (break-even ~{float(cluster['break_even_tokens_per_hour']):,.0f} tokens/hour)"
    return (
        f'<section class="cluster" data-target="{_text(label)}"><h2>Your cluster: {_text(label)}</h2>'
        f"<p>{float(cluster.get('hours') or 0):,.1f} h at ${float(cluster.get('usd_per_hour') or 0):,.2f}/h ="
        f' <span data-field="cluster_usd">${float(cluster.get("cluster_usd") or 0):,.2f}</span>'
        f" for {float(cluster.get('tokens') or 0):,.0f} tokens; {_text(verdict)}.</p></section>"
    )


def _local_row(label: str, local: Mapping[str, Any]) -> list[str]:
    """A local engine's tokens this period and what its route's hosted API would have charged."""
    api = local.get("api_usd")
    at_api = f"no price for {_text(local.get('api_model'))}" if api is None else f'<span data-field="api_usd">${float(api):,.4f}</span>'
    tokens = float(local.get("prompt_tokens") or 0) + float(local.get("completion_tokens") or 0)
    return [_text(label), _text(", ".join(local.get("routes") or [])), _text(local.get("requests")), _number(tokens, 0), at_api]


def _break_even(model: str, verdict: Mapping[str, Any]) -> str:
    tokens = float(verdict.get("tokens_per_month") or 0)
    api = float(verdict.get("api_usd_per_month") or 0)
    per_million = api / tokens * 1e6 if tokens else 0.0
    chart = break_even_chart(float(verdict.get("rent_usd_per_month") or 0), per_million, tokens, title=f"{model}: hosted API against renting")
    cheaper = "the API" if verdict.get("cheaper") == "api" else "renting"
    return (
        f'<section class="break-even" data-model="{_text(model)}"><h2>{_text(model)}: break-even</h2>{chart}'
        f"<p>At the measured volume (~{tokens:,.0f} tokens/month) the API costs ${api:,.2f}/month; renting {_text(verdict.get('rent'))}"
        f" costs ${float(verdict.get('rent_usd_per_month') or 0):,.0f}/month: {cheaper} is cheaper"
        f" (break-even ~{float(verdict.get('break_even_tokens_per_month') or 0):,.0f} tokens/month).</p></section>"
    )


#: The page's one script: refresh ``<main>`` from its data URL every 5 s (the server renders
#: the HTML; this only swaps it in). Without JavaScript the page is the same, just static.
SCRIPT = """(function () {
  var main = document.getElementById("content");
  if (!main || !main.dataset.refresh || !window.fetch) return;
  function refresh() {
    fetch(main.dataset.refresh, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) { if (!response.ok) throw new Error(String(response.status)); return response.json(); })
      .then(function (data) {
        var parsed = new DOMParser().parseFromString(data.html, "text/html");
        main.replaceChildren.apply(main, Array.prototype.slice.call(parsed.body.childNodes));
        document.getElementById("updated").textContent = data.updated;
        main.dataset.refreshed = String((Number(main.dataset.refreshed) || 0) + 1);
      })
      .catch(function (error) { document.getElementById("updated").textContent += " (refresh failed: " + error.message + ")"; });
  }
  setInterval(refresh, 5000);
})();
"""

STYLESHEET = """body { font-family: sans-serif; margin: 0; color: #222; }
header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1em; background: #f3f3f3; border-bottom: 1px solid #ddd; }
header nav a { margin-right: 1em; } header nav a[aria-current] { font-weight: bold; text-decoration: none; color: #222; }
header .who { margin-left: auto; } header form { margin: 0; }
main { padding: 0 1em 1em; max-width: 1000px; } footer { padding: .5em 1em; color: #666; font-size: small; }
table { border-collapse: collapse; margin: .5em 0 1em; } th, td { border-bottom: 1px solid #ddd; padding: .25em .7em; text-align: left; }
.ok { color: #2a7a2a; } .bad { color: #b22; } .error { color: #b22; }
.state.up { color: #2a7a2a; } .state.down, .state.cooldown, .state.no_key { color: #b22; }
body.login main { max-width: 24em; margin: 4em auto; } body.login input[type=password] { width: 100%; margin: .3em 0 .8em; }
small { color: #666; font-weight: normal; }
"""

#: The tab's icon: three memory bars.
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect x="1" y="2" width="14" height="3" fill="#4e79a7"/>'
    '<rect x="1" y="7" width="9" height="3" fill="#f28e2b"/><rect x="1" y="12" width="5" height="3" fill="#59a14f"/></svg>'
)

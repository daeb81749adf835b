"""The dashboard's HTTP contract on a real gateway process and a real `tierlocal dashboard`
process (no engine needed): sign-in, cookies, CSRF, CSP, escaping, secrets, who sees what, and
the spend page's numbers against `tierlocal usage --json`. The browser tests with a real
llama-server are in test_ui_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import free_port, started
from tests.support.gatewayrun import RunningGateway, add_key, gateway
from tierlocal.gateway.store import SqliteStore, UsageRecord

HOSTED_SECRET = "sk-hosted-secret-0123456789abcdef"
STORED_BODY = "STORED-BODY-must-never-be-shown"
EVIL_USER = '<script>alert("user")</script>'
EVIL_MODEL = "<script>alert('model')</script>"

CONFIG = f"""
[[routes]]
model = "kimi-k3"
targets = [ {{ url = "http://127.0.0.1:9/v1", model = "kimi-k3", api_key_env = "UI_TEST_HOSTED_KEY" }} ]

[[routes]]
model = "{EVIL_MODEL}"
targets = [ {{ url = "http://127.0.0.1:9/v1", model = "local-model" }} ]
store_bodies = true

[[users]]
name = "alice"
admin = true
budget_usd = 5.0

[[users]]
name = "bob"
budget_usd = 2.0
budget_period = "day"

[[users]]
name = '{EVIL_USER}'
"""


def _seed(state_dir: Path) -> None:
    """Usage rows the pages must show: bob on the hosted frontier model (the break-even), and a
    user and a model whose names are script tags, with a stored body."""
    store = SqliteStore(state_dir)
    try:
        store.settle(
            None, UsageRecord("bob", "kimi-k3", "kimi-k3", "http://127.0.0.1:9/v1#kimi-k3", 200, 1_000_000, 400_000, 100_000, 3.42, 900.0, tier=3)
        )
        store.settle(
            None,
            UsageRecord(
                EVIL_USER,
                EVIL_MODEL,
                EVIL_MODEL,
                "http://127.0.0.1:9/v1#local-model",
                200,
                50,
                0,
                20,
                0.0,
                10.0,
                None,
                "chatcmpl-x",
                STORED_BODY,
                STORED_BODY,
                tier=2,
            ),
        )
    finally:
        store.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningGateway]:
    _seed(tmp_path / "state")
    with gateway(tmp_path, CONFIG, env={"UI_TEST_HOSTED_KEY": HOSTED_SECRET}) as running:
        yield running


def _base(running: RunningGateway) -> str:
    return running.url.removesuffix("/v1")


def _csrf(client: httpx.Client) -> str:
    form = client.get("/ui/login")
    assert form.status_code == 200
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert match is not None and client.cookies.get("tierlocal_csrf") == match.group(1)
    return match.group(1)


@contextmanager
def _signed_in(base: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, trust_env=False) as client:
        token = _csrf(client)
        answer = client.post("/ui/login", data={"csrf": token, "key": key}, headers={"Origin": base})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/machine", answer.text
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        yield client


def test_pages_refuse_a_request_without_a_live_key(running: RunningGateway) -> None:
    base = _base(running)
    with httpx.Client(base_url=base, trust_env=False) as client:
        for name in ("machine", "live", "spend"):
            page = client.get(f"/ui/{name}")
            assert page.status_code == 303 and page.headers["location"] == "/ui/login"
            data = client.get(f"/ui/data/{name}.json")
            assert data.status_code == 401 and "sign in" in data.json()["error"]["message"]
        # A key in the URL is never read; a wrong key in the cookie is no key.
        assert client.get(f"/ui/spend?key={running.key}").status_code == 303
        assert client.get("/ui/spend", headers={"Cookie": "tierlocal_key=tlk-not-a-live-key"}).status_code == 303
        # The bearer header works, as for the API.
        assert client.get("/ui/spend", headers=running.headers()).status_code == 200


def test_sign_in_needs_the_csrf_token_the_same_origin_and_a_live_key(running: RunningGateway) -> None:
    base = _base(running)
    with httpx.Client(base_url=base, trust_env=False) as client:
        token = _csrf(client)
        no_token = client.post("/ui/login", data={"key": running.key})
        assert no_token.status_code == 403 and "tierlocal_key" not in no_token.headers.get("set-cookie", "")
        wrong_token = client.post("/ui/login", data={"csrf": "x" * 43, "key": running.key})
        assert wrong_token.status_code == 403
        cross_site = client.post("/ui/login", data={"csrf": token, "key": running.key}, headers={"Origin": "http://evil.example"})
        assert cross_site.status_code == 403
        wrong_key = client.post("/ui/login", data={"csrf": token, "key": "tlk-" + "a" * 43}, headers={"Origin": base})
        assert wrong_key.status_code == 401 and "not a live gateway key" in wrong_key.text
        assert client.get("/ui/machine").status_code == 303  # still signed out
    with _signed_in(base, running.key) as client:
        assert client.get("/ui/machine").status_code == 200
        assert client.get("/ui/data/spend.json").json()["page"] == "spend"
        # The cookie signs in to the pages only, never to the API.
        api = httpx.get(running.url + "/models", cookies={"tierlocal_key": running.key}, trust_env=False)
        assert api.status_code == 401
        # Signing out is a POST with the token: a GET changes nothing.
        assert client.get("/ui/logout").status_code == 405
        assert client.get("/ui/machine").status_code == 200
        token = client.cookies["tierlocal_csrf"]
        assert client.post("/ui/logout", data={"csrf": token}, headers={"Origin": base}).status_code == 303
        assert client.get("/ui/machine").status_code == 303


def test_every_ui_answer_carries_a_strict_content_security_policy(running: RunningGateway) -> None:
    base = _base(running)
    with _signed_in(base, running.key) as client:
        for path in ("/ui/login", "/ui/machine", "/ui/live", "/ui/spend", "/ui/data/live.json", "/ui/static/ui.js", "/ui/static/ui.css"):
            answer = client.get(path)
            assert answer.status_code == 200, path
            policy = answer.headers["content-security-policy"]
            assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
            assert answer.headers["x-content-type-options"] == "nosniff" and answer.headers["cache-control"] == "no-store"
            if answer.headers["content-type"].startswith("text/html"):
                # No inline script and no inline style: the policy would block them anyway.
                assert re.findall(r"<script(?![^>]*\bsrc=)", answer.text) == [], path
                assert " style=" not in answer.text and "<style" not in answer.text, path
                assert "http://" not in re.sub(r'(href|src|data-refresh|data-url)="/', "", answer.text).replace(base, "").split("<main")[0]


def test_names_are_escaped_and_no_secret_or_stored_body_reaches_a_page(running: RunningGateway) -> None:
    base = _base(running)
    with _signed_in(base, running.key) as client:
        html, everything = "", ""
        for name in ("machine", "live", "spend"):
            page, data = client.get(f"/ui/{name}").text, client.get(f"/ui/data/{name}.json")
            html += page + data.json()["html"]
            everything += page + data.text
            assert data.headers["content-type"].startswith("application/json")  # with nosniff: never rendered as HTML
        spend = client.get("/ui/spend").text
    assert "&lt;script&gt;alert(&quot;user&quot;)&lt;/script&gt;" in spend
    assert "&lt;script&gt;alert(&#x27;model&#x27;)&lt;/script&gt;" in spend
    assert "<script>alert" not in html
    for secret in (HOSTED_SECRET, running.key, STORED_BODY):
        assert secret not in everything
    # The live page shows both routes' targets (the hosted one's key is set: not "no_key").
    live = httpx.get(base + "/ui/data/live.json", headers=running.headers(), trust_env=False).json()["data"]
    assert set(live["routes"]) == {"kimi-k3", EVIL_MODEL}


def test_the_spend_page_shows_what_usage_json_says(running: RunningGateway) -> None:
    base = _base(running)
    usage = run_cli("usage", "--config", str(running.config), "--json")
    assert usage.returncode == 0, usage.stderr
    report = json.loads(usage.stdout)
    with _signed_in(base, running.key) as client:
        data = client.get("/ui/data/spend.json").json()
        page = data["html"]  # drawn from data["data"] in the same answer
        assert client.get("/ui/spend").text.count('<section class="break-even"') == 1
    assert data["data"]["users"] == report["users"] and data["data"]["models"] == report["models"]
    assert (
        data["data"]["by_tier"]
        == report["by_tier"]
        == {
            "2": {"name": "local", "requests": 1, "prompt_tokens": 50, "cached_tokens": 0, "completion_tokens": 20, "cost_usd": 0.0},
            "3": {
                "name": "hosted API",
                "requests": 1,
                "prompt_tokens": 1_000_000,
                "cached_tokens": 400_000,
                "completion_tokens": 100_000,
                "cost_usd": 3.42,
            },
        }
    )
    assert report["budgets"]["bob"] == {"budget_usd": 2.0, "budget_period": "day", "spent_usd": 3.42, "left_usd": 0.0}
    # The budget bar draws bob's spend against his budget, full (over budget).
    bar = re.search(
        r'<span class="budget" data-spent="([0-9.]+)" data-budget="([0-9.]+)"><svg[^>]*>.*?<rect class="spent" data-value="[0-9.]+" '
        r'width="([0-9.]+)"',
        page,
    )
    assert bar is not None and (float(bar.group(1)), float(bar.group(2)), float(bar.group(3))) == (3.42, 2.0, 120.0)
    # The break-even chart: its lines and today's point are usage --json's verdict.
    verdict = data["data"]["break_even"]["kimi-k3"]
    # The same verdict as the CLI's (the volume per month moves as the clock does between the two).
    assert verdict["rent_usd_per_month"] == report["break_even"]["kimi-k3"]["rent_usd_per_month"]
    assert verdict["tokens_per_month"] == pytest.approx(report["break_even"]["kimi-k3"]["tokens_per_month"], rel=1e-3)
    svg = re.search(r'<section class="break-even" data-model="kimi-k3">.*?(<svg.*?</svg>)', page, re.S)
    assert svg is not None
    chart = ET.fromstring(svg.group(1))
    ns = {"s": "http://www.w3.org/2000/svg"}
    cluster = chart.find("s:line[@class='cluster']", ns)
    today = chart.find("s:circle[@class='today']", ns)
    crossing = chart.find("s:line[@class='break-even']", ns)
    assert cluster is not None and today is not None and crossing is not None
    assert float(cluster.get("data-usd-per-month", "")) == pytest.approx(verdict["rent_usd_per_month"])
    assert float(today.get("data-x", "")) == pytest.approx(verdict["tokens_per_month"], abs=1)
    assert float(today.get("data-y", "")) == pytest.approx(verdict["api_usd_per_month"], abs=0.01)
    # Where the API's line meets the cluster's: rent ÷ the measured blended price per token.
    assert float(crossing.get("data-x", "")) == pytest.approx(
        verdict["rent_usd_per_month"] / (verdict["api_usd_per_month"] / verdict["tokens_per_month"]), rel=1e-6
    )


def test_a_user_who_is_not_an_admin_sees_only_their_own_spend(running: RunningGateway) -> None:
    base = _base(running)
    bob = add_key(running.config, "bob")
    with _signed_in(base, bob) as client:
        data = client.get("/ui/data/spend.json").json()["data"]
        page = client.get("/ui/spend").text
    assert list(data["users"]) == ["bob"] and data["models"] == {} and data["break_even"] == {} and list(data["budgets"]) == ["bob"]
    assert "an admin key sees every user" in page and "&lt;script&gt;" not in page


@contextmanager
def _dashboard(config: Path, log: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tierlocal", "dashboard", "--config", str(config), "--port", str(port)]
    with started(argv, log, f"http://127.0.0.1:{port}/ui/login", {"PYTHONPATH": str(REPO_ROOT)}, timeout_s=60):
        yield f"http://127.0.0.1:{port}"


def test_tierlocal_dashboard_serves_the_pages_without_a_gateway(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f'[server]\nstate_dir = "{tmp_path / "state"}"\n\n[[users]]\nname = "alice"\nadmin = true\n')
    _seed(tmp_path / "state")
    key = add_key(config, "alice")
    with _dashboard(config, tmp_path / "dashboard.log") as base:
        assert httpx.get(base + "/ui/spend", trust_env=False).status_code == 303
        with _signed_in(base, key) as client:
            live = client.get("/ui/live").text
            spend = client.get("/ui/data/spend.json").json()["data"]
    assert "No gateway serves this page" in live
    assert spend["users"]["bob"]["cost_usd"] == 3.42
    # It listens on loopback only: there is no option to choose another address.
    help_text = subprocess.run(
        [sys.executable, "-m", "tierlocal", "dashboard", "--help"], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    ).stdout
    assert "--host" not in help_text and "127.0.0.1" in help_text

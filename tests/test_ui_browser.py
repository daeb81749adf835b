"""The dashboard in a real headless Chromium (Debian's), against a real gateway in front of a
real `tierlocal serve` of Gemma on the Vulkan device (Mesa's llvmpipe, flash attention off —
tests/support/serving.py) and a hosted API's stand-in (a second real llama-server that needs
its own key), with requests from the real openai client. Screenshots of each
page go to tests/artefacts/ (or $TIERLOCAL_TEST_ARTEFACTS)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import openai
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.assets import Assets
from tests.support.browser import artefacts_dir, chromium, full_page_screenshot
from tests.support.cli import run_cli
from tests.support.engines import free_port, llama_server_argv, running
from tests.support.gatewayrun import gateway
from tests.support.serving import serving

# What the machine page draws, read back from the DOM: per device group, the planned and the
# loaded bytes of each part (the SVG marks' data-value attributes).
_BARS = """return Array.from(document.querySelectorAll('section.server g.device')).map(function (group) {
  function parts(kind) {
    var out = {};
    group.querySelectorAll('rect.' + kind).forEach(function (rect) { out[rect.dataset.part] = Number(rect.dataset.value); });
    return out;
  }
  return {name: group.dataset.name, planned: parts('planned'), actual: parts('actual')};
});"""


HOSTED_KEY = "sk-hosted-" + secrets.token_hex(16)
PRICES = '[prices."kimi-k3"]\ninput_cache_hit = 0.30\ninput_cache_miss = 3.00\noutput = 15.00\n\n'

#: The page swaps #content for the refreshed one every 5 s: an element found just before can go
#: stale before its text is read; the wait tries again.
_REFRESHED = (StaleElementReferenceException,)


def _chat(base_url: str, key: str, model: str = "gemma") -> None:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
    assert answer.usage is not None and answer.usage.completion_tokens > 0


def _sign_in(browser: Any, base: str, key: str) -> None:
    browser.get(base + "/ui/login")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, 15).until(lambda driver: driver.current_url.endswith("/ui/machine"))


@pytest.mark.long
def test_a_browser_signs_in_and_sees_the_plan_live_slots_and_spend(assets: Assets, tmp_path: Path) -> None:
    port, hosted_port = free_port(), free_port()
    home = tmp_path / "home"
    shots = artefacts_dir()
    routes = (
        f'[[routes]]\nmodel = "gemma"\ntargets = [ {{ url = "http://127.0.0.1:{port}/v1", model = "gemma" }} ]\n\n'
        '[[routes]]\nmodel = "kimi-k3"\ntargets = [ '
        f'{{ url = "http://127.0.0.1:{hosted_port}/v1", model = "kimi-k3", api_key_env = "HOSTED_KEY" }} ]\n\n'
    )
    users = '[[users]]\nname = "alice"\nadmin = true\nbudget_usd = 5.0\n'
    hosted = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, hosted_port, "--api-key", HOSTED_KEY, ctx=1024, parallel=1)
    with (
        running(hosted, tmp_path / "hosted.log", f"http://127.0.0.1:{hosted_port}/health"),
        serving(assets, home, "--gpu", "1650MiB", "--ctx", "2048", "--parallel", "2", "--port", str(port), vulkan=True),
    ):
        status = run_cli("status", "--port", str(port), "--json", env={"TIERLOCAL_HOME": str(home)})
        assert status.returncode == 0, status.stderr
        payload = json.loads(status.stdout)
        (tmp_path / "gw").mkdir()
        gateway_env = {"TIERLOCAL_HOME": str(home), "HOSTED_KEY": HOSTED_KEY}
        with gateway(tmp_path / "gw", routes + PRICES + users, env=gateway_env) as gw, chromium() as browser:
            base = gw.url.removesuffix("/v1")
            # Without a key: the pages send the browser to the sign-in form, the data is refused.
            browser.get(base + "/ui/spend")
            assert browser.current_url.endswith("/ui/login")
            browser.get(base + "/ui/data/spend.json")
            assert "sign in first" in browser.find_element(By.TAG_NAME, "body").text

            _sign_in(browser, base, gw.key)
            full_page_screenshot(browser, shots / "ui-machine.png")
            drawn = browser.execute_script(_BARS)
            planned = payload["plan"]["devices"]
            assert [bar["name"] for bar in drawn] == [device["name"] for device in planned]
            reported = payload["actual"]["devices"]
            for bar, device in zip(drawn, planned, strict=True):
                loaded = next(d for d in reported if (d["name"] == "host") == (device["backend"] == "cpu"))
                for part in ("weights", "kv", "compute", "output", "overhead"):
                    assert bar["planned"][part] == device[f"{part}_bytes"], (device["name"], part)
                for part in ("weights", "kv", "compute", "output"):
                    assert bar["actual"][part] == loaded[f"{part}_bytes"], (device["name"], part)
            layers = browser.find_element(By.CSS_SELECTOR, "[data-field=layers]").text
            assert layers == f"{payload['actual']['layers_offloaded']}/{payload['actual']['layers_total']}"
            # Issue 48: the serve's users table, each user's decode as the plan gives it.
            cells = [row.find_elements(By.TAG_NAME, "td") for row in browser.find_elements(By.CSS_SELECTOR, "table.users tbody tr")]
            shown = {int(row[0].text): row[1].text for row in cells}
            assert shown == {row["users"]: f"{row['per_user_decode_tokens_per_s']:,.1f}" for row in payload["plan"]["users"]}

            # A request through the gateway appears on the spend page …
            _chat(gw.url, gw.key)
            browser.get(base + "/ui/spend")
            assert browser.find_element(By.CSS_SELECTOR, "span[data-field=user]").text == "alice"
            assert browser.find_element(By.CSS_SELECTOR, "span[data-field=requests]").text == "1"
            # … and the next one without a reload: the page's script refreshes it from spend.json.
            _chat(gw.url, gw.key)
            WebDriverWait(browser, 30, ignored_exceptions=_REFRESHED).until(
                lambda driver: driver.find_elements(By.CSS_SELECTOR, "span[data-field=requests]")[0].text == "2"
            )
            assert int(browser.find_element(By.ID, "content").get_attribute("data-refreshed")) >= 1
            # A request for the hosted frontier model: its spend and the break-even chart, drawn
            # from usage --json's verdict; the hosted key is nowhere on the page.
            _chat(gw.url, gw.key, "kimi-k3")
            WebDriverWait(browser, 30, ignored_exceptions=_REFRESHED).until(
                lambda driver: driver.find_elements(By.CSS_SELECTOR, "section.break-even[data-model=kimi-k3] circle.today")
            )
            usage = json.loads(run_cli("usage", "--config", str(gw.config), "--json").stdout)
            today = browser.find_element(By.CSS_SELECTOR, "section.break-even circle.today")
            assert float(today.get_attribute("data-x")) == pytest.approx(usage["break_even"]["kimi-k3"]["tokens_per_month"], rel=0.05)
            cluster = browser.find_element(By.CSS_SELECTOR, "section.break-even line.cluster")
            assert float(cluster.get_attribute("data-usd-per-month")) == pytest.approx(usage["break_even"]["kimi-k3"]["rent_usd_per_month"])
            assert HOSTED_KEY not in browser.page_source and gw.key not in browser.page_source
            full_page_screenshot(browser, shots / "ui-spend.png")

            # The live page: the engine's two slots, the gateway's target up, tokens decoded.
            browser.get(base + "/ui/live")
            assert browser.find_element(By.CSS_SELECTOR, "table.engines [data-field=slots_total]").text == "2"
            assert browser.find_element(By.CSS_SELECTOR, "table.targets .state").text == "up"
            _chat(gw.url, gw.key)
            WebDriverWait(browser, 30, ignored_exceptions=_REFRESHED).until(
                lambda driver: driver.find_element(By.CSS_SELECTOR, "[data-field=decode_tokens_per_s]").text not in ("–", "0.0")
            )
            full_page_screenshot(browser, shots / "ui-live.png")
            # The same engine as `tierlocal status --live --json` sees it.
            live = run_cli("status", "--live", "--window", "0.5", "--json", env={"TIERLOCAL_HOME": str(home)})
            assert live.returncode == 0, live.stderr
            (engine,) = json.loads(live.stdout)["engines"]
            assert (engine["slots_total"], engine["error"]) == (2, None) and engine["predicted_tokens_total"] >= 16
            # Nothing the browser saw tripped the Content-Security-Policy or failed to load.
            problems = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE" and "/ui/data/spend.json" not in entry["message"]]
            assert problems == []

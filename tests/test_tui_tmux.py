"""The real `tierlocal ui` under tmux at 80×24 (send-keys, capture-pane), as a user's SSH
session runs it: against a real `tierlocal serve` of the Gemma model (llama-server built from
the pinned sources) and a real gateway, asserting what the screen shows — the Live plan figures
equal `status --json`, a request through the gateway (the real openai client) appears in Live,
a filter changes the table; and the pull and serve keys fetching the catalog's Gemma entry from
a hub on loopback and starting a serve of it that Live then shows."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.support.assets import Assets
from tests.support.browser import artefacts_dir
from tests.support.cli import run_cli
from tests.support.engines import free_port
from tests.support.gatewayrun import gateway
from tests.support.servers import HubRepo, fake_hub
from tests.support.serving import serving
from tests.support.tmux import Tmux, tmux_session

#: The catalog's entry for the test model (recipes/models.toml: gemma-3-270m).
GEMMA_REPO = "unsloth/gemma-3-270m-it-GGUF"
SECRET = "sk-hosted-secret-never-shown-0123456789"


def _ui_env(assets: Assets, home: Path, **extra: str) -> dict[str, str]:
    return {
        "TIERLOCAL_HOME": str(home),
        "TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu),
        "PATH": os.environ["PATH"],
        "TERM": "tmux-256color",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **extra,
    }


def _status(home: Path) -> dict:  # type: ignore[type-arg]
    result = run_cli("status", "--json", env={"TIERLOCAL_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _planned_lines(status: dict) -> list[str]:  # type: ignore[type-arg]
    """The Live lines `status --json`'s delta gives, in MiB as the screen rounds them."""
    return [
        f"{d['name']}: planned {d['planned_bytes'] / 2**20:.0f} MiB, allocated {d['actual_bytes'] / 2**20:.0f} MiB"
        for d in status["delta"]["devices"]
    ]


def _flat(text: str) -> str:
    """The screen as one line: a message the terminal wrapped reads whole."""
    return re.sub(r"\s+", " ", text)


def _screenshot(argv: list[str], env: dict[str, str], name: str, during: Callable[[], None] | None = None) -> Path:
    """The UI's own SVG screenshot (Textual's TEXTUAL_SCREENSHOT: taken after 4 s, then it
    exits) at 100×30 (``during``: run meanwhile), into the artefacts folder docs/images/ copies."""
    folder = artefacts_dir()
    (folder / name).unlink(missing_ok=True)
    shot_env = {**env, "TEXTUAL_SCREENSHOT": "4", "TEXTUAL_SCREENSHOT_LOCATION": str(folder), "TEXTUAL_SCREENSHOT_FILENAME": name}
    with tmux_session(argv, shot_env, columns=100, rows=30) as shot:
        if during is not None:
            during()
        shot.wait_for(lambda text: "EXITED 0" in text, 30, f"the {name} screenshot")
    assert (folder / name).read_text().startswith("<svg")
    return folder / name


def _quit(ui: Tmux, key: str = "q") -> None:
    ui.send(key)
    ui.wait_for(lambda text: "EXITED 0" in text, 10, f"a clean exit on {key}")


def _filter(ui: Tmux, words: str) -> None:
    """Open the filter box, and type into it once it shows: on a busy machine keys sent before
    the box is drawn reach the table, not the box (CI once saw an empty box and no filter)."""
    ui.send("/")
    ui.wait_for(lambda text: "filter: words in the model" in text, 10, "the filter box")
    ui.send(words, "Enter")


def test_live_shows_a_real_serve_and_gateway_updating_and_a_filter_changes_the_table(assets: Assets, tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    with serving(assets, home, "--port", str(port), "--ctx", "2048", "--parallel", "2") as (_process, ready):
        status = _status(home)
        assert status["url"] == ready["url"] == f"http://127.0.0.1:{port}"
        body = (
            '[[routes]]\nmodel = "gemma"\ntargets = [\n'
            f'  {{ url = "http://127.0.0.1:{port}/v1", model = "gemma" }},\n'
            '  { url = "https://api.moonshot.ai/v1", model = "kimi-k3", api_key_env = "HOSTED_KEY" },\n]\n'
            '[[users]]\nname = "alice"\nbudget_usd = 5.0\nbudget_period = "month"\n'
        )
        (tmp_path / "gw").mkdir()
        with gateway(tmp_path / "gw", body, env={"HOSTED_KEY": SECRET, "TIERLOCAL_HOME": str(home)}) as gw:
            argv = [sys.executable, "-m", "tierlocal", "ui", "--live", "--gateway-config", str(gw.config), "--gpu", "24GiB", "--ram", "32GiB"]
            with tmux_session(argv, _ui_env(assets, home, HOSTED_KEY=SECRET)) as ui:
                screen = ui.wait_for(lambda text: "plan held" in text and "primary" in text, 30, "the serve and the gateway on Live")
                for line in _planned_lines(status):
                    assert line in screen
                assert f"http://127.0.0.1:{port}" in screen and SECRET not in screen, screen
                one = next(row for row in status["plan"]["users"] if row["users"] == 1)["per_user_decode_tokens_per_s"]
                assert f"users at once (each user's decode, first token): 1: {one:,.1f} tok/s" in _flat(screen), screen  # issue 48
                assert re.search(rf"gemma\s+primary\s+127\.0\.0\.1:{port}/v1\s+gemma\s+up\s+0\s+2\s+-", screen), screen
                assert re.search(r"fallback 1\s+api\.moonshot\.ai/v1\s+kimi-k3\s+unknown\s+0\s+-\s+-", screen), screen
                assert re.search(r"slots 0 busy / 2 idle", screen), screen
                # A request through the gateway: its tokens/s shows in the next samples, and it in the spend table.
                # The rate shows while the answer is written (on a loaded machine that is most of
                # the request's time), so the screen is watched from another thread meanwhile.
                api = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0)
                with ThreadPoolExecutor(1) as pool:
                    asked = pool.submit(
                        api.chat.completions.create, model="gemma", messages=[{"role": "user", "content": "Count to twenty"}], max_tokens=48
                    )
                    ui.wait_for(lambda text: re.search(r"decode (?!0\.0 )[\d,]+\.\d tok/s", text) is not None, 60, "a decode rate above zero")
                    answer = asked.result(timeout=120)
                assert answer.usage is not None
                tokens_in, tokens_out = answer.usage.prompt_tokens, answer.usage.completion_tokens
                screen = ui.wait_for(
                    lambda text: re.search(rf"alice\s+1\s+{tokens_in}\s+{tokens_out}\s", text) is not None, 15, "alice's request on Live"
                )
                assert "of $5.00/month" in screen and "local: 1 requests" in screen
                assert SECRET not in screen and gw.key not in screen
                # What fits: a filter key narrows the table.
                ui.send("1")
                before = ui.wait_for(lambda text: re.search(r"(\d+)/(\d+) shown", text) is not None, 20, "the What fits table")
                shown_before = re.search(r"(\d+)/(\d+) shown", before)
                assert shown_before is not None and shown_before.group(1) == shown_before.group(2)
                _filter(ui, "gemma-3 ")
                after = ui.wait_for(lambda text: "filter “gemma-3”" in text, 10, "the filtered table")
                shown_after = re.search(r"(\d+)/(\d+) shown", after)
                assert shown_after is not None and 0 < int(shown_after.group(1)) < int(shown_before.group(1))
                table_models = re.findall(r"^ (\S+)\s+(Q\w+|MXFP4\w*|BF16|F16)\s+(best|fits|tight|too slow|no room)", after, re.M)
                assert table_models and all(model.startswith("gemma-3") for model, _, _ in table_models), after
                _quit(ui, "C-c")

            def traffic() -> None:  # something for the sparklines to draw
                for _ in range(3):
                    time.sleep(0.7)
                    api.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "Count to fifty"}], max_tokens=96)

            live_svg = _screenshot(argv, _ui_env(assets, home, HOSTED_KEY=SECRET), "tui-live.svg", traffic).read_text()
            assert "plan&#160;held" in live_svg and SECRET not in live_svg and gw.key not in live_svg
            fits_svg = _screenshot(argv[: argv.index("--live")] + argv[argv.index("--live") + 1 :], _ui_env(assets, home), "tui-fits.svg").read_text()
            assert "Command:" in fits_svg


def test_the_pull_and_serve_keys_fetch_the_selection_and_start_a_serve_live_shows(assets: Assets, tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "gemma-3-270m-it-Q4_K_M.gguf").symlink_to(assets.gemma_gguf)
    hub_cache = tmp_path / "hub"
    with fake_hub([HubRepo(GEMMA_REPO, repo)]) as (endpoint, _state):
        env = _ui_env(assets, home, HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(hub_cache), HF_TOKEN="")
        argv = [sys.executable, "-m", "tierlocal", "ui", "--ctx", "2048"]
        started_pid = None
        try:
            with tmux_session(argv, env) as ui:
                ui.wait_for(lambda text: re.search(r"\d+/\d+ shown", text) is not None, 20, "the What fits table")
                _filter(ui, "gemma-3-270m q4_k_m")
                screen = ui.wait_for(
                    lambda text: re.search(r"^ gemma-3-270m\s+Q4_K_M", text, re.M) is not None and "1/" in text, 10, "the one Gemma row"
                )
                assert "gemma-3-270m Q4_K_M" in screen  # its plan beside the table
                ui.send("s")
                ui.wait_for(lambda text: "is not downloaded yet: press d to pull it" in _flat(text), 10, "serve refused before a pull")
                ui.send("d")
                ui.wait_for(lambda text: "pulled gemma-3-270m Q4_K_M into" in _flat(text), 60, "the pull")
                assert list(hub_cache.rglob("gemma-3-270m-it-Q4_K_M.gguf"))
                ui.send("s")
                ui.wait_for(lambda text: "tierlocal serve gemma-3-270m Q4_K_M on port" in _flat(text), 10, "serve started")
                ui.send("2")
                screen = ui.wait_for(lambda text: "plan held" in text, 120, "the new serve on Live")
                status = _status(home)
                started_pid = int(status["pid"])
                assert status["plan"]["model"]["source"].endswith("gemma-3-270m-it-Q4_K_M.gguf")
                assert status["actual"]["n_ctx"] == 2048 and status["actual"]["parallel"] == 1
                for line in _planned_lines(status):
                    assert line in screen
                assert "gemma-3-270m-it-Q4_K_M.gguf" in screen
                _quit(ui)
            # It keeps serving after the UI quits (a session of its own).
            assert _status(home)["pid"] == started_pid
        finally:
            _stop_serves(home, started_pid)


def _stop_serves(home: Path, pid: int | None) -> None:
    """Stop what the serve key started (found by its state file when the test failed early)."""
    pids = {pid} if pid else set()
    for path in (home / "run").glob("*.json") if (home / "run").is_dir() else []:
        try:
            pids.add(int(json.loads(path.read_text())["pid"]))
        except (ValueError, KeyError, OSError):
            continue
    for each in pids:
        try:
            os.kill(each, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 30
    for each in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(each, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
    if pids and time.monotonic() >= deadline:
        pytest.fail(f"serve(s) {sorted(pids)} did not stop on SIGTERM")

"""`tierlocal ui` driven by Textual's pilot (keys pressed as a user presses them, the screen's
widgets read back), checked against what `tierlocal check --json` prints for the same machine;
and its pure parts (rows, filters, sorts, bars) on the real catalog. The real binary under tmux
against a real serve and gateway is tests/test_tui_tmux.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from tests.support.cli import run_cli
from tierlocal.catalog import load_models
from tierlocal.fit.estimate import DeviceUsage
from tierlocal.gateway.config import default_config
from tierlocal.hardware.detect import detect
from tierlocal.hardware.override import with_gpu_override, with_ram_override
from tierlocal.recommendation import catalog_recommendation
from tierlocal.tui import fits as fits_module
from tierlocal.tui.app import TierlocalApp
from tierlocal.tui.fits import FitsScreen
from tierlocal.tui.planning import Planning
from tierlocal.tui.rows import FIT_FILTERS, device_bar, next_quant, rows_of, visible_rows
from tierlocal.units import format_bytes

MACHINE = ["--gpu", "24GiB", "--ram", "32GiB"]


def _planning(gpu: str = "24GiB", ram: str = "32GiB", ctx: int = 8192, parallel: int = 1) -> Planning:
    hardware = with_ram_override(with_gpu_override(detect(), [gpu]), ram, None)
    return Planning(hardware=hardware, ctx=ctx, parallel=parallel, machine_label=f"--gpu {gpu} --ram {ram}")


def _check_json(*args: str) -> dict:  # type: ignore[type-arg]
    result = run_cli("check", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _drive(planning: Planning, steps: Callable[[TierlocalApp, object], Awaitable[None]], size: tuple[int, int] = (100, 32)) -> None:
    """Run the app headless at ``size`` and hand ``steps`` the app and its pilot once the
    table is planned."""

    async def main() -> None:
        app = TierlocalApp(planning, default_config())
        async with app.run_test(size=size) as pilot:
            await _until(pilot, lambda: isinstance(app.screen, FitsScreen) and bool(app.screen.rows))
            await steps(app, pilot)

    asyncio.run(main())


async def _until(pilot: object, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for ``condition``; the limit is generous because a replan on a loaded CI machine (4
    workers on 2 cores) took over 20 s once: it is not a speed claim (bench/tui_startup.py is)."""
    waited = 0.0
    while not condition():
        assert waited < timeout_s, "the screen did not get there"
        await pilot.pause(0.05)  # type: ignore[attr-defined]
        waited += 0.05


def _table_models(screen: FitsScreen) -> list[tuple[str, str, str]]:
    table = screen.query_one(DataTable)
    return [(str(table.get_row_at(i)[0]), str(table.get_row_at(i)[1]), str(table.get_row_at(i)[2])) for i in range(table.row_count)]


def _plan_text(screen: FitsScreen) -> str:
    """What the plan panel shows, as plain text at its width."""
    from rich.console import Console

    console = Console(width=120, color_system=None, record=True)
    console.print(screen.query_one("#fits-plan", Static).content)  # type: ignore[arg-type]
    return console.export_text()


# --- the pure parts ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recommendation():  # type: ignore[no-untyped-def]
    return catalog_recommendation(list(load_models()), _planning().hardware, ctx=8192, parallel=1, min_tokens_per_s=5.0)


def test_the_filters_keep_only_their_statuses_and_the_words(recommendation) -> None:  # type: ignore[no-untyped-def]
    rows = rows_of(recommendation)
    assert len(rows) == len(recommendation.candidates) > 50
    for name, statuses in FIT_FILTERS.items():
        shown = visible_rows(rows, fit_filter=name)
        assert shown and all(not statuses or row.status in statuses for row in shown), name
    qwen = visible_rows(rows, text="qwen3 q8_0")
    assert qwen and all("qwen3" in row.model and row.quant == "Q8_0" for row in qwen)
    assert visible_rows(rows, text="no-such-model") == []


def test_each_sort_puts_the_largest_first_and_reverse_turns_it_round(recommendation) -> None:  # type: ignore[no-untyped-def]
    rows = rows_of(recommendation)
    sizes = [row.file_bytes for row in visible_rows(rows, sort="size")]
    assert sizes == sorted(sizes, reverse=True)
    assert [row.file_bytes for row in visible_rows(rows, sort="size", reverse=True)] == sorted(sizes)
    scores = [row.score for row in visible_rows(rows, sort="score") if row.score is not None]
    assert scores == sorted(scores, reverse=True)
    speeds = [row.decode_tokens_per_s for row in visible_rows(rows, sort="speed") if row.decode_tokens_per_s is not None]
    assert speeds == sorted(speeds, reverse=True)
    assert [row.key for row in visible_rows(rows)] == [c.key for c in recommendation.candidates]
    with pytest.raises(ValueError, match="unknown sort"):
        visible_rows(rows, sort="colour")


def test_next_quant_walks_one_models_files_by_bits_and_wraps(recommendation) -> None:  # type: ignore[no-untyped-def]
    rows = rows_of(recommendation)
    first = next(row for row in rows if row.model == "qwen3-8b" and row.quant == "Q4_K_M")
    seen = [first.quant]
    row = first
    for _ in range(5):
        row = next_quant(rows, row)
        seen.append(row.quant)
    assert seen[:4] == ["Q4_K_M", "Q6_K", "Q8_0", "Q4_K_M"]


def test_a_device_bar_spans_the_free_memory_in_proportion() -> None:
    gib = 2**30
    device = DeviceUsage("GPU0", "cuda", 24 * gib, 20 * gib, 10 * gib, 5 * gib, gib // 2, gib // 4, gib // 4, 0)
    bar = device_bar(device, 40)
    assert [(part.label, part.cells) for part in bar] == [("weights", 20), ("KV", 10), ("compute", 2), ("free", 8)]
    assert sum(part.size_bytes for part in bar) == 20 * gib
    over = device_bar(DeviceUsage("GPU0", "cuda", 8 * gib, 8 * gib, 12 * gib, 4 * gib, 0, 0, 0, 0), 32)
    assert [(part.label, part.cells) for part in over] == [("weights", 24), ("KV", 8), ("compute", 0), ("free", 0)]
    tiny = device_bar(DeviceUsage("GPU0", "cuda", 80 * gib, 80 * gib, 70 * gib, 1, 1, 0, 0, 0), 10)
    assert sum(part.cells for part in tiny) == 10 and all(part.cells >= 1 for part in tiny if part.size_bytes)


# --- the app, driven by keys --------------------------------------------------------------------


def test_it_opens_on_the_answer_check_gives_with_its_plan_beside_it() -> None:
    payload = _check_json(*MACHINE)
    expected, devices = payload["recommendation"], payload["plan"]["devices"]

    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        assert _table_models(screen)[0] == (expected["model"], expected["quant"], "best")
        text = _plan_text(screen)
        assert f"{expected['model']} {expected['quant']}" in text
        assert len(devices) == 2
        for device in devices:  # each device's bar legend carries check's figures
            compute = device["compute_bytes"] + device["output_bytes"] + device["overhead_bytes"] + device["projector_bytes"]
            assert f"{device['name']}: {format_bytes(device['total_needed_bytes'])} of {format_bytes(device['free_bytes'])} free" in text
            assert (
                f"weights {format_bytes(device['weights_bytes'])}  ■ KV {format_bytes(device['kv_bytes'])}  ■ compute {format_bytes(compute)}" in text
            )
        assert "Command: " + " ".join(payload["plan"]["command"]) in text.replace("\n", " ")
        assert str(screen.query_one("#fits-status", Static).content).startswith("--gpu 24GiB --ram 32GiB · ctx 8,192 × 1 slot(s)")

    _drive(_planning(), steps)


def test_context_and_slot_keys_replan_as_check_does_at_those_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replan is slowed to 0.4 s, as on a loaded machine, so the keys arrive before the
    replans land (the real planner still plans every one)."""
    planned = fits_module.plan_catalog

    def slow_plan(planning: Planning) -> object:
        time.sleep(0.4)
        return planned(planning)

    monkeypatch.setattr(fits_module, "plan_catalog", slow_plan)
    expected = _check_json(*MACHINE, "--ctx", "32768", "--parallel", "2")["recommendation"]

    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        # Pressed at once, faster than a replan lands: each key builds on the last one asked
        # for, and the replans overtaken by a newer key are dropped (once, under load, the
        # second + replanned 16,384 again and a stale slot count won).
        await pilot.press("plus", "plus", "right_square_bracket")  # type: ignore[attr-defined]
        await _until(pilot, lambda: screen.planning.ctx == 32768 and screen.planning.parallel == 2 and screen.recommendation.parallel == 2)
        best = screen.recommendation.best
        assert best is not None and (best.entry.family, best.entry.quant) == (expected["model"], expected["quant"])
        # The status line names the new pick; the plan panel keeps the row the user selected, replanned.
        status = str(screen.query_one("#fits-status", Static).content)
        assert f"best: {expected['model']} {expected['quant']}" in status and "ctx 32,768 × 2 slot(s)" in status
        assert "32,768 tokens × 2 slot(s)" in _plan_text(screen)
        assert screen.recommendation.best.to_json()["kv_bytes"] == expected["kv_bytes"]
        await pilot.press("minus")  # type: ignore[attr-defined]
        await _until(pilot, lambda: screen.recommendation.ctx == 16384)

    _drive(_planning(), steps)


def test_the_filter_fit_and_sort_keys_change_the_table() -> None:
    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        everything = _table_models(screen)
        await pilot.press("slash", *"qwen3 q8", "enter")  # type: ignore[attr-defined]
        filtered = _table_models(screen)
        assert filtered and len(filtered) < len(everything) and all("qwen3" in model and quant == "Q8_0" for model, quant, _ in filtered)
        await pilot.press("escape", "f")  # type: ignore[attr-defined]
        assert {status for _, _, status in _table_models(screen)} <= {"best", "fits"}
        await pilot.press("f", "f")  # type: ignore[attr-defined]
        assert {status for _, _, status in _table_models(screen)} == {"no room"}
        await pilot.press("f", "o", "o", "o")  # type: ignore[attr-defined]
        assert screen.sort == "size"
        table = screen.query_one(DataTable)
        sizes = [row.file_bytes for row in screen.shown]
        assert sizes == sorted(sizes, reverse=True) and table.row_count == len(everything)
        await pilot.press("r")  # type: ignore[attr-defined]
        assert [row.file_bytes for row in screen.shown] == sorted(sizes)

    _drive(_planning(), steps)


def test_the_quant_key_moves_to_the_same_models_next_file_and_shows_its_plan() -> None:
    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        before = screen.selected()
        assert before is not None
        await pilot.press("n")  # type: ignore[attr-defined]
        after = screen.selected()
        assert after is not None and after.model == before.model and after.quant != before.quant
        assert screen.query_one(DataTable).get_row_at(screen.query_one(DataTable).cursor_row)[1].plain == after.quant  # type: ignore[union-attr]
        assert f"{after.model} {after.quant}" in _plan_text(screen)

    _drive(_planning(), steps)


def test_the_machine_key_replans_for_another_gpu_and_a_bad_one_says_why() -> None:
    expected = _check_json("--gpu", "12GiB", "--ram", "32GiB")["recommendation"]

    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        await pilot.press("m", *"banana-9000", "enter", "enter")  # type: ignore[attr-defined]
        await pilot.pause(0.2)  # type: ignore[attr-defined]
        error = str(app.screen.query_one("#machine-error", Static).content)
        assert error.startswith("error: ") and "banana-9000" in error
        gpu = app.screen.query_one("#machine-gpu", Input)
        gpu.value = "12GiB"
        app.screen.query_one("#machine-ram", Input).value = "32GiB"
        gpu.focus()
        await pilot.press("enter", "enter")  # type: ignore[attr-defined]
        await _until(
            pilot,
            lambda: (
                app.screen is screen
                and screen.planning.machine_label == "--gpu 12GiB --ram 32GiB"
                and screen.recommendation.hardware.gpus[0].total_bytes == 12 * 2**30
            ),
        )
        best = screen.recommendation.best
        assert best is not None and (best.entry.family, best.entry.quant) == (expected["model"], expected["quant"])
        assert str(screen.query_one("#fits-status", Static).content).startswith("--gpu 12GiB --ram 32GiB")

    _drive(_planning(), steps)


def test_it_fits_80_by_24_and_quits_on_q(tmp_path: Path) -> None:
    async def steps(app: TierlocalApp, pilot: object) -> None:
        screen = app.screen
        assert isinstance(screen, FitsScreen)
        assert screen.query_one(DataTable).size.height >= 5 and screen.query_one("#fits-plan-box").size.height >= 5
        box = screen.query_one("#fits-plan-box")
        await _until(pilot, lambda: box.max_scroll_y > 0)  # the plan is taller than its box at 80×24 (once drawn) …
        assert box.scroll_y == 0
        await pilot.press("space")  # type: ignore[attr-defined]
        await pilot.pause(0.1)  # type: ignore[attr-defined]
        assert box.scroll_y > 0  # … and space pages it
        (tmp_path / "fits.svg").write_text(app.export_screenshot())
        await pilot.press("2")  # type: ignore[attr-defined]
        await _until(pilot, lambda: "no tierlocal serve running" in str(app.screen.query_one("#live-summary", Static).content))
        await pilot.press("q")  # type: ignore[attr-defined]
        await _until(pilot, lambda: app.return_code is not None or not app.is_running)

    _drive(_planning(), steps, size=(80, 24))
    assert "<svg" in (tmp_path / "fits.svg").read_text()


def test_without_a_terminal_it_says_so_in_one_line() -> None:
    result = run_cli("ui")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: tierlocal ui needs a terminal",
        "hint: run it in an SSH session or a terminal; `tierlocal check --json` is the scriptable answer",
    ]


def test_the_hub_screen_searches_and_plans_as_search_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Key 3, words, Enter: the repositories `tierlocal search` finds for the same machine, each at
    the same quantisation, with the same best; against the loopback hub of tests/test_hub_repos.py."""
    import huggingface_hub.constants as hf_constants

    from tests.support.hub_repos import hub_repos
    from tests.support.servers import fake_hub
    from tests.test_hub_repos import _test_cache
    from tierlocal.tui.hub import HubScreen

    with fake_hub(hub_repos(_test_cache())) as (endpoint, _):
        monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        env = {"HF_ENDPOINT": endpoint, "XDG_CACHE_HOME": str(tmp_path)}
        found = json.loads(run_cli("search", "qwen3", *MACHINE, "--ctx", "8192", "--min-speed", "5", "--json", env=env).stdout)

        async def steps(app: TierlocalApp, pilot: object) -> None:
            await pilot.press("3")  # type: ignore[attr-defined]
            await _until(pilot, lambda: isinstance(app.screen, HubScreen))
            screen = app.screen
            assert isinstance(screen, HubScreen)
            screen.query_one(Input).value = "qwen3"
            await pilot.press("enter")  # type: ignore[attr-defined]
            await _until(pilot, lambda: screen.found is not None and screen.query_one(DataTable).row_count > 0)
            table = screen.query_one(DataTable)
            rows = [(str(table.get_row_at(i)[0]), str(table.get_row_at(i)[2])) for i in range(table.row_count)]
            assert rows == [(r["repo"], r["candidate"]["quant"]) for r in found["results"]]
            assert str(screen.query_one("#hub-status", Static).render()).startswith(
                f"{len(rows)} repositories match 'qwen3'; best here: {found['best']}"
            )

        _drive(_planning(), steps)

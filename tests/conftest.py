"""Shared fixtures: the prepared engines and model, an isolated TIERLOCAL_HOME, and the lock
that lets a ``serial`` test run alone while the others run in parallel (pytest-xdist).

A test that uses the prepared engines or model (the ``assets`` or ``gemma`` fixture, however
indirectly) is marked ``engines`` here, so ``pytest -m "not engines"`` runs exactly the tests
that need neither.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.assets import Assets, load_assets, manifest_path
from tests.support.engines import ENGINE_THREADS

#: Fixtures that need tests/assets/prepare.py to have run.
_ENGINE_FIXTURES = {"assets", "gemma"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engines)
    items.sort(key=_start_order)


def _start_order(item: pytest.Item) -> int:
    """Tests marked ``serial`` first, then those marked ``long``, then the other engine tests,
    then the rest — 500 tests that need no engine, a second or two each — each kind in file
    order (a stable sort; xdist hands tests out in this order, ``--no-loadscope-reorder``). A
    serial test started mid-run waits for every running test to finish while the idle workers
    wait with it; at the start nothing is running yet. A long test left to the end runs alone
    on a machine whose other cores have nothing left to do; short ones end together."""
    if item.get_closest_marker("serial"):
        return 0
    if item.get_closest_marker("long"):
        return 1
    return 2 if item.get_closest_marker("engines") else 3


@pytest.fixture(scope="session")
def assets() -> Assets:
    prepared = load_assets()
    if prepared is None:
        pytest.fail(
            f"test engines and model are not prepared ({manifest_path()} is missing): run `bash tests/run.sh`, "
            "which prepares them, or `python tests/assets/prepare.py`",
            pytrace=False,
        )
    return prepared


@pytest.fixture(scope="session")
def gemma(assets: Assets) -> Path:
    return assets.gemma_gguf


@pytest.fixture(scope="session")
def unit_python() -> Path:
    """A Python with tierlocal that a systemd unit can run (tests/support/service_install.py)."""
    from tests.support.service_install import service_python

    return service_python()


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test gets its own TIERLOCAL_HOME and no ambient engine or token settings."""
    home = tmp_path / "tierlocal-home"
    monkeypatch.setenv("TIERLOCAL_HOME", str(home))
    for name in ("TIERLOCAL_LLAMA_SERVER", "TIERLOCAL_DEBUG", "HF_TOKEN", "HF_ENDPOINT", "GGML_VK_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return home


@pytest.fixture(autouse=True)
def machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """With tests in parallel (``-n``), a test marked ``serial`` — one that times the engine or
    waits on the clock, and so reads a busy machine as a slow one — runs with no other test
    running. A readers-writer lock over files every worker shares: the others hold ``room``
    shared; a serial test takes ``turnstile`` (so no new test starts) and then ``room``
    exclusively (so the running ones finish first). Without xdist nothing ever waits.

    The others share the cores: an engine one of them starts without a thread count
    (``tierlocal serve`` without ``--threads``, Ollama's runner) runs one CPU thread
    (``LLAMA_ARG_THREADS``, which llama.cpp reads where no ``-t`` is given; the tests that pass
    one pass :data:`tests.support.engines.ENGINE_THREADS`). llama.cpp's threads wait for each
    other spinning, and on a machine with more engine threads than cores that waiting was most
    of the suite's CPU. A serial test keeps the engine's own default, as users run it."""
    if not request.node.get_closest_marker("serial"):
        monkeypatch.setenv("LLAMA_ARG_THREADS", ENGINE_THREADS)
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if shared.name.startswith("popen-gw") else shared  # one directory for all workers
    with (shared / "turnstile.lock").open("a") as turnstile, (shared / "room.lock").open("a") as room:
        if request.node.get_closest_marker("serial"):
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(room, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)  # waits while a serial test is waiting or running
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(room, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)

"""Shared fixtures: the prepared engines and model, an isolated TIERLOCAL_HOME.

A test that uses the prepared engines or model (the ``assets`` or ``gemma`` fixture, however
indirectly) is marked ``engines`` here, so ``pytest -m "not engines"`` runs exactly the tests
that need neither.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.assets import Assets, load_assets, manifest_path

#: Fixtures that need tests/assets/prepare.py to have run.
_ENGINE_FIXTURES = {"assets", "gemma"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engines)


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


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test gets its own TIERLOCAL_HOME and no ambient engine or token settings."""
    home = tmp_path / "tierlocal-home"
    monkeypatch.setenv("TIERLOCAL_HOME", str(home))
    for name in ("TIERLOCAL_LLAMA_SERVER", "TIERLOCAL_DEBUG", "HF_TOKEN", "HF_ENDPOINT", "GGML_VK_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return home

"""Shared fixtures: the prepared engines and model, an isolated TIERLOCAL_HOME, the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "assets"))
import prepare  # noqa: E402  (tests/assets/prepare.py: the single place that knows the cache layout)

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Assets:
    """Paths of the prepared engines and model (see tests/assets/prepare.py)."""

    llama_server_cpu: Path
    llama_server_vulkan: Path
    llama_quantize: Path
    llama_gguf_split: Path
    gemma_gguf: Path
    gemma_sha256: str
    ollama: Path
    ollama_version: str
    registry: Path
    llama_cpp_source: Path
    redis_server: Path
    redis_libs: Path


@pytest.fixture(scope="session")
def assets() -> Assets:
    manifest = prepare.manifest_path()
    if not manifest.is_file():
        pytest.fail(
            f"test engines and model are not prepared ({manifest} is missing): run `bash tests/run.sh`, "
            "which prepares them, or `python tests/assets/prepare.py`",
            pytrace=False,
        )
    data = json.loads(manifest.read_text())
    return Assets(
        llama_server_cpu=Path(data["llama_server_cpu"]),
        llama_server_vulkan=Path(data["llama_server_vulkan"]),
        llama_quantize=Path(data["llama_quantize"]),
        llama_gguf_split=Path(data["llama_gguf_split"]),
        gemma_gguf=Path(data["gemma_gguf"]),
        gemma_sha256=data["gemma_sha256"],
        ollama=Path(data["ollama"]),
        ollama_version=data["ollama_version"],
        registry=Path(data["registry"]),
        llama_cpp_source=Path(data["llama_cpp_source"]),
        redis_server=Path(data["redis_server"]),
        redis_libs=Path(data["redis_libs"]),
    )


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


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``tierlocal ARGS`` in a fresh process, as a user would (the environment as set by the test)."""
    return subprocess.run(
        [sys.executable, "-m", "tierlocal", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO_ROOT,
        check=False,
    )

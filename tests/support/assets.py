"""The real engines and model the suite runs against, as tests/assets/prepare.py left them
(built and cached outside the checkout; its manifest says where)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.assets import prepare

__all__ = ["Assets", "load_assets", "manifest_path"]


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
    #: llama.cpp's RPC backend server, from the CPU build: the devices of a multi-device split.
    rpc_server: Path
    #: SkyPilot and kubernetes-validate, pip-installed here (PYTHONPATH for ``python -S``).
    launch_validators: Path


def manifest_path() -> Path:
    """Where prepare.py writes its manifest (keyed by the pinned versions)."""
    return prepare.manifest_path()


def load_assets() -> Assets | None:
    """The prepared assets, or None when prepare.py has not run on this machine."""
    manifest = manifest_path()
    if not manifest.is_file():
        return None
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
        rpc_server=Path(data["rpc_server"]),
        launch_validators=Path(data["launch_validators"]),
    )

"""`tierlocal serve --json` as a subprocess, the way a user or a supervisor runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT
from tests.support.engines import ENGINE_THREADS, first_json_document

__all__ = ["serving"]


@contextmanager
def serving(
    assets: Assets, home: Path, *args: str, vulkan: bool = False, extra_env: dict[str, str] | None = None, model: Path | None = None
) -> Iterator[tuple[subprocess.Popen[str], dict]]:  # type: ignore[type-arg]
    """Run `tierlocal serve --json` on ``model`` (the Gemma file), yield the process and its
    ready object; stop it after. On the Vulkan device (Mesa's llvmpipe) serve runs with
    ``--flash-attn off`` unless ``args`` say otherwise: this llama.cpp segfaults there on the
    first real prompt with flash attention on and any layer on the device."""
    binary = assets.llama_server_vulkan if vulkan else assets.llama_server_cpu
    if vulkan and "--flash-attn" not in args:
        args = (*args, "--flash-attn", "off")
    env = {**os.environ, "TIERLOCAL_HOME": str(home), "GGML_VK_VISIBLE_DEVICES": "0", "TIERLOCAL_LLAMA_SERVER": str(binary), **(extra_env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "tierlocal", "serve", str(model or assets.gemma_gguf), "--threads", ENGINE_THREADS, "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    try:
        yield process, first_json_document(process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        process.communicate()

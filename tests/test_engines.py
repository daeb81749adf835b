"""The prepared test engines work: llama-server (CPU and Vulkan on Mesa's software device)
serves the real Gemma model, and the real Ollama runs it through our llama-server.
Every later issue builds on these."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import httpx2
import ollama
import pytest

from tests.support.assets import Assets
from tests.support.engines import free_port, llama_server_argv, running


def test_cpu_llama_server_serves_gemma(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port)
    with running(argv, tmp_path / "cpu.log", f"http://127.0.0.1:{port}/health") as log:
        response = httpx2.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert response.status_code == 200
        body = response.json()
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["text"]
    text = log.read_text()
    assert re.search(r"model buffer size =\s+[\d.]+ MiB", text)
    assert "gemma3" in text


@pytest.mark.parametrize(("ngl", "offloaded"), [("99", 19), ("5", 5)])
def test_vulkan_llama_server_offloads_to_the_software_device(assets: Assets, tmp_path: Path, ngl: str, offloaded: int) -> None:
    port = free_port()
    argv = llama_server_argv(assets.llama_server_vulkan, assets.gemma_gguf, port, "-ngl", ngl)
    with running(argv, tmp_path / "vulkan.log", f"http://127.0.0.1:{port}/health", env={"GGML_VK_VISIBLE_DEVICES": "0"}) as log:
        response = httpx2.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hello", "n_predict": 2}, timeout=120)
        assert response.status_code == 200
    text = log.read_text()
    # Gemma 3 270M: 18 blocks + the output layer.
    assert f"offloaded {offloaded}/19 layers to GPU" in text
    assert re.search(r"Vulkan0 model buffer size =\s+[\d.]+ MiB", text)
    assert "llvmpipe" in text


def test_real_ollama_runs_gemma_through_ourllama_server_argv(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    env = {
        "OLLAMA_HOST": f"127.0.0.1:{port}",
        "OLLAMA_MODELS": str(tmp_path / "models"),
        "HOME": str(tmp_path / "home"),
        "OLLAMA_NUM_PARALLEL": "1",
    }
    with ExitStack() as stack:
        log = stack.enter_context(running([str(assets.ollama), "serve"], tmp_path / "ollama.log", f"http://127.0.0.1:{port}/api/version", env=env))
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        stack.callback(client.close)
        assert httpx2.get(f"http://127.0.0.1:{port}/api/version").json()["version"] == assets.ollama_version
        digest = client.create_blob(assets.gemma_gguf)
        assert digest == f"sha256:{assets.gemma_sha256}"
        client.create(model="gemma-test", files={"gemma.gguf": digest})
        reply = client.generate(model="gemma-test", prompt="Say hi", options={"num_predict": 4, "num_ctx": 1024, "temperature": 0})
        assert reply.done and reply.eval_count == 4
        (loaded,) = client.ps().models
        assert loaded.model == "gemma-test:latest"
        assert loaded.context_length == 1024
        assert loaded.size_vram == 0  # CPU only
        with pytest.raises(ollama.ResponseError, match="not found"):
            client.generate(model="no-such-model", prompt="x")
    text = log.read_text()
    assert "starting llama-server" in text
    assert str(assets.ollama.parent.parent / "lib" / "ollama" / "llama-server") in text

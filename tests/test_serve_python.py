"""`tierlocal serve --engine python`: llama-cpp-python's server (the pinned sdist's Python code in
a wheel that carries the CPU engine's own libllama, as tests/assets/prepare.py makes it) started
with the plan, verified from its own llama.cpp load log, served
to the openai client, with the key kept off its command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import openai

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import ENGINE_THREADS, first_json_document, free_port

# Gemma 3 270M (its GGUF header): 18 layers, 1 KV head of 256 for K and for V, f16 cache.
# llama-cpp-python keeps full-size sliding-window KV, so every layer holds the whole context.
GEMMA_LAYERS, GEMMA_KV_HEAD_DIM = 18, 256


def test_python_engine_serves_the_plan_and_keeps_the_key_off_its_command_line(assets: Assets, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("tl-python-engine-key-123\n")
    key_file.chmod(0o600)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlocal",
            "serve",
            str(assets.gemma_gguf),
            "--engine",
            "python",
            "--ctx",
            "2048",
            "--threads",
            ENGINE_THREADS,
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--api-key-file",
            str(key_file),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=os.environ.copy(),
    )
    try:
        ready = first_json_document(process)
        assert ready["engine"] == "llama-cpp-python" and ready["engine_version"] == "0.3.36"
        assert ready["delta"]["verified"], ready["delta"]
        host = next(device for device in ready["delta"]["devices"] if device["name"] == "host")
        assert abs(host["error"]) < 0.05, host  # the plan (full SWA KV, logits for a whole micro-batch) held
        actual = next(device for device in ready["actual"]["devices"] if device["name"] == "host")
        assert actual["kv_bytes"] == GEMMA_LAYERS * 2048 * 2 * GEMMA_KV_HEAD_DIM * 2  # K and V, 2 bytes each
        assert ready["actual"]["n_ctx"] == 2048
        cmdline = Path(f"/proc/{ready['engine_pid']}/cmdline").read_bytes()
        assert b"tl-python-engine-key-123" not in cmdline and b"--logits_all\x00false" in cmdline
        base = f"http://127.0.0.1:{port}/v1"
        assert httpx2.get(base + "/models").status_code == 401
        api = openai.OpenAI(base_url=base, api_key="tl-python-engine-key-123", max_retries=0)
        assert [model.id for model in api.models.list()] == [assets.gemma_gguf.stem]
        answer = api.completions.create(model=assets.gemma_gguf.stem, prompt="Once upon a time there was a", max_tokens=3, temperature=0)
        assert answer.usage is not None and answer.usage.prompt_tokens > 5 and 1 <= answer.usage.completion_tokens <= 3
        assert answer.choices[0].text.strip()
        # No template in the file: llama-cpp-python gets Gemma's chat format, not its llama-2 default.
        assert b"--chat_format\x00gemma" in cmdline and ready["chat_template"]["name"] == "gemma"
        said = api.chat.completions.create(
            model=assets.gemma_gguf.stem, messages=[{"role": "user", "content": "Say hello"}], max_tokens=16, temperature=0
        )
        text = said.choices[0].message.content or ""
        assert text and not any(marker in text for marker in ("[INST]", "<|im_start|>", "<|im_end|>")), text
        status = run_cli("status", "--port", str(port), "--json")
        assert status.returncode == 0, status.stderr
        assert '"engine": "llama-cpp-python"' in status.stdout
        human = run_cli("status", "--port", str(port))
        assert human.returncode == 0 and "None" not in human.stdout, human.stdout  # once "context 2048 = None slot(s) × None"
        assert "layers on the GPU: 0/" in human.stdout and "context 2048" in human.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert "tl-python-engine-key-123" not in err


def test_python_engine_refuses_parallel_slots(assets: Assets) -> None:
    result = run_cli("serve", str(assets.gemma_gguf), "--engine", "python", "--parallel", "2")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --parallel 2: llama-cpp-python's server runs one request at a time")

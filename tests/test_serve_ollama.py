"""`tierlocal serve --engine ollama` with the real Ollama (v0.33, running our llama-server) and
the Gemma model: the planned settings reach Ollama and the llama-server it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ollama

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import ENGINE_THREADS, first_json_document, free_port, own_home, process_gone, running


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TIERLOCAL_HOME": str(tmp_path / "tl"),
        "OLLAMA_MODELS": str(tmp_path / "models"),
        **own_home(tmp_path / "home"),
    }


def _start_serve(assets: Assets, tmp_path: Path, port: int, *args: str) -> tuple[subprocess.Popen[str], dict]:  # type: ignore[type-arg]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlocal",
            "serve",
            str(assets.gemma_gguf),
            "--engine",
            "ollama",
            "--ollama",
            str(assets.ollama),
            "--port",
            str(port),
            "--json",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=REPO_ROOT,
    )
    return process, first_json_document(process)


def test_ollama_started_with_the_plan(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    process, ready = _start_serve(assets, tmp_path, port, "--ctx", "2048", "--parallel", "2")
    try:
        actual, delta = ready["actual"], ready["delta"]
        assert delta["verified"] is True, delta
        # Ollama's num_ctx is per slot; it starts llama-server with -c num_ctx×parallel -np parallel.
        assert actual["context_length"] == 2048
        log = Path(ready["log"]).read_text()
        assert "llama_context: n_ctx                 = 4096" in log and "llama_context: n_seq_max             = 2" in log
        assert (actual["n_ctx"], actual["parallel"]) == (4096, 2)
        assert actual["size_vram_bytes"] == 0  # CPU only here, as planned (num_gpu 0)
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        with ThreadPoolExecutor(2) as pool:
            replies = list(
                pool.map(
                    lambda p: client.generate(model=actual["ollama_model"], prompt=p, options={"num_predict": 3, "temperature": 0}), ["One", "Two"]
                )
            )
        (loaded,) = client.ps().models
        client.close()
        assert all(reply.done and reply.eval_count == 3 for reply in replies)
        assert loaded.context_length == 2048  # still the planned context: no reload with defaults
        # status --live (the dashboard's live page) reads the same from Ollama's /api/ps.
        live = run_cli("status", "--live", "--window", "0.5", "--json", env={"TIERLOCAL_HOME": str(tmp_path / "tl")})
        assert live.returncode == 0, live.stderr
        (engine,) = json.loads(live.stdout)["engines"]
        assert (engine["engine"], engine["error"]) == ("ollama", None)
        assert [(model["name"], model["context_length"]) for model in engine["models"]] == [(loaded.model, 2048)]
        human = run_cli("status", env={"TIERLOCAL_HOME": str(tmp_path / "tl")})  # once a KeyError: 'devices'
        assert human.returncode == 0, human.stderr
        assert human.stdout.startswith(f"serving {actual['ollama_model']} through Ollama at ") and "plan held" in human.stdout
        engine_pid = ready["engine_pid"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert process_gone(engine_pid)


def test_a_running_ollama_is_used_as_it_is(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(tmp_path / "models"), "HOME": str(tmp_path / "home")}
    with running([str(assets.ollama), "serve"], tmp_path / "ollama.log", f"http://127.0.0.1:{port}/api/version", env=env):
        process, ready = _start_serve(assets, tmp_path, port, "--ctx", "2048")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0
        assert f"using the Ollama already at http://127.0.0.1:{port}; its server settings are its own" in stderr
        assert ready["engine_pid"] is None and ready["delta"]["verified"] is True
        assert ready["actual"]["context_length"] == 2048
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        assert client.list().models  # the server we did not start is still there, with the model
        client.close()


def test_ollama_is_never_exposed(assets: Assets) -> None:
    result = run_cli("serve", str(assets.gemma_gguf), "--engine", "ollama", "--host", "0.0.0.0")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: refusing to expose Ollama on 0.0.0.0: Ollama has no API keys",
        "hint: bind 127.0.0.1 and put `tierlocal gateway` (or a reverse proxy with auth) in front",
    ]


def test_an_ollama_tag_is_served_as_it_is_by_ollama_or_by_llama_server(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(tmp_path / "models"), "HOME": str(tmp_path / "home")}
    with running([str(assets.ollama), "serve"], tmp_path / "ollama.log", f"http://127.0.0.1:{port}/api/version", env=env):
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        client.create(model="gemma-test:small", files={assets.gemma_gguf.name: client.create_blob(assets.gemma_gguf)})  # a tag made by Ollama itself
        serve_env = {**_env(tmp_path), "OLLAMA_HOST": f"127.0.0.1:{port}"}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tierlocal",
                "serve",
                "ollama://gemma-test:small",
                "--engine",
                "ollama",
                "--port",
                str(port),
                "--ctx",
                "3072",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=serve_env,
            cwd=REPO_ROOT,
        )
        try:
            ready = first_json_document(process)
            assert ready["actual"]["ollama_model"] == "gemma-test:small" and ready["delta"]["verified"], ready["delta"]
            assert ready["actual"]["context_length"] == 3072  # the planned num_ctx, applied at load
            (loaded,) = client.ps().models
            assert loaded.model == "gemma-test:small" and loaded.context_length == 3072
            assert "tierlocal-" not in " ".join(model.model for model in client.list().models)  # nothing created
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)
        client.close()
    # The same tag's GGUF, planned and served by llama-server straight from Ollama's store.
    llama_port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tierlocal",
            "serve",
            "ollama://gemma-test:small",
            "--llama-server",
            str(assets.llama_server_cpu),
            "--port",
            str(llama_port),
            "--ctx",
            "2048",
            "--threads",
            ENGINE_THREADS,
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(tmp_path)},
        cwd=REPO_ROOT,
    )
    try:
        ready = first_json_document(process)
        assert ready["delta"]["verified"] and ready["actual"]["n_ctx"] == 2048
        assert "/blobs/sha256-" in ready["argv"][ready["argv"].index("-m") + 1]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    missing = run_cli("serve", "ollama://not-pulled:1b", "--engine", "ollama", env={"OLLAMA_MODELS": str(tmp_path / "models")})
    assert missing.returncode == 2
    assert "ollama://not-pulled:1b is not in Ollama's store" in missing.stderr and "tierlocal pull ollama://not-pulled:1b" in missing.stderr

"""`tierlocal pull ollama://TAG` with the real Ollama and a real registry on loopback.

A model created from the Gemma GGUF in one Ollama is pushed (`ollama push --insecure`) to
Debian's docker-registry, then pulled through tierlocal into a second Ollama with an empty
models directory. Ollama's puller insists that a blob GET redirects to another host (its
public registry sends it to a CDN), so the registry runs its `redirect` storage middleware
pointing at a static Range server on ``localhost`` over the registry's own storage."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.doc_json import assert_documented
from tests.support.engines import free_port, running
from tests.support.servers import ServerState, static_server

TAG = "library/gemma3:270m"


@dataclass(frozen=True)
class Registry:
    host: str
    cdn: ServerState


@dataclass(frozen=True)
class Ollama:
    host: str
    models: Path
    env: dict[str, str]


def _ollama(stack: ExitStack, assets: Assets, root: Path, name: str) -> Ollama:
    port = free_port()
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(root / name / "models"), "HOME": str(root / name / "home")}
    stack.enter_context(running([str(assets.ollama), "serve"], root / f"{name}.log", f"http://127.0.0.1:{port}/api/version", env=env))
    return Ollama(f"127.0.0.1:{port}", root / name / "models", env)


@pytest.fixture(scope="module")
def pushed(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path]]:
    """A registry holding gemma3:270m, pushed by a real Ollama; yields it and a scratch dir."""
    root = tmp_path_factory.mktemp("ollama-registry")
    storage = root / "storage"
    storage.mkdir()
    with ExitStack() as stack:
        cdn_url, cdn_state = stack.enter_context(static_server(storage))
        cdn_port = cdn_url.rsplit(":", 1)[1]
        port = free_port()
        config = root / "registry.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
            f"middleware:\n  storage:\n    - name: redirect\n      options:\n        baseurl: http://localhost:{cdn_port}/\n"
            f"http:\n  addr: 127.0.0.1:{port}\n  secret: tierlocal-test\n"
        )
        stack.enter_context(running([str(assets.registry), "serve", str(config)], root / "registry.log", f"http://127.0.0.1:{port}/v2/"))
        registry = Registry(f"127.0.0.1:{port}", cdn_state)
        source = _ollama(stack, assets, root, "source")
        (root / "Modelfile").write_text(f"FROM {assets.gemma_gguf}\n")
        name = f"{registry.host}/{TAG}"
        for argv in (["create", name, "-f", str(root / "Modelfile")], ["push", "--insecure", name]):
            done = subprocess.run(
                [str(assets.ollama), *argv], env={**source.env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300, check=False
            )
            assert done.returncode == 0, done.stderr[-2000:]
        yield registry, root


def test_pull_through_a_fresh_ollama_from_the_registry(assets: Assets, pushed: tuple[Registry, Path]) -> None:
    registry, root = pushed
    with ExitStack() as stack:
        target = _ollama(stack, assets, root, "target")
        sent_before = registry.cdn.total_sent
        result = run_cli("pull", f"ollama://{registry.host}/{TAG}", "--insecure", "--json", env={"OLLAMA_HOST": target.host}, timeout=300)
        listed = subprocess.run([str(assets.ollama), "list"], env={**target.env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert_documented("pull-ollama", payload)
    assert payload["model"] == f"{registry.host}/{TAG}"
    assert payload["host"] == f"http://{target.host}"
    assert f"{registry.host}/{TAG}" in listed.stdout
    # The model layer in the new models directory is the Gemma file, byte for byte.
    blob = target.models / "blobs" / f"sha256-{assets.gemma_sha256}"
    digest = hashlib.sha256()
    with blob.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == assets.gemma_sha256
    assert payload["bytes"] >= assets.gemma_gguf.stat().st_size
    # The bytes came from the registry's redirect target, once.
    assert registry.cdn.total_sent - sent_before >= assets.gemma_gguf.stat().st_size


def test_missing_tag_says_not_found_with_catalog_matches(assets: Assets, pushed: tuple[Registry, Path]) -> None:
    registry, root = pushed
    with ExitStack() as stack:
        target = _ollama(stack, assets, root, "target-missing")
        result = run_cli("pull", f"ollama://{registry.host}/library/gemma3:27m", "--insecure", env={"OLLAMA_HOST": target.host}, timeout=120)
    assert result.returncode == 2
    error, hint = result.stderr.splitlines()
    assert error == f'error: ollama://{registry.host}/library/gemma3:27m: model "{registry.host}/library/gemma3:27m" not found'
    # The catalog's Gemma 3 tags one character away come first (270m, 27b).
    assert hint.startswith("hint: close matches in the catalog: gemma3:270m, gemma3:27b")


def test_no_ollama_server_is_one_clear_line() -> None:
    port = free_port()
    result = run_cli("pull", "ollama://qwen3:8b", env={"OLLAMA_HOST": f"127.0.0.1:{port}"})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: ollama://qwen3:8b: no Ollama server answers at http://127.0.0.1:{port}",
        "hint: start one with `ollama serve`, or set OLLAMA_HOST to where it runs",
    ]

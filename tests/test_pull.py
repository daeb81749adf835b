"""`tierlocal pull hf://…` against a Hub stand-in on loopback that speaks the routes and
headers huggingface_hub uses (listing with ?blobs=true, resolve with redirects to a CDN host,
X-Linked-Size / X-Linked-Etag / X-Repo-Commit, Range), through the real huggingface_hub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.doc_json import assert_documented
from tests.support.servers import COMMIT, HubRepo, ServerState, fake_hub
from tierlocal.fetch.sources import read_headers
from tierlocal.gguf import summarize

REPO = "acme/gemma-3-270m-GGUF"
FILE = "gemma-3-270m-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory, assets: Assets) -> Path:
    """A repo with the Gemma file under its quantisation name, a Q8_0 name (same bytes), an
    mmproj file, and a 3-shard split of it made by llama.cpp's gguf-split."""
    root = tmp_path_factory.mktemp("repo")
    (root / FILE).symlink_to(assets.gemma_gguf)
    (root / "gemma-3-270m-Q8_0.gguf").symlink_to(assets.gemma_gguf)
    (root / "mmproj-Q4_K_M.gguf").symlink_to(assets.gemma_gguf)
    (root / "README.md").write_text("# test repo\n")
    (root / "split").mkdir()
    subprocess.run(
        [str(assets.llama_gguf_split), "--split", "--split-max-tensors", "100", str(assets.gemma_gguf), str(root / "split" / "gemma-3-270m-IQ2_M")],
        check=True,
        capture_output=True,
    )
    return root


def _env(endpoint: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_TOKEN": "", **extra}


def _cdn_bytes(state: ServerState) -> int:
    with state.lock:
        return sum(count for path, count in state.sent_bytes.items() if path.startswith("/cdn/"))


def test_pull_by_quant_into_a_directory_is_verified(assets: Assets, repo_dir: Path, tmp_path: Path) -> None:
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, state):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "q4_k_m", "--dir", str(tmp_path / "models"), "--json", env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert_documented("pull", payload)
    final = tmp_path / "models" / FILE
    assert payload["source"] == f"hf://{REPO}"
    assert payload["files"] == [
        {
            "path": str(final),
            "bytes": assets.gemma_gguf.stat().st_size,
            "sha256": assets.gemma_sha256,
            "fetched_bytes": assets.gemma_gguf.stat().st_size,
        }
    ]
    assert final.read_bytes() == assets.gemma_gguf.read_bytes()
    assert sorted(p.name for p in final.parent.iterdir()) == [FILE]  # no partial or sidecar left
    assert _cdn_bytes(state) == final.stat().st_size
    # A second run finds it complete and fetches nothing.
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, state):
        again = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "models"), "--json", env=_env(endpoint, tmp_path))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["files"][0]["fetched_bytes"] == 0
    assert _cdn_bytes(state) == 0


def test_pull_into_the_hub_cache_is_found_by_huggingface_hub(assets: Assets, repo_dir: Path, tmp_path: Path) -> None:
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, _):
        result = run_cli("pull", f"hf://{REPO}/{FILE}", "--json", env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    (pulled,) = json.loads(result.stdout)["files"]
    # huggingface_hub itself, offline, resolves the same file from its cache.
    cached = hf_hub_download(REPO, FILE, cache_dir=tmp_path / "hub", local_files_only=True)
    assert Path(cached) == Path(pulled["path"])
    assert Path(cached).resolve() == (tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / assets.gemma_sha256)
    assert (tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "refs" / "main").read_text() == COMMIT


def test_split_gguf_pulls_every_shard(assets: Assets, repo_dir: Path, tmp_path: Path) -> None:
    shards = sorted(p.name for p in (repo_dir / "split").iterdir())
    assert len(shards) == 3
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, _):
        # Naming the second shard pulls the whole set.
        result = run_cli("pull", f"hf://{REPO}/split/{shards[1]}", "--dir", str(tmp_path / "m"), "--json", env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    paths = [Path(f["path"]) for f in json.loads(result.stdout)["files"]]
    assert [p.name for p in paths] == shards
    for path in paths:
        assert path.read_bytes() == (repo_dir / "split" / path.name).read_bytes()
    # The pulled set reads as one model, like the original.
    assert (
        summarize(read_headers(str(paths[0]))).to_json()["tensor_count"] == summarize(read_headers(str(assets.gemma_gguf))).to_json()["tensor_count"]
    )


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ("Q5_K_M", "no GGUF file matches quantisation 'Q5_K_M'"),
        ("Q4_K", "no GGUF file matches quantisation 'Q4_K'"),
    ],
)
def test_missing_quant_lists_what_the_repo_has(repo_dir: Path, tmp_path: Path, quant: str, message: str) -> None:
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, _):
        result = run_cli("pull", f"hf://{REPO}", "--quant", quant, "--dir", str(tmp_path), env=_env(endpoint, tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: hf://{REPO}: {message}", "hint: the repo has: IQ2_M, Q4_K_M, Q8_0"]
    assert list(tmp_path.glob("*.gguf*")) == []


def test_ambiguous_quant_names_the_choices(repo_dir: Path, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "a-Q4_K_M.gguf").symlink_to(repo_dir / FILE)
    (served / "b-Q4_K_M.gguf").symlink_to(repo_dir / FILE)
    with fake_hub([HubRepo(REPO, served)]) as (endpoint, _):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", env=_env(endpoint, tmp_path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"error: hf://{REPO}: 'Q4_K_M' matches 2 different files: a-Q4_K_M.gguf, b-Q4_K_M.gguf"


def test_wrong_checksum_is_refused_and_nothing_is_left(assets: Assets, repo_dir: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO, repo_dir, declared_sha256={FILE: "0" * 64})
    with fake_hub([repo]) as (endpoint, _):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), env=_env(endpoint, tmp_path))
    assert result.returncode == 2
    error = result.stderr.splitlines()[-2]
    assert error.startswith(f"error: hf://{REPO}/{FILE}: checksum mismatch: sha256 {assets.gemma_sha256[:16]}… but the hub says 0000000000000000…")
    assert error.endswith("; the download was deleted")
    assert list((tmp_path / "m").iterdir()) == []


def test_dropped_connection_resumes_with_only_the_missing_bytes(repo_dir: Path, tmp_path: Path) -> None:
    size = (repo_dir / FILE).stat().st_size
    repo = HubRepo(REPO, repo_dir, drop_after={FILE: 100 * 1024 * 1024})
    with fake_hub([repo]) as (endpoint, state):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), "--json", env=_env(endpoint, tmp_path))
        cdn_requests = [headers.get("range") for method, path, headers in state.requests if path.startswith("/cdn/")]
    assert result.returncode == 0, result.stderr
    assert cdn_requests == [None, f"bytes={100 * 1024 * 1024}-"]
    assert _cdn_bytes(state) == size  # every byte sent once
    assert (tmp_path / "m" / FILE).read_bytes() == (repo_dir / FILE).read_bytes()


def _pull_process(endpoint: str, tmp_path: Path) -> subprocess.Popen[str]:
    """`tierlocal pull` as a terminal starts it: SIGINT at its default. (A pytest-xdist worker
    ignores SIGINT and a child inherits that; Python then installs no KeyboardInterrupt handler,
    and Ctrl-C would do nothing.)"""
    return subprocess.Popen(
        [sys.executable, "-m", "tierlocal", "pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_env(endpoint, tmp_path)},
        cwd=REPO_ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_partial(partial: Path, at_least: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and partial.stat().st_size >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"no partial download grew to {at_least} bytes")


def test_kill_9_then_rerun_fetches_only_the_rest(repo_dir: Path, tmp_path: Path) -> None:
    size = (repo_dir / FILE).stat().st_size
    final = tmp_path / "m" / FILE
    partial = final.with_name(FILE + ".partial")
    repo = HubRepo(REPO, repo_dir, chunk_delay_s=0.01)
    with fake_hub([repo]) as (endpoint, state):
        process = _pull_process(endpoint, tmp_path)
        _wait_for_partial(partial, 20 * 1024 * 1024, process)
        process.kill()
        process.communicate()
        assert not final.exists()
        kept = partial.stat().st_size
        assert 0 < kept < size
        # The server's handler for the dead connection may still push a chunk or two into
        # its socket before it notices; count from when it has stopped.
        sent_before = _cdn_bytes(state)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if _cdn_bytes(state) == sent_before:
                break
            sent_before = _cdn_bytes(state)
        requests_before = len(state.requests)
        repo.chunk_delay_s = 0.0
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), "--json", env=_env(endpoint, tmp_path))
        assert result.returncode == 0, result.stderr
        rerun_ranges = [headers.get("range") for _, path, headers in state.requests[requests_before:] if path.startswith("/cdn/")]
        assert rerun_ranges == [f"bytes={kept}-"]
        assert _cdn_bytes(state) - sent_before == size - kept
    assert json.loads(result.stdout)["files"][0]["fetched_bytes"] == size - kept
    assert final.read_bytes() == (repo_dir / FILE).read_bytes()
    assert not partial.exists()


def test_ctrl_c_keeps_the_partial_and_says_how_to_resume(repo_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "m" / (FILE + ".partial")
    with fake_hub([HubRepo(REPO, repo_dir, chunk_delay_s=0.01)]) as (endpoint, _):
        process = _pull_process(endpoint, tmp_path)
        try:
            _wait_for_partial(partial, 5 * 1024 * 1024, process)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)  # seconds alone; a loaded CI machine once took more than 30
        finally:
            if process.poll() is None:  # never leave it running: its Popen would warn in a later test
                process.kill()
                process.communicate()
    assert process.returncode == 130
    assert stderr.splitlines()[-2].startswith("error: interrupted; ")
    assert f"kept in {partial}" in stderr
    assert stderr.splitlines()[-1] == "hint: run the same command again to resume"
    assert partial.stat().st_size > 0
    assert not (tmp_path / "m" / FILE).exists()


def test_full_disk_is_refused_before_any_byte(repo_dir: Path, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    huge = served / "huge-Q4_K_M.gguf"
    with huge.open("wb") as handle:
        handle.truncate(8 * 1024**4)  # 8 TiB, sparse: more than this disk has free
    repo = HubRepo(REPO, served, declared_sha256={huge.name: "1" * 64})
    with fake_hub([repo]) as (endpoint, state):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), env=_env(endpoint, tmp_path))
    assert result.returncode == 1
    first, hint = result.stderr.splitlines()
    assert first.startswith("error: not enough disk: ") and "the download needs 8.0 TiB more and 1.0 GiB kept free" in first
    assert hint == "hint: free some space, pull to a larger disk with --dir DIR, or lower --keep-free"
    assert _cdn_bytes(state) == 0
    assert not (tmp_path / "m").exists()


def test_private_repo_needs_the_token_and_the_cdn_never_sees_it(repo_dir: Path, tmp_path: Path) -> None:
    token = "hf_private_token_for_tests_123"
    repo = HubRepo(REPO, repo_dir, private=True, token=token)
    with fake_hub([repo]) as (endpoint, state):
        refused = run_cli("pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), env=_env(endpoint, tmp_path))
        allowed = run_cli(
            "pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m"), "--json", env=_env(endpoint, tmp_path, HF_TOKEN=token)
        )
        cdn_auth = [headers.get("authorization") for _, path, headers in state.requests if path.startswith("/cdn/")]
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"error: hf://{REPO}: repository not found, or private and no valid token was sent (HTTP 401)",
        "hint: check OWNER/REPO; for a private repo set HF_TOKEN or run `hf auth login`",
    ]
    assert allowed.returncode == 0, allowed.stderr
    assert cdn_auth and all(value is None for value in cdn_auth)
    assert token not in allowed.stdout + allowed.stderr + refused.stderr


def test_no_source_pulls_what_check_recommends(repo_dir: Path, tmp_path: Path) -> None:
    checked = run_cli("check", "--gpu", "24GiB", "--json")
    assert checked.returncode == 0, checked.stderr
    best = json.loads(checked.stdout)["recommendation"]
    served = tmp_path / "served"
    served.mkdir()
    # The recommended repo, served with a file under the recommended quantisation's name.
    name = f"{best['model']}-{best['quant']}.gguf"
    (served / name).symlink_to(repo_dir / FILE)
    with fake_hub([HubRepo(best["gguf_repo"], served)]) as (endpoint, _):
        result = run_cli("pull", "--gpu", "24GiB", "--dir", str(tmp_path / "m"), env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    said = result.stderr.splitlines()
    assert said[0].startswith(f"pulling {best['model']} {best['quant']}: recommended for ")
    assert said[1].startswith(f"hf://{best['gguf_repo']}: {name} (")
    assert (tmp_path / "m" / name).is_file()


def test_serve_a_catalog_name_takes_what_check_recommends(repo_dir: Path, tmp_path: Path) -> None:
    """`serve NAME` resolves a catalog name to the quantisation `check NAME` recommends for the
    machine, and without --pull says it is not downloaded yet."""
    checked = run_cli("check", "llama-3.1-8b", "--gpu", "8GiB", "--json")
    assert checked.returncode == 0, checked.stderr
    best = json.loads(checked.stdout)["recommendation"]
    served = tmp_path / "served"
    served.mkdir()
    (served / f"{best['model']}-{best['quant']}.gguf").symlink_to(repo_dir / FILE)
    with fake_hub([HubRepo(best["gguf_repo"], served)]) as (endpoint, state):
        result = run_cli("serve", "llama-3.1-8b", "--gpu", "8GiB", env=_env(endpoint, tmp_path))
        assert state.requests == []  # said from the local cache alone: the hub was not asked
        pulled = run_cli("pull", "llama-3.1-8b", "--gpu", "8GiB", env=_env(endpoint, tmp_path))
        assert pulled.returncode == 0, pulled.stderr
    assert result.returncode == 2, result.stderr
    assert f"llama-3.1-8b: {best['model']} {best['quant']}: recommended for this machine" in result.stderr
    assert result.stderr.splitlines()[-2:] == [
        "error: llama-3.1-8b: not downloaded yet",
        "hint: add --pull, or run `tierlocal pull llama-3.1-8b` first",
    ]
    # Downloaded: found in the hub cache with the hub gone and offline mode on. The model
    # resolved, so what stops serve is the next thing it needs (no llama-server in this test).
    offline = run_cli("serve", "llama-3.1-8b", "--gpu", "8GiB", env=_env(endpoint, tmp_path, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 2 and offline.stderr.splitlines()[-2].startswith("error: no llama-server found"), offline.stderr
    # Not downloaded, --pull, offline: one line that says why, no traceback.
    elsewhere = run_cli("serve", "llama-3.1-8b", "--gpu", "8GiB", "--pull", env=_env(endpoint, tmp_path / "other", HF_HUB_OFFLINE="1"))
    assert (elsewhere.returncode, elsewhere.stderr.splitlines()[-2:]) == (
        2,
        [
            f"error: hf://{best['gguf_repo']}: HF_HUB_OFFLINE is set, and this needs the hub",
            "hint: unset HF_HUB_OFFLINE to reach the hub, or give a local GGUF file",
        ],
    )


def test_progress_bar_on_a_terminal_only(repo_dir: Path, tmp_path: Path) -> None:
    """On a TTY stderr shows rich's bar (bytes, rate, ETA); piped (above) it stays quiet."""
    import pty

    size = (repo_dir / FILE).stat().st_size
    with fake_hub([HubRepo(REPO, repo_dir, chunk_delay_s=0.001)]) as (endpoint, _):
        primary, secondary = pty.openpty()
        process = subprocess.Popen(
            [sys.executable, "-m", "tierlocal", "pull", f"hf://{REPO}", "--quant", "Q4_K_M", "--dir", str(tmp_path / "m")],
            stdout=subprocess.PIPE,
            stderr=secondary,
            env={**os.environ, **_env(endpoint, tmp_path), "TERM": "xterm-256color", "COLUMNS": "120"},
            cwd=REPO_ROOT,
        )
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(primary)
        stdout, _ = process.communicate(timeout=60)
    screen = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, screen[-2000:]
    assert "downloading" in screen
    assert f"{size / 1e6:.1f}/{size / 1e6:.1f} MB" in screen  # rich's DownloadColumn, decimal units
    assert "MB/s" in screen
    assert stdout.decode().startswith(str(tmp_path / "m" / FILE))


def test_piped_json_run_writes_nothing_to_stderr(repo_dir: Path, tmp_path: Path) -> None:
    with fake_hub([HubRepo(REPO, repo_dir)]) as (endpoint, _):
        result = run_cli("pull", f"hf://{REPO}", "--quant", "Q8_0", "--dir", str(tmp_path / "m"), "--json", env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert [Path(f["path"]).name for f in json.loads(result.stdout)["files"]] == ["gemma-3-270m-Q8_0.gguf"]

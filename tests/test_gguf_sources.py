"""Reading headers from a local file, a real HTTP server (Range) and a local Hugging Face Hub
stand-in through the real huggingface_hub client; split models read as one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.servers import COMMIT, HubRepo, fake_hub, static_server
from tierlocal.errors import SourceError, UsageError
from tierlocal.fetch.sources import parse_source, read_headers, shard_names
from tierlocal.gguf import summarize
from tierlocal.gguf.parse import ArraySummary


def _inspect_json(source: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = run_cli("inspect", source, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _without_sources(payload: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in payload.items() if key != "sources"}


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory: pytest.TempPathFactory, assets: Assets) -> Path:
    """A directory with the Gemma file and a 3-shard split of it made by llama.cpp's gguf-split."""
    root = tmp_path_factory.mktemp("served")
    (root / "gemma.gguf").symlink_to(assets.gemma_gguf)
    split_dir = root / "split"
    split_dir.mkdir()
    subprocess.run(
        [str(assets.llama_gguf_split), "--split", "--split-max-tensors", "100", str(assets.gemma_gguf), str(split_dir / "gemma")],
        check=True,
        capture_output=True,
    )
    return root


def test_inspect_is_the_same_local_over_http_and_over_the_hub(served_dir: Path) -> None:
    local = _inspect_json(str(served_dir / "gemma.gguf"))
    with static_server(served_dir) as (url, _):
        over_http = _inspect_json(f"{url}/gemma.gguf")
    with fake_hub([HubRepo("google/gemma-test", served_dir)]) as (endpoint, _):
        over_hub = _inspect_json("hf://google/gemma-test/gemma.gguf", env={"HF_ENDPOINT": endpoint})
    assert _without_sources(local) == _without_sources(over_http) == _without_sources(over_hub)
    assert over_http["sources"] == [f"{url}/gemma.gguf"]
    assert over_hub["sources"] == ["hf://google/gemma-test/gemma.gguf"]
    assert local["params"] == 268_098_176


def test_http_fetches_under_twice_the_header(served_dir: Path) -> None:
    with static_server(served_dir) as (url, state):
        headers = read_headers(f"{url}/gemma.gguf")
        sent = state.total_sent
    header_bytes = headers[0].header_bytes
    assert header_bytes == 6_525_112
    # Gemma 3's scores and token types (262,144 floats and ints) are passed over unread.
    skipped = sum(v.byte_length for v in headers[0].metadata.values() if isinstance(v, ArraySummary) and v.element_type != "STRING")
    assert skipped == 2 * 262_144 * 4
    assert header_bytes - skipped <= sent <= 2 * header_bytes
    assert all("range" in request_headers for _, _, request_headers in state.requests)


def test_hub_fetches_under_twice_the_header_and_keeps_the_token_on_the_hub(served_dir: Path) -> None:
    repo = HubRepo("acme/private-gemma", served_dir, private=True, token="hf_secret_token_123")
    with fake_hub([repo]) as (endpoint, state):
        result = run_cli(
            "inspect", f"hf://acme/private-gemma/gemma.gguf@{COMMIT}", "--json", env={"HF_ENDPOINT": endpoint, "HF_TOKEN": repo.token or ""}
        )
        sent = state.total_sent
        requests = list(state.requests)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["header_bytes"] - 2 * 262_144 * 4 <= sent <= 2 * payload["header_bytes"]
    cdn_requests = [headers for _, path, headers in requests if path.startswith("/cdn/")]
    hub_requests = [headers for _, path, headers in requests if "/resolve/" in path]
    assert cdn_requests and hub_requests
    assert all(headers.get("authorization") == f"Bearer {repo.token}" for headers in hub_requests)
    assert not any("authorization" in headers for headers in cdn_requests), "the token must not leave the hub"


def test_private_repo_without_token_says_so(served_dir: Path) -> None:
    repo = HubRepo("acme/private-gemma", served_dir, private=True, token="hf_secret_token_123")
    with fake_hub([repo]) as (endpoint, _):
        result = run_cli("inspect", "hf://acme/private-gemma/gemma.gguf", env={"HF_ENDPOINT": endpoint})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: hf://acme/private-gemma/gemma.gguf: repository not found, or private and no valid token was sent (HTTP 401)",
        "hint: check OWNER/REPO; for a private repo set HF_TOKEN or run `hf auth login`",
    ]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("hf://google/gemma-test/missing.gguf", "file not found in the repo"),
        ("hf://google/gemma-test/gemma.gguf@v9", "revision 'v9' not found"),
    ],
)
def test_hub_errors_are_one_line(served_dir: Path, source: str, message: str) -> None:
    with fake_hub([HubRepo("google/gemma-test", served_dir)]) as (endpoint, _):
        result = run_cli("inspect", source, env={"HF_ENDPOINT": endpoint})
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {source}: {message}\nhint: ")
    assert "Traceback" not in result.stderr


def test_server_without_range_support_is_refused(served_dir: Path) -> None:
    with static_server(served_dir, ranges=False) as (url, _), pytest.raises(SourceError, match="does not support Range requests"):
        read_headers(f"{url}/gemma.gguf")


def test_missing_url_is_a_clear_error(served_dir: Path) -> None:
    with static_server(served_dir) as (url, _):
        result = run_cli("inspect", f"{url}/nope.gguf")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"error: {url}/nope.gguf: not found (HTTP 404)"


def test_split_model_reads_every_shard_as_one_model(served_dir: Path) -> None:
    shards = sorted((served_dir / "split").glob("*.gguf"))
    assert [shard.name for shard in shards] == [f"gemma-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = summarize(read_headers(str(served_dir / "gemma.gguf")))
    # Any shard names the model; every shard's header is read.
    split_local = summarize(read_headers(str(shards[1])))
    with static_server(served_dir) as (url, _):
        split_http = summarize(read_headers(f"{url}/split/{shards[0].name}"))
    for split in (split_local, split_http):
        assert len(split.sources) == 3
        assert (split.params, split.tensor_count, split.tensor_bytes) == (whole.params, whole.tensor_count, whole.tensor_bytes)
        assert split.architecture == "gemma3"
        assert split.file_bytes == sum(shard.stat().st_size for shard in shards)


def test_a_missing_shard_is_named(served_dir: Path, tmp_path: Path) -> None:
    for shard in sorted((served_dir / "split").glob("*.gguf"))[:2]:
        (tmp_path / shard.name).symlink_to(shard)
    result = run_cli("inspect", str(tmp_path / "gemma-00001-of-00003.gguf"))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"error: {tmp_path / 'gemma-00003-of-00003.gguf'}: no such file"


def test_local_errors_are_one_line(tmp_path: Path) -> None:
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_bytes(b"hello, this is not a model" * 10)
    result = run_cli("inspect", str(not_gguf))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"error: {not_gguf}: at byte 0: not a GGUF file (wrong magic bytes)"
    result = run_cli("inspect", str(tmp_path / "absent.gguf"))
    assert (result.returncode, result.stderr.splitlines()[0]) == (2, f"error: {tmp_path / 'absent.gguf'}: no such file")
    result = run_cli("inspect", str(tmp_path))
    assert (result.returncode, result.stderr.splitlines()[0]) == (2, f"error: {tmp_path}: is a directory")


def test_source_specs() -> None:
    spec = parse_source("hf://owner/repo/sub/dir/model-Q4_K_M.gguf@v1.0")
    assert (spec.kind, spec.repo_id, spec.location, spec.revision) == ("hf", "owner/repo", "sub/dir/model-Q4_K_M.gguf", "v1.0")
    assert parse_source("https://example.org/m.gguf").kind == "http"
    assert parse_source("./m.gguf").kind == "local"
    with pytest.raises(UsageError, match="as a Hugging Face GGUF file") as caught:
        parse_source("hf://owner/repo")
    assert caught.value.hint is not None and caught.value.hint.startswith("write hf://OWNER/REPO/FILE.gguf")
    assert shard_names("a/m-00002-of-00003.gguf") == ["a/m-00001-of-00003.gguf", "a/m-00002-of-00003.gguf", "a/m-00003-of-00003.gguf"]
    assert shard_names("m.gguf") == ["m.gguf"]


def test_token_never_appears_in_errors(served_dir: Path) -> None:
    token = "hf_do_not_print_me_987"
    with fake_hub([HubRepo("acme/private-gemma", served_dir, private=True, token="other")]) as (endpoint, _):
        result = run_cli(
            "inspect", "hf://acme/private-gemma/gemma.gguf", "--json", env={"HF_ENDPOINT": endpoint, "HF_TOKEN": token, "TIERLOCAL_DEBUG": "1"}
        )
    assert result.returncode == 2
    assert token not in result.stdout + result.stderr

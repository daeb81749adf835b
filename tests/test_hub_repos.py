"""Any model on the Hub: `check hf://OWNER/REPO` and `search`, against a hub on loopback that speaks
the Hub's API (listing with siblings and LFS sizes, resolve with ranges, search, gated and private
repositories, 429 with Retry-After) and holds 25 repositories of the layouts the big GGUF
publishers use (tests/support/hub_repos.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import REPO_ROOT, run_cli
from tests.support.doc_json import assert_documented
from tests.support.hub_repos import LAYOUTS, PRIVATE_TOKEN, hub_repos
from tests.support.servers import HubRepo, ServerState, fake_hub
from tierlocal.errors import HeaderError
from tierlocal.fetch.hub import RepoFile, RepoListing
from tierlocal.fetch.repo_read import ArrayBytes, repo_quants
from tierlocal.fetch.sources import LocalFileReader
from tierlocal.gguf.parse import ArraySummary, ends_at_its_data, parse_header

_MACHINE = ("--gpu", "RTX 4090", "--ram", "64GiB")


def _test_cache() -> Path:
    return Path(os.environ.get("TIERLOCAL_TEST_CACHE") or Path.home() / ".cache" / "tierlocal-test")


@pytest.fixture(scope="module")
def repos() -> list[HubRepo]:
    return hub_repos(_test_cache())


@pytest.fixture(scope="module")
def hub(repos: list[HubRepo]) -> Iterator[tuple[str, ServerState]]:
    with fake_hub(repos) as served:
        yield served


def _env(endpoint: str, cache: Path, **more: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "XDG_CACHE_HOME": str(cache), **more}


def _check(endpoint: str, cache: Path, repo: str, *args: str) -> dict[str, Any]:
    result = run_cli("check", f"hf://{repo}", *args, "--json", env=_env(endpoint, cache))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _file_bytes_sent(state: ServerState) -> int:
    """Body bytes the hub's CDN sent (the files' own bytes, not the API's JSON)."""
    with state.lock:
        return sum(count for path, count in state.sent_bytes.items() if path.startswith("/cdn/"))


def test_the_loopback_hub_holds_twenty_repositories_of_real_layouts(repos: list[HubRepo]) -> None:
    publishers = {r.repo_id.split("/")[0] for r in repos}
    files = [p for r in repos for p in r.directory.rglob("*.gguf")]
    assert len(repos) >= 20
    assert {"unsloth", "bartowski", "lmstudio-community", "ggml-org", "Qwen", "mradermacher"} <= publishers
    assert sum(1 for p in files if "-00001-of-" in p.name) >= 6, "split quantisations"
    assert sum(1 for p in files if "mmproj" in p.name) >= 3, "projectors"
    assert any(p.parent.name == "Q8_0" for p in files), "unsloth's folder per split quantisation"
    # Real sizes: the 70B Q8_0 is some 75 GB over its shards, stored as holes.
    llama = [p for p in files if "Llama-3.3-70B-Instruct-Q8_0-0000" in p.name and "unsloth" in str(p)]
    assert 70e9 < sum(p.stat().st_size for p in llama) < 80e9
    assert sum(p.stat().st_blocks * 512 for p in llama) < 50e6


def test_a_repository_ranks_every_quantisation_reading_only_headers(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, state = hub
    before = _file_bytes_sent(state)
    payload = _check(endpoint, tmp_path, "unsloth/Llama-3.3-70B-Instruct-GGUF", *_MACHINE)
    assert_documented("check-repo", payload)
    sent = _file_bytes_sent(state) - before
    candidates = payload["candidates"]
    assert isinstance(candidates, list)
    assert sorted({c["quant"] for c in candidates}) == ["Q4_K_M", "Q6_K", "Q8_0"]
    q8 = next(c for c in candidates if c["quant"] == "Q8_0")
    assert q8["files"] == [f"Llama-3.3-70B-Instruct-Q8_0/Llama-3.3-70B-Instruct-Q8_0-0000{i}-of-00002.gguf" for i in (1, 2)]
    # Headers only: what the hub sent is what the parser read, a ten-thousandth of the files.
    assert sent == payload["header_bytes_read"]
    # The smallest is read whole; the others pass over the vocabulary it holds.
    read = {c["quant"]: c["header_bytes_read"] for c in candidates}
    assert read["Q6_K"] < read["Q4_K_M"] / 2 and read["Q8_0"] < read["Q4_K_M"] / 2
    assert 0 < sent < payload["file_bytes"] / 10_000
    assert payload["from_cache"] is False


def test_a_second_run_reads_nothing(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, state = hub
    first = _check(endpoint, tmp_path, "bartowski/Qwen_Qwen3-14B-GGUF", *_MACHINE)
    requests_before, bytes_before = len(state.requests), _file_bytes_sent(state)
    second = _check(endpoint, tmp_path, "bartowski/Qwen_Qwen3-14B-GGUF", *_MACHINE)
    with state.lock:
        asked = [path for _method, path, _headers in state.requests[requests_before:]]
    assert first["header_bytes_read"] > 0
    assert second["header_bytes_read"] == 0 and second["from_cache"] is True
    assert _file_bytes_sent(state) == bytes_before
    assert all(path.startswith("/api/models/") for path in asked), asked  # the listing only: no resolve, no CDN

    def plans(payload: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "header_bytes_read"} for c in payload["candidates"]]

    assert plans(first) == plans(second)


def test_the_plan_from_the_hub_is_the_catalog_plan_of_the_same_file(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    """The repo's files carry the catalog's headers: the same plan, speed and score by both roads."""
    endpoint, _ = hub
    payload = _check(endpoint, tmp_path, "unsloth/Qwen3-8B-GGUF", *_MACHINE)
    catalog = json.loads(run_cli("check", "qwen3-8b", *_MACHINE, "--json").stdout)
    assert payload["inherits_from"] == "qwen3-8b"
    for ours in payload["candidates"]:
        theirs = next(c for c in catalog["candidates"] if c["quant"] == ours["quant"] and c["mode"] == ours["mode"])
        for key in ("total_needed_bytes", "weights_bytes", "kv_bytes", "est_decode_tokens_per_s", "status"):
            assert ours[key] == theirs[key], (ours["quant"], key)
        assert ours["quality"]["score"] == theirs["quality"]["score"]
        assert ours["quality_inherited"] is True


def test_a_base_model_outside_the_catalog_is_said_and_ranked_by_size(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    payload = _check(endpoint, tmp_path, "example-lab/Qwen3-8B-abliterated-GGUF", *_MACHINE)
    assert payload["inherits_from"] is None and payload["base_models"] == ["example-lab/Qwen3-8B-abliterated"]
    assert all(c["quality"] is None and c["quality_inherited"] is False for c in payload["candidates"])
    human = run_cli("check", "hf://example-lab/Qwen3-8B-abliterated-GGUF", *_MACHINE, env=_env(endpoint, tmp_path)).stdout
    assert "not in the catalog: no quality figures" in " ".join(human.split())


def test_projectors_and_incomplete_splits_are_named_not_ranked(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    gemma = _check(endpoint, tmp_path, "unsloth/gemma-3-12b-it-GGUF", "--ram", "32GiB")
    assert [p["files"] for p in gemma["projectors"]] == [["mmproj-F16.gguf"]]
    assert all("mmproj" not in f for c in gemma["candidates"] for f in c["files"])
    qwen = _check(endpoint, tmp_path, "bartowski/Qwen_Qwen3-32B-GGUF", "--ram", "64GiB")
    assert [q["quant"] for q in qwen["incomplete"]] == ["Q8_0"]
    assert {c["quant"] for c in qwen["candidates"]} == {"Q4_K_M", "Q6_K"}
    human = " ".join(run_cli("check", "hf://bartowski/Qwen_Qwen3-32B-GGUF", "--ram", "64GiB", env=_env(endpoint, tmp_path)).stdout.split())
    assert "Incomplete Q8_0: only 1 of its shards are in the repo; left out." in human


def test_every_readable_repository_ranks_all_its_quantisations(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    for layout in LAYOUTS:
        if layout.gated or layout.private:
            continue
        payload = _check(endpoint, tmp_path, layout.repo_id, "--ram", "64GiB")
        incomplete = {q["quant"] for q in payload["incomplete"]}
        ranked = {c["quant"] for c in payload["candidates"]}
        prefix = "i1-" if ".i1-" in layout.path else ""
        assert ranked | incomplete == {prefix + q.replace("MXFP4_MOE", "MXFP4") for q in layout.quants}, layout.repo_id
        assert payload["unreadable"] == [], layout.repo_id


def test_quantisation_labels_follow_the_publishers_names() -> None:
    def listing(*paths: str) -> RepoListing:
        return RepoListing("a/b", "c", tuple(RepoFile(p, 1000 + i, None) for i, p in enumerate(paths)))

    labels = {
        q.label: q
        for q in repo_quants(
            listing(
                "Qwen3-0.6B-UD-Q4_K_XL.gguf",
                "Qwen3-0.6B-Q4_K_M.gguf",
                "Mistral-Nemo-Instruct-2407.i1-Q6_K.gguf",
                "qwen2.5-7b-instruct-q8_0-00001-of-00002.gguf",
                "qwen2.5-7b-instruct-q8_0-00002-of-00002.gguf",
                "BF16/Model-BF16-00001-of-00003.gguf",
                "BF16/Model-BF16-00003-of-00003.gguf",
                "mmproj-F16.gguf",
                "README-notes.gguf",
            )
        )
    }
    assert set(labels) == {"UD-Q4_K_XL", "Q4_K_M", "i1-Q6_K", "Q8_0", "BF16", "F16", "README-notes"}
    assert len(labels["Q8_0"].files) == 2 and labels["Q8_0"].complete
    assert not labels["BF16"].complete
    assert labels["F16"].projector and not labels["Q4_K_M"].projector


@pytest.mark.parametrize(
    ("repo", "env", "message"),
    [
        ("google/gemma-3-1b-it-qat-q4_0-gguf", {}, "hf://google/gemma-3-1b-it-qat-q4_0-gguf: the repo is gated"),
        ("acme/private-Qwen3-1.7B-GGUF", {}, "hf://acme/private-Qwen3-1.7B-GGUF: repository not found, or private and no valid token was sent"),
        ("nobody/nothing-GGUF", {}, "hf://nobody/nothing-GGUF: repository not found"),
        ("unsloth/Qwen3-8B-GGUF@v9", {}, "hf://unsloth/Qwen3-8B-GGUF@v9: revision 'v9' not found"),
        ("unsloth/Qwen3-8B-GGUF", {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set, and this needs the hub"),
    ],
)
def test_hub_errors_are_one_line(hub: tuple[str, ServerState], tmp_path: Path, repo: str, env: dict[str, str], message: str) -> None:
    endpoint, _ = hub
    result = run_cli("check", f"hf://{repo}", *_MACHINE, env=_env(endpoint, tmp_path, **env))
    assert result.returncode == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and message in lines[0] and lines[1].startswith("hint: "), result.stderr


def test_a_token_opens_private_and_gated_repositories_and_never_shows(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    for repo in ("acme/private-Qwen3-1.7B-GGUF", "google/gemma-3-1b-it-qat-q4_0-gguf"):
        result = run_cli("check", f"hf://{repo}", *_MACHINE, "--json", env=_env(endpoint, tmp_path, HF_TOKEN=PRIVATE_TOKEN))
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["candidates"]
        assert PRIVATE_TOKEN not in result.stdout + result.stderr


def test_a_rate_limit_is_one_line_with_the_wait(repos: list[HubRepo], tmp_path: Path) -> None:
    with fake_hub(repos, limit_after=1, retry_after_s=120) as (endpoint, _):
        result = run_cli("check", "hf://unsloth/Qwen3-8B-GGUF", *_MACHINE, env=_env(endpoint, tmp_path))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0] == "error: hf://unsloth/Qwen3-8B-GGUF: the hub is rate-limiting these requests (HTTP 429; it asks to wait 120 s)"
    assert lines[1].startswith("hint: try again later")


def test_ctx_max_needs_one_file(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    result = run_cli("check", "hf://unsloth/Qwen3-8B-GGUF", "--ctx", "max", env=_env(endpoint, tmp_path))
    assert result.returncode == 2 and "hf://OWNER/REPO/FILE.gguf" in result.stderr


def test_search_plans_every_repository_it_finds(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    env = _env(endpoint, tmp_path)
    cold = run_cli("search", "gguf", *_MACHINE, "--limit", "30", "--json", env=env)
    assert cold.returncode == 0, cold.stderr
    warm = run_cli("search", "gguf", *_MACHINE, "--limit", "30", "--json", env=env)
    payload = json.loads(warm.stdout)
    assert_documented("search", payload)
    results = payload["results"]
    public = [layout for layout in LAYOUTS if not layout.private]
    # The hub's order (downloads), every public repository found; the gated one is skipped with why.
    assert [r["repo"] for r in results] == [layout.repo_id for layout in sorted(public, key=lambda layout: -layout.downloads) if not layout.gated]
    assert [s["repo"] for s in payload["skipped"]] == ["google/gemma-3-1b-it-qat-q4_0-gguf"]
    assert "gated" in payload["skipped"][0]["why"]
    assert len(results) >= 20 and all(r["candidate"] is not None for r in results)
    assert all(r["header_bytes_read"] == 0 for r in results)  # the second search read no header
    # A generous bound for a shared CI machine; bench/hub_search.py prints the figure.
    assert payload["seconds"] < 6
    inherited = {r["repo"]: r["quality_inherited"] for r in results}
    assert inherited["unsloth/Qwen3-8B-GGUF"] is True and inherited["example-lab/Qwen3-8B-abliterated-GGUF"] is False
    best = next(r for r in results if r["repo"] == payload["best"])
    assert best["candidate"]["status"] == "best"
    human = " ".join(run_cli("search", "qwen3", *_MACHINE, env=env).stdout.split())
    assert "Best here: hf://" in human and "†" in human


def test_search_errors_are_one_line(repos: list[HubRepo], tmp_path: Path) -> None:
    with fake_hub(repos, limit_after=0, retry_after_s=1) as (endpoint, _):
        result = run_cli("search", "qwen", env=_env(endpoint, tmp_path), timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "error: hub search 'qwen': the hub is rate-limiting these requests (HTTP 429; it asks to wait 1 s)"
    with fake_hub(repos) as (endpoint, _):
        offline = run_cli("search", "qwen", env=_env(endpoint, tmp_path, HF_HUB_OFFLINE="1"))
        nothing = run_cli("search", "no-such-model-anywhere", env=_env(endpoint, tmp_path))
    assert offline.returncode == 2 and "HF_HUB_OFFLINE is set" in offline.stderr.splitlines()[0]
    assert nothing.returncode == 0 and "No GGUF repository on the hub matches" in nothing.stdout


class _Counting:
    """A reader that counts the bytes asked of it."""

    def __init__(self, reader: LocalFileReader) -> None:
        self.reader, self.name, self.size, self.bytes_read = reader, reader.name, reader.size, 0

    def read(self, offset: int, length: int) -> bytes:
        data = self.reader.read(offset, length)
        self.bytes_read += len(data)
        return data


def test_a_file_passes_over_a_vocabulary_another_file_held(repos: list[HubRepo]) -> None:
    """Another quantisation of the model, or another model of its family (Qwen3-14B from another
    publisher), passes over the Qwen3 vocabulary by the byte length the first file gave it: the
    same header, a fraction of the reads; a wrong length is caught (the parse fails, or the header
    does not end at its data) and repo_read then reads the file in full."""
    directory = {r.repo_id: r.directory for r in repos}
    known = ArrayBytes()
    known.learn(parse_header(LocalFileReader(directory["unsloth/Qwen3-8B-GGUF"] / "Qwen3-8B-Q4_K_M.gguf")))
    for path in (directory["unsloth/Qwen3-8B-GGUF"] / "Qwen3-8B-Q8_0.gguf", directory["bartowski/Qwen_Qwen3-14B-GGUF"] / "Qwen_Qwen3-14B-Q6_K.gguf"):
        counting = _Counting(LocalFileReader(path))
        passed = parse_header(counting, known_bytes=known)
        assert passed == parse_header(LocalFileReader(path))  # the same header, tensor types included
        assert ends_at_its_data(passed)
        assert counting.bytes_read < passed.header_bytes / 3

    def wrong(key: str, element_type: str, length: int) -> int | None:
        right = known(key, element_type, length)
        return right + 1 if right else None  # one byte more than the vocabulary takes

    try:
        misread = parse_header(LocalFileReader(directory["unsloth/Qwen3-8B-GGUF"] / "Qwen3-8B-Q8_0.gguf"), known_bytes=wrong)
    except HeaderError:
        return
    assert not ends_at_its_data(misread)


def test_serve_takes_a_repository_at_its_best_quantisation_or_the_one_given(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    endpoint, _ = hub
    env = _env(endpoint, tmp_path, HF_HUB_CACHE=str(tmp_path / "hf"))
    ranked = _check(endpoint, tmp_path, "unsloth/Qwen3-8B-GGUF", "--gpu", "RTX 4090")
    chosen = run_cli("serve", "hf://unsloth/Qwen3-8B-GGUF", "--gpu", "RTX 4090", env=env)
    given = run_cli("serve", "hf://unsloth/Qwen3-8B-GGUF", "--quant", "Q4_K_M", env=env)
    best = ranked["recommendation"]["quant"]
    assert chosen.returncode == given.returncode == 2
    assert f"hf://unsloth/Qwen3-8B-GGUF: {best}, " in chosen.stderr
    assert chosen.stderr.splitlines()[-2:] == [
        "error: hf://unsloth/Qwen3-8B-GGUF: not downloaded yet",
        f"hint: add --pull, or run `tierlocal pull hf://unsloth/Qwen3-8B-GGUF --quant {best}` first",
    ]
    assert given.stderr.splitlines()[-1] == "hint: add --pull, or run `tierlocal pull hf://unsloth/Qwen3-8B-GGUF --quant Q4_K_M` first"


def test_a_publishers_label_takes_the_loss_of_the_type_its_header_names(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    """unsloth's UD-Q4_K_XL here carries Q4_K_M's header (general.file_type Q4_K_M): it is scored
    as that, not as a file without loss."""
    endpoint, _ = hub
    payload = _check(endpoint, tmp_path, "unsloth/Qwen3-0.6B-GGUF", "--ram", "16GiB")
    by_quant = {(c["quant"], c["mode"]): c["quality"] for c in payload["candidates"]}
    for mode in ("thinking", "standard"):
        ud, q4 = by_quant[("UD-Q4_K_XL", mode)], by_quant[("Q4_K_M", mode)]
        assert ud["quant_loss"] == q4["quant_loss"] and ud["quant_loss_measured"] is True
        assert ud["score"] == q4["score"] < by_quant[("Q8_0", mode)]["score"]


def test_catalog_headers_are_captured_from_a_repository(hub: tuple[str, ServerState], tmp_path: Path) -> None:
    """`catalog capture hf://OWNER/REPO --name NAME` writes NAME.QUANT.json for each quantisation, read
    as `check` reads them (the others passing over the first's tokenizer): the same metadata and
    tensors (offsets too) as the catalog's own headers these files were written from (the file's name and its
    header's byte counts, with placeholder tokens, are the file's own)."""
    endpoint, _ = hub
    out = tmp_path / "headers"
    result = run_cli("catalog", "capture", "hf://unsloth/Qwen3-8B-GGUF", "--name", "qwen3-8b", "--dir", str(out), env=_env(endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["qwen3-8b.Q4_K_M.json", "qwen3-8b.Q6_K.json", "qwen3-8b.Q8_0.json"]
    for path in out.iterdir():
        ours = json.loads(path.read_text())["files"][0]
        theirs = json.loads((REPO_ROOT / "recipes" / "headers" / path.name).read_text())["files"][0]
        assert (ours["metadata"], ours["gguf_version"], ours["alignment"]) == (theirs["metadata"], theirs["gguf_version"], theirs["alignment"])
        assert ours["tensors"] == theirs["tensors"]  # names, shapes, types and offsets
    wrong = run_cli(
        "catalog", "capture", "hf://unsloth/Qwen3-8B-GGUF", "--name", "q", "--quant", "Q2_K", "--dir", str(out), env=_env(endpoint, tmp_path)
    )
    assert wrong.returncode == 2 and wrong.stderr.splitlines() == [
        "error: hf://unsloth/Qwen3-8B-GGUF: no quantisation Q2_K",
        "hint: it has: Q4_K_M, Q6_K, Q8_0",
    ]


def test_a_vocabulary_being_read_is_waited_for_not_fetched_twice(repos: list[HubRepo]) -> None:
    """Two threads meet the same vocabulary: the first reads it, the second waits and passes over
    it by what the first learnt; one that waits too long reads it itself."""
    directory = next(r.directory for r in repos if r.repo_id == "unsloth/Qwen3-8B-GGUF")
    header = parse_header(LocalFileReader(directory / "Qwen3-8B-Q4_K_M.gguf"))
    tokens = ("tokenizer.ggml.tokens", "STRING", 151_936)
    known = ArrayBytes()
    assert known(*tokens) is None  # this thread reads it now
    answers: list[int | None] = []
    waiting = threading.Thread(target=lambda: answers.append(known(*tokens)))
    waiting.start()
    time.sleep(0.2)
    assert waiting.is_alive() and answers == []  # waiting for the first reader
    known.learn(header)
    known.release()
    waiting.join(5)
    summary = header.metadata["tokenizer.ggml.tokens"]
    assert isinstance(summary, ArraySummary) and summary.byte_length > 0
    assert answers == [summary.byte_length]
    impatient = ArrayBytes(wait_s=0.1)
    assert impatient(*tokens) is None
    late: list[int | None] = []
    other = threading.Thread(target=lambda: late.append(impatient(*tokens)))
    other.start()
    other.join(5)
    assert late == [None]  # gave up waiting: it reads the array itself

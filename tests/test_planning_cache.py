"""The planning cache: a catalog entry restored from its digest plans exactly as its header
does, the cache file is written, read back, mended when damaged, and a warm ``check`` reads no
header at all. Real compact headers from recipes/ (llama-quantize's own layouts); no engine."""

from __future__ import annotations

import dataclasses
import datetime
import json
import marshal
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierlocal import cache_file, planning_cache
from tierlocal.catalog import load_entry_headers, load_host_defaults, load_models
from tierlocal.cli.common import machine
from tierlocal.fit.digest import spec_digest, spec_from_digest
from tierlocal.fit.estimate import RunRequest
from tierlocal.fit.model import model_spec
from tierlocal.gguf import summarize
from tierlocal.plan.inputs import PlanAsk, PlanInputs
from tierlocal.plan.machine import machine_for
from tierlocal.plan.source import check_model

#: One entry of each kind of layout the planner treats apart: dense, tied output, sliding
#: window, MoE, MLA, MXFP4 experts, per-layer embeddings, hybrid recurrent.
ARCHITECTURES = ("llama", "gemma3", "qwen3moe", "deepseek2", "gpt-oss", "gemma4", "qwen35moe", "lfm2", "phi3")
#: Machines that take every path of a plan: the CPU alone, a small GPU (layers and experts in
#: RAM), a mid-sized and a large one (whole), a named card priced from published rows, a split
#: across two cards.
MACHINES = (
    (("none",), "16GiB"),
    (("6GiB",), "32GiB"),
    (("RTX 4060",), "64GiB"),
    (("24GiB",), "64GiB"),
    (("H200",), "128GiB"),
    (("2xRTX 3090",), "64GiB"),
)


def _entries() -> list:
    entries = [entry for entry in load_models() if entry.header_file is not None]
    chosen = []
    for architecture in ARCHITECTURES:
        of_kind = [entry for entry in entries if entry.architecture == architecture]
        assert of_kind, f"the catalog has no {architecture} entry with a header"
        chosen.append(max(of_kind, key=lambda entry: entry.params))  # the largest: the most offload paths
    return chosen


@pytest.mark.parametrize("gpus, ram", MACHINES, ids=[f"{g[0]}-{r}" for g, r in MACHINES])
def test_a_restored_spec_plans_exactly_as_its_header(gpus: tuple[str, ...], ram: str) -> None:
    target = machine_for(machine(gpus, ram), load_host_defaults())
    for entry in _entries():
        headers = load_entry_headers(entry)
        assert headers is not None
        spec, summary = model_spec(headers), summarize(headers)
        restored = spec_from_digest(marshal.loads(marshal.dumps(spec_digest(spec, summary))))
        for ctx, parallel in ((8192, 1), (4096, 2)):
            ask = PlanAsk(ctx, parallel, RunRequest())
            planned = check_model(entry.key, model_spec(headers), summary, PlanInputs(target), ask).to_json()
            assert check_model(entry.key, *restored, PlanInputs(target), ask).to_json() == planned, (entry.key, ctx, parallel)


def test_a_restored_spec_refuses_a_plan_that_needs_its_tensors() -> None:
    """A device with a binding limit needs every tensor's size: the digest has none to give, and
    says so instead of planning an empty model."""
    entry = _entries()[0]
    headers = load_entry_headers(entry)
    assert headers is not None
    spec, summary = spec_from_digest(spec_digest(model_spec(headers), summarize(headers)))
    limited = dataclasses.replace(machine_for(machine(("8GiB",), "32GiB"), load_host_defaults()), max_tensor_bytes=128 << 20)
    with pytest.raises(RuntimeError, match="keeps no tensors"):
        check_model(entry.key, spec, summary, PlanInputs(limited), PlanAsk(4096, 1, RunRequest()))


def test_a_digest_of_another_layout_is_refused() -> None:
    entry = _entries()[0]
    headers = load_entry_headers(entry)
    assert headers is not None
    digest = spec_digest(model_spec(headers), summarize(headers))
    with pytest.raises(ValueError, match="version"):
        spec_from_digest({**digest, "version": -1})
    with pytest.raises(ValueError, match="damaged"):
        spec_from_digest({**digest, "placement_groups": ((1, 2),)})


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory, and this process's copies of the cache forgotten."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cache_file, "_sections", None)
    monkeypatch.setattr(planning_cache, "_restored", {})
    return tmp_path / "tierlocal" / "planning"


def test_the_cache_file_is_written_read_back_and_mended(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _entries()
    first = planning_cache.catalog_models(entries)
    path = cache_file.cache_path()
    assert path.parent == fresh_cache and path.is_file()
    assert set(marshal.loads(path.read_bytes())[planning_cache._SECTION]) == {entry.header_file for entry in entries}
    with monkeypatch.context() as patched:  # a new process, its copies forgotten: every entry from the file, no header read
        patched.setattr(cache_file, "_sections", None)
        patched.setattr(planning_cache, "_restored", {})
        patched.setattr(planning_cache, "load_entry_headers", _no_header)
        again = planning_cache.catalog_models(entries)
    assert {key: model[1] for key, model in again.items()} == {key: model[1] for key, model in first.items()}
    # A damaged file is read as empty and written anew; this install's file of another
    # fingerprint is removed, and another install's only once unused for 30 days (two installs
    # sharing the directory removed each other's at every run: the test suite's venvs did).
    path.write_bytes(b"\x00not marshal")
    install = path.name.split("-")[0]
    (fresh_cache / f"{install}-stale.marshal").write_bytes(b"old")
    (fresh_cache / "0another-inuse.marshal").write_bytes(b"another install's")
    unused = fresh_cache / "0another-unused.marshal"
    unused.write_bytes(b"another install's, long unused")
    month_ago = time.time() - 31 * 86400
    os.utime(unused, (month_ago, month_ago))
    monkeypatch.setattr(cache_file, "_sections", None)
    monkeypatch.setattr(planning_cache, "_restored", {})
    assert set(planning_cache.catalog_models(entries)) == set(first)
    assert set(marshal.loads(path.read_bytes())[planning_cache._SECTION]) == {entry.header_file for entry in entries}
    assert sorted(p.name for p in fresh_cache.iterdir()) == sorted([path.name, "0another-inuse.marshal"])


def test_a_cache_that_cannot_be_written_costs_only_time(fresh_cache: Path) -> None:
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text("a file where the cache directory would be")
    models = planning_cache.catalog_models(_entries()[:2])
    assert len(models) == 2 and fresh_cache.is_file()


def test_a_warm_check_reads_no_header(tmp_path: Path) -> None:
    """``check`` over the whole catalog, twice in new processes: the second plans every entry
    from the cache file, with the compact-header reader made to fail."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "TIERLOCAL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    code = (
        "import sys, tierlocal.catalog as c\n"
        "if sys.argv[1] == 'warm':\n"
        "    c._read_compact = lambda file: (_ for _ in ()).throw(AssertionError('read ' + file))\n"
        "from tierlocal.cli import main\n"
        "sys.argv = ['tierlocal', 'check', '--gpu', 'RTX 4090', '--ram', '64GiB', '--json']\n"
        "main()\n"
    )
    outputs = [subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True, env=env, check=False) for run in ("cold", "warm")]
    assert [done.returncode for done in outputs] == [0, 0], outputs[1].stderr[-2000:]
    cold, warm = (json.loads(done.stdout) for done in outputs)
    assert len(warm["candidates"]) > 150
    assert (warm["candidates"], warm["recommendation"]) == (cold["candidates"], cold["recommendation"])


def _no_header(entry: object) -> None:
    raise AssertionError(f"a header was read for {entry}")


def test_a_cached_value_is_kept_once_built_and_built_again_when_it_cannot_be(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []

    def build(value: object) -> object:
        builds.append(str(value))
        return value

    assert cache_file.cached("plain", lambda: build((1, 2.5, "x"))) == (1, 2.5, "x")
    date = datetime.date(2026, 12, 4)  # what a TOML date parses to: kept in memory only
    assert cache_file.cached("unmarshallable", lambda: build({"date": date})) == {"date": date}
    cache_file.save()
    monkeypatch.setattr(cache_file, "_sections", None)  # a new process reads the file
    assert cache_file.cached("plain", lambda: build("again")) == (1, 2.5, "x")
    assert cache_file.cached("unmarshallable", lambda: build("built again")) == "built again"

    def refuse(plain: object) -> object:
        raise ValueError("not this form")

    assert cache_file.cached("plain", lambda: build("rebuilt"), load=refuse) == "rebuilt"
    assert builds == ["(1, 2.5, 'x')", "{'date': datetime.date(2026, 12, 4)}", "built again", "rebuilt"]

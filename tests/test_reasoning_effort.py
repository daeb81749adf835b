"""gpt-oss's reasoning efforts (issue 51): its thinking at high effort is what its figures measure
and what its command asks for (the chat template's own default is medium), and its low effort is
a candidate of its own, scored on its own figures and timed on its own trace."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli
from tierlocal.catalog import find_model, load_answer_lengths, load_quality
from tierlocal.cli.serve import _with_thinking
from tierlocal.engines.flags import reasoning_flags
from tierlocal.errors import UsageError
from tierlocal.plan.answer_time import typical_answer
from tierlocal.plan.modes import modes_of
from tierlocal.plan.quality import fit_quality, mode_scores

CPU = ("--gpu", "none", "--ram", "16GiB", "--ram-bandwidth", "40GB/s")


def _check(*args: str) -> dict[str, object]:
    result = run_cli("check", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _fitted() -> dict[str, dict[str, object]]:
    facts = load_quality()
    return fit_quality(facts.figures, facts.benchmark_tasks)  # type: ignore[return-value]


def test_low_effort_is_a_unit_of_its_own_in_the_thinking_columns() -> None:
    facts = load_quality()
    low = [f for f in facts.figures if f.model == "gpt-oss-20b" and f.effort == "low"]
    assert len(low) >= 8 and {f.mode for f in low} == {"thinking"} and {f.variant for f in low} == {"thinking-low"}
    assert any(not f.self_reported for f in low) and any(f.self_reported for f in low)
    scores = mode_scores(_fitted(), "gpt-oss-20b")  # type: ignore[arg-type]
    assert set(scores) == {"thinking", "thinking-low"}
    high, cheap = scores["thinking"]["chat"], scores["thinking-low"]["chat"]
    # the publisher's and Artificial Analysis's low-effort figures are all below their high ones
    assert cheap.score < high.score
    assert {f.effort for f in cheap.figures} == {"low"} and {f.effort for f in high.figures} == {None}


def test_the_efforts_follow_the_catalog_and_the_flags_ask_the_engine_for_them() -> None:
    assert find_model("gpt-oss-20b")[0].reasoning_effort == "high"
    assert find_model("qwen3.5-9b")[0].reasoning_effort is None
    assert reasoning_flags("thinking", effort="high", switch=False) == ("--reasoning-effort", "high")
    assert reasoning_flags("thinking-low", switch=True) == ("--reasoning-effort", "low")
    assert reasoning_flags("thinking", switch=False) == ()
    assert reasoning_flags("standard") == ("--reasoning", "off")
    quality = _fitted()
    assert [mode for mode, _ in modes_of(quality, "gpt-oss-20b", "high", "high")] == ["thinking"]  # type: ignore[arg-type]
    assert [mode for mode, _ in modes_of(quality, "gpt-oss-20b", "low", "high")] == ["thinking-low"]  # type: ignore[arg-type]
    assert [mode for mode, _ in modes_of(quality, "gpt-oss-20b", "on", "high")] == ["thinking", "thinking-low"]  # type: ignore[arg-type]
    assert modes_of(quality, "qwen3.5-9b", "low", None) == []  # type: ignore[arg-type]


def test_low_effort_spends_a_shorter_trace_than_high() -> None:
    lengths = load_answer_lengths()
    for model in ("gpt-oss-20b", "gpt-oss-120b"):
        high, low = typical_answer(model, "thinking", lengths), typical_answer(model, "thinking-low", lengths)
        assert high is not None and low is not None and low.basis == "scaled"
        assert low.reasoning_tokens < high.reasoning_tokens and low.tokens < high.tokens


def test_the_pick_asks_for_the_effort_its_score_was_measured_at() -> None:
    """On the 16 GB CPU box gpt-oss-20b is picked thinking: its command asks llama-server for high
    effort, the one its figures are at (the template alone would run it at medium)."""
    payload = _check(*CPU)
    best = payload["recommendation"]
    assert best["model"] == "gpt-oss-20b" and best["mode"] == "thinking"  # type: ignore[index]
    assert payload["plan"]["command"][-2:] == ["--reasoning-effort", "high"]  # type: ignore[index]
    low = _check(*CPU, "--thinking", "low", "--all")
    assert {c["mode"] for c in low["candidates"]} == {"thinking-low"}  # type: ignore[union-attr]
    assert low["plan"]["command"][-2:] == ["--reasoning-effort", "low"]  # type: ignore[index]
    assert any("without figures at low reasoning effort" in note for note in low["notes"])  # type: ignore[union-attr]
    mine = {c["mode"]: c for c in payload["candidates"] if c["model"] == "gpt-oss-20b"}  # type: ignore[union-attr]
    assert mine["thinking-low"]["answer"]["seconds"] < mine["thinking"]["answer"]["seconds"]


def test_serve_passes_the_effort() -> None:
    # auto: a catalog model scored at one effort is served at it, unless the arguments name one
    assert _with_thinking((), "auto", "llama-server", "high") == ("--reasoning-effort", "high")
    assert _with_thinking(("--reasoning-effort", "low"), "auto", "llama-server", "high") == ("--reasoning-effort", "low")
    assert _with_thinking((), "auto", "ollama", "high") == ()
    assert _with_thinking((), "auto", "llama-server", None) == ()
    assert _with_thinking((), "low", "llama-server") == ("--reasoning-effort", "low")
    assert _with_thinking((), "off", "llama-server") == ("--reasoning", "off")
    with pytest.raises(UsageError, match="--reasoning-effort both given"):
        _with_thinking(("--reasoning-effort=high",), "low", "llama-server")


def test_a_set_member_asks_for_its_effort_too() -> None:
    """`check A B` plans a set: the gpt-oss member's command asks for high effort, the other's for nothing."""
    payload = json.loads(run_cli("check", "gpt-oss-20b", "gemma-3-270m", "--gpu", "none", "--ram", "32GiB", "--json").stdout)
    commands = {member["name"]: member["command"] for member in payload["members"]}
    assert commands["gpt-oss-20b"][-2:] == ["--reasoning-effort", "high"]
    assert "--reasoning-effort" not in commands["gemma-3-270m"]

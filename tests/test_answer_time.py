"""The time to a typical answer (issue 51): the tokens a model spends per answer in each mode,
from recipes/answer_tokens.toml, at the plan's speeds; each mode of a model that has both is a
candidate of its own, and --thinking chooses; --prefer balanced weighs the time, not tok/s."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli
from tierlocal.catalog import load_answer_lengths, load_quality
from tierlocal.plan.answer_time import answer_time, typical_answer
from tierlocal.published import AnswerLength, AnswerLengths


def _length(model: str, mode: str, tokens: float, reasoning: float | None = None, workload: str = "w") -> AnswerLength:
    return AnswerLength(model, mode, tokens, reasoning, workload, f"https://example.org/{model}", "2026-01-01")


def _lengths(*lengths: AnswerLength) -> AnswerLengths:
    return AnswerLengths("w", "the reference", lengths, answer_tokens=500.0, answer_source="a typical answer")


LENGTHS = _lengths(
    _length("a", "thinking", 3000, 2700),
    _length("b", "thinking", 1000, 800),
    _length("c", "thinking", 2000, 1900),
    _length("a", "standard", 400),
    # Another workload, 33× longer for b: d, measured there only, is carried to w by b.
    _length("b", "thinking", 33_000, workload="x"),
    _length("d", "thinking", 99_000, workload="x"),
    _length("e", "thinking", 5, workload="y"),  # linked to nothing: cannot be carried
)


def test_a_typical_answer_is_the_trace_on_the_reference_workload_then_the_answer() -> None:
    """The trace: what a thinking unit spends on the reference questions beyond what the units
    answering directly spend (400 here); then the typical answer (500) for every mode."""
    own = typical_answer("a", "thinking", LENGTHS)
    assert own is not None and own.basis == "measured" and own.reasoning_tokens == pytest.approx(2600) and own.tokens == pytest.approx(3100)
    scaled = typical_answer("d", "thinking", LENGTHS)
    assert scaled is not None and scaled.basis == "scaled" and scaled.tokens == pytest.approx(3100, rel=1e-6) and scaled.workload == "w"
    # Not measured (or not linked): the median of the linked thinking units on w (3000, 1000,
    # 2000, 3000; taken in logs, so the middle two's geometric mean).
    middle = (2000 * 3000) ** 0.5
    for model in ("z", "e"):
        assumed = typical_answer(model, "thinking", LENGTHS)
        assert assumed is not None and assumed.basis == "assumed" and assumed.lengths == ()
        assert assumed.reasoning_tokens == pytest.approx(middle - 400, rel=1e-6) and assumed.tokens == pytest.approx(middle - 400 + 500, rel=1e-6)
    direct = typical_answer("a", "standard", LENGTHS)
    assert direct is not None and (direct.tokens, direct.reasoning_tokens, direct.basis) == (500, 0, "measured")
    assert typical_answer("z", "standard", LENGTHS).basis == "assumed"  # type: ignore[union-attr]
    # Nothing answering directly on the reference: a trace cannot be told from an answer.
    assert typical_answer("a", "thinking", _lengths(_length("a", "thinking", 3000))) is None


def test_the_seconds_are_the_prompt_then_every_output_token_at_the_decode_speed() -> None:
    typical = typical_answer("a", "thinking", LENGTHS)
    assert typical is not None
    timed = answer_time(typical, prefill_tokens_per_s=256.0, decode_tokens_per_s=20.0, prompt_tokens=512)
    assert (
        timed is not None
        and timed.first_token_s == 2.0
        and timed.seconds == pytest.approx(2.0 + 155.0)
        and timed.answer.reasoning_tokens / timed.decode_tokens_per_s == pytest.approx(130.0)
    )
    unknown_prefill = answer_time(typical, None, 20.0)
    assert unknown_prefill is not None and unknown_prefill.first_token_s is None and unknown_prefill.seconds == pytest.approx(155.0)
    assert answer_time(typical, 256.0, None) is None


def test_every_recorded_length_names_a_catalog_model_in_a_mode_it_has_figures_in() -> None:
    """A length for a mode the model is never scored in could never price a candidate."""
    lengths = load_answer_lengths().lengths
    modes = {(figure.model, figure.variant) for figure in load_quality().figures}
    assert len(lengths) >= 20
    assert not [(length.model, length.mode) for length in lengths if (length.model, length.mode) not in modes]
    assert all(length.source.startswith("https://") and length.date[:4].isdigit() for length in lengths)
    assert {"thinking", "standard"} <= {length.mode for length in lengths}


def _check(*args: str) -> dict[str, object]:
    result = run_cli("check", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


CPU = ("--gpu", "none", "--ram", "16GiB", "--ram-bandwidth", "40GB/s")


def test_a_model_with_both_modes_is_two_candidates_each_with_its_score_and_time() -> None:
    candidates = _check(*CPU, "--all")["candidates"]
    by_mode = {c["mode"]: c for c in candidates if c["model"] == "qwen3-8b" and c["quant"] == "Q4_K_M"}  # type: ignore[index]
    assert set(by_mode) == {"thinking", "standard"}
    thinking, standard = by_mode["thinking"], by_mode["standard"]
    assert thinking["quality"]["score"] > standard["quality"]["score"]  # its own thinking-mode figures
    # The trace costs its tokens at the decode speed, on top of the same answer.
    trace_s = thinking["answer"]["reasoning_tokens"] / thinking["est_decode_tokens_per_s"]
    assert thinking["answer"]["seconds"] - standard["answer"]["seconds"] == pytest.approx(trace_s, abs=0.2) and trace_s > 10
    assert thinking["answer"]["reasoning_tokens"] > 0 and standard["answer"]["reasoning_tokens"] == 0
    assert {f["mode"] for f in thinking["quality"]["figures"]} == {"thinking"}
    assert {f["mode"] for f in standard["quality"]["figures"]} == {"standard"}
    # One mode per model and no other candidate without it (the 2507 Instruct models only answer directly).
    assert {c["mode"] for c in candidates if c["model"] == "qwen3-4b-2507"} == {"standard"}  # type: ignore[index]


@pytest.mark.parametrize("machine", [CPU, ("--gpu", "RTX 4090", "--ram", "64GiB")], ids=["cpu", "rtx-4090"])
def test_thinking_on_and_off_keep_one_mode_and_say_what_they_left_out(machine: tuple[str, ...]) -> None:
    on, off = _check(*machine, "--thinking", "on", "--all"), _check(*machine, "--thinking", "off", "--all")
    assert {c["mode"] for c in on["candidates"]} <= {"thinking", "thinking-low", None}  # type: ignore[union-attr]
    assert {c["mode"] for c in off["candidates"]} <= {"standard", None}  # type: ignore[union-attr]
    assert any("models that always think: " in note and "deepseek-r1-distill-llama-8b" in note for note in off["notes"])  # type: ignore[union-attr]
    assert any("models without a thinking mode: " in note and "deepseek-v2-lite" in note for note in on["notes"])  # type: ignore[union-attr]
    best = on["recommendation"]
    assert best["mode"] == "thinking" and best["answer"]["seconds"] > 0  # type: ignore[index]
    if best["model"] in {c["model"] for c in off["candidates"]}:  # type: ignore[index, union-attr]
        # A model with both modes says so in its command: llama-server's --reasoning.
        plan = on["plan"]
        assert plan["command"][-2:] == ["--reasoning", "on"]  # type: ignore[index]


def test_balanced_weighs_the_time_to_an_answer_and_the_pick_moves_where_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the machines of the docs, ranked once by the time to a typical answer and once by
    decode tok/s alone (no answer lengths): where the picks differ, the time's pick answers
    sooner; on one of them at least they differ (with the figures of 2026-12-07, the RTX 4090:
    the dense Qwen3.5-27B Q6_K by tok/s, ~34 s a typical answer, against Qwen3.5-35B-A3B Q4_K_M,
    ~7 s; before, the 16 GiB CPU-only machine and the M3 Max)."""
    import tierlocal.recommendation as recommendation
    from tierlocal.catalog import load_models
    from tierlocal.hardware.detect import detect
    from tierlocal.hardware.override import with_gpu_override, with_ram_override

    machines = [("none", "16GiB", "40GB/s"), ("RTX 4090", "64GiB", None), ("RTX 4060 Ti 16GB", "64GiB", None), ("M3 Max 64GB", None, None)]
    moved = []
    for gpu, ram, bandwidth in machines:
        hardware = with_gpu_override(detect(), [gpu])
        hardware = with_ram_override(hardware, ram, bandwidth) if ram else hardware
        by_time = recommendation.catalog_recommendation(list(load_models()), hardware, ctx=8192, parallel=1, min_tokens_per_s=0).best
        with monkeypatch.context() as patched:
            patched.setattr(recommendation, "load_answer_lengths", lambda: None)
            by_speed = recommendation.catalog_recommendation(list(load_models()), hardware, ctx=8192, parallel=1, min_tokens_per_s=0).best
        assert by_time is not None and by_speed is not None and by_time.answer is not None and by_speed.answer is None
        if by_time.key != by_speed.key:
            same = next(
                c
                for c in recommendation.catalog_recommendation(list(load_models()), hardware, ctx=8192, parallel=1, min_tokens_per_s=0).candidates
                if c.key == by_speed.key
            )
            assert same.answer is not None and by_time.answer.seconds < same.answer.seconds, (gpu, by_time.key, by_speed.key)
            moved.append(gpu)
    assert moved

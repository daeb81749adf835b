"""A client's request body as the gateway reads it (pure): JSON with bounded nesting, and the
output it may produce — n, best_of, both caps — reserved and written back into the body."""

from __future__ import annotations

import json

import pytest

from tierlocal.gateway.config import name_problem
from tierlocal.gateway.protocol import printable
from tierlocal.gateway.request_body import MAX_CHOICES, MAX_JSON_DEPTH, MAX_OUTPUT_TOKENS, output_limits, parse_json_object
from tierlocal.gateway.wire import Reject


def _rejected(raw: bytes) -> Reject:
    with pytest.raises(Reject) as caught:
        parse_json_object(raw)
    return caught.value


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
        json.dumps({"m": json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))}).encode(),
    ],
    ids=["array-100000", "object-100000", "one-past-the-bound"],
)
def test_deep_nesting_is_a_400(raw: bytes) -> None:
    reject = _rejected(raw)
    assert (reject.status, reject.code) == (400, "invalid_json") and f"deeper than {MAX_JSON_DEPTH}" in reject.message


def test_nesting_up_to_the_bound_parses() -> None:
    inner = json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))
    assert parse_json_object(json.dumps({"m": inner}).encode())["m"] == inner


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe{}", b""])
def test_anything_but_a_json_object_is_a_400(raw: bytes) -> None:
    assert (_rejected(raw).status, _rejected(raw).code) == (400, "invalid_json")


def test_every_choice_is_reserved() -> None:
    body: dict[str, object] = {"max_tokens": 4, "n": 3}
    limits = output_limits(body, default_max_tokens=256, budgeted=True)
    assert (limits.per_choice, limits.choices, limits.tokens) == (4, 3, 12)
    assert output_limits({"max_tokens": 4, "n": 2, "best_of": 5}, default_max_tokens=256, budgeted=True).tokens == 20
    assert output_limits({"n": None}, default_max_tokens=256, budgeted=False).tokens == 256


@pytest.mark.parametrize("value", [0, -1, "2", 2.0, True, MAX_CHOICES + 1, [2]])
def test_a_choice_count_out_of_range_is_a_400_naming_the_field(value: object) -> None:
    for field in ("n", "best_of"):
        with pytest.raises(Reject) as caught:
            output_limits({field: value}, default_max_tokens=256, budgeted=True)
        assert (caught.value.status, caught.value.code, caught.value.param) == (400, "invalid_value", field)


def test_both_caps_become_the_smaller_for_a_budgeted_user_only() -> None:
    budgeted: dict[str, object] = {"max_tokens": 4, "max_completion_tokens": 9}
    limits = output_limits(budgeted, default_max_tokens=256, budgeted=True)
    assert limits.per_choice == 4 and budgeted == {"max_tokens": 4, "max_completion_tokens": 4}
    assert "caps differ" in limits.adjusted[0]
    free: dict[str, object] = {"max_tokens": 4, "max_completion_tokens": 9}
    assert output_limits(free, default_max_tokens=256, budgeted=False).per_choice == 4
    assert free == {"max_tokens": 4, "max_completion_tokens": 9}  # nobody's budget to protect: sent as given


def test_an_invalid_cap_gets_the_default_and_says_so() -> None:
    body: dict[str, object] = {"max_tokens": -5}
    limits = output_limits(body, default_max_tokens=256, budgeted=True)
    assert limits.per_choice == 256 and body == {"max_tokens": 256}
    assert limits.adjusted == ("max_tokens=-5 is not a positive integer", "reserved and sent the default 256")
    missing: dict[str, object] = {}
    assert output_limits(missing, default_max_tokens=256, budgeted=True).adjusted == () and missing == {"max_tokens": 256}


def test_a_huge_cap_is_held_to_the_largest_reservation() -> None:
    body: dict[str, object] = {"max_completion_tokens": 10**12}
    assert output_limits(body, default_max_tokens=256, budgeted=True).per_choice == MAX_OUTPUT_TOKENS == body["max_completion_tokens"]


def test_printable_escapes_what_could_forge_a_log_line_or_move_a_cursor() -> None:
    assert printable("bob\nuser=root") == "bob\\nuser=root"
    assert printable("\x1b[2J\u202eevil") == "\\x1b[2J\\u202eevil"
    assert printable("<script>&") == "<script>&"  # markup is text: escaping it is the page's job
    assert printable("x" * 300, limit=10) == "x" * 9 + "…"


@pytest.mark.parametrize(
    ("name", "ok"), [("alice", True), ("<b>bob</b> & co", True), ("eve\x1b[31m", False), ("a\nb", False), ("x\u202e", False), ("y" * 201, False)]
)
def test_names_with_control_characters_are_refused(name: str, ok: bool) -> None:
    assert (name_problem(name) is None) is ok

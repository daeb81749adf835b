"""The serve state file: one typed reading of what a verified serve wrote, and what is refused."""

from __future__ import annotations

import json
import os

import pytest

from tierlocal.serve.state import ServeState, UsersPoint, running_servers, write_state


def _state(**changes: object) -> ServeState:
    plan = {
        "model": {"source": "gemma-3-270m:q4_k_m"},
        "request": {"parallel": 4, "ctx_per_slot": 2048},
        "users": [
            {"users": 2, "per_user_decode_tokens_per_s": 30.5, "first_token_p50_s": 1.4, "basis": "derived"},
            {"users": 1, "per_user_decode_tokens_per_s": 50, "first_token_p50_s": None, "basis": "measured"},
            {"users": "many", "per_user_decode_tokens_per_s": 1.0},  # not a row: skipped
            {"users": 4, "per_user_decode_tokens_per_s": 0, "first_token_p50_s": 3.0, "basis": "derived"},  # no speed: skipped
        ],
    }
    fields: dict[str, object] = {
        "url": "http://127.0.0.1:8080",
        "pid": os.getpid(),
        "engine": "llama-server",
        "engine_pid": 1,
        "log": "/tmp/serve.log",
        "plan": plan,
        "actual": {"n_ctx": 8192},
        "delta": {"verified": True},
        "first_answer_s": 0.5,
        "engine_version": "b1",
        "argv": ("llama-server", "-m", "/models/gemma.gguf", "-c", "8192"),
        "estimate_correction_bytes": None,
        "details": {"api_key_file": "/run/key", "chat_template": {"source": "header"}},
    }
    fields.update(changes)
    return ServeState(**fields)  # type: ignore[arg-type]


def test_a_state_reads_back_as_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIERLOCAL_HOME", str(tmp_path))
    state = _state()
    path = write_state(8080, state)
    payload = json.loads(path.read_text())
    assert payload["api_key_file"] == "/run/key" and payload["argv"][1] == "-m"  # details sit at the top level, as documented
    assert running_servers() == [state]
    assert (state.model_file, state.model_source, state.api_key_file, state.request["parallel"]) == (
        "/models/gemma.gguf",
        "gemma-3-270m:q4_k_m",
        "/run/key",
        4,
    )


def test_the_users_curve_keeps_the_rows_it_can_use_in_order() -> None:
    assert _state().users_curve == (UsersPoint(1, 50.0, None, "measured"), UsersPoint(2, 30.5, 1.4, "derived"))
    assert _state(plan={}).users_curve == ()


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"pid": 1, "engine": "llama-server"},
        {"url": "http://x", "pid": True, "engine": "e"},
        {"url": "http://x", "pid": 1, "engine": "e", "plan": []},
    ],
)
def test_a_malformed_state_is_refused(payload: object) -> None:
    with pytest.raises(ValueError):
        ServeState.from_json(payload)


def test_a_malformed_or_stale_file_is_skipped(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIERLOCAL_HOME", str(tmp_path))
    write_state(8080, _state())
    (tmp_path / "run" / "serve-8081.json").write_text(json.dumps({"url": "http://x", "pid": os.getpid(), "engine": "e", "argv": "not a list"}))
    (tmp_path / "run" / "serve-8082.json").write_text("{")
    assert [server.url for server in running_servers()] == ["http://127.0.0.1:8080"]


def test_a_sets_state_written_from_several_threads_at_once_is_always_whole(tmp_path, monkeypatch) -> None:
    """A model set writes its state from the event loop and from the threads that load and unload
    members: two writers sharing one temporary file lost it between write and rename (CI:
    FileNotFoundError on set-PORT.tmp, and the member's load answered 503)."""
    import threading

    from tierlocal.serve.state import running_sets, write_set_state

    monkeypatch.setenv("TIERLOCAL_HOME", str(tmp_path))
    failures: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            for step in range(300):
                write_set_state(8080, {"url": "http://127.0.0.1:8080", "pid": os.getpid(), "writer": index, "step": step})
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    (state,) = running_sets(8080)
    assert state["step"] == 299 and not list((tmp_path / "run").glob("*.tmp"))

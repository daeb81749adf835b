"""`tierlocal bench` against the real llama-server on the Gemma model: a server it starts for
the measurement and one already running, the figures from llama-server's own timings, the
record, and `check` showing it for the same model, engine build and device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.cli import run_cli
from tests.support.doc_json import assert_documented
from tests.support.engines import ENGINE_THREADS, free_port
from tests.support.serving import serving


def _env(assets: Assets, home: Path) -> dict[str, str]:
    return {"TIERLOCAL_HOME": str(home), "TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu)}


def test_bench_starts_a_server_measures_records_and_check_shows_it(assets: Assets, tmp_path: Path) -> None:
    env = _env(assets, tmp_path)
    done = run_cli("bench", str(assets.gemma_gguf), "--ctx", "1024", "--threads", ENGINE_THREADS, "--json", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert_documented("bench", result)
    # 128 and 512 fit a 1024-token slot with the 32 generated; 2048 does not.
    assert [abs(run["prompt_tokens"] - asked) <= 4 for run, asked in zip(result["runs"], (128, 512), strict=True)] == [True, True]
    assert all(run["decode_tokens"] == 32 and run["decode_tokens_per_s"] > 0 and run["prefill_tokens_per_s"] > 0 for run in result["runs"])
    assert all(run["first_token_s"] > run["prompt_tokens"] / run["prefill_tokens_per_s"] for run in result["runs"])
    assert result["device"] == "cpu" and result["bound_decode_tokens_per_s"] > 0
    assert result["host_peak_bytes"] > 200 * 2**20  # the 241 MiB model is mapped
    (record,) = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert record["key"]["model"] == str(assets.gemma_gguf.resolve()) and record["decode_tokens_per_s"] == result["decode_tokens_per_s"]
    check = json.loads(run_cli("check", str(assets.gemma_gguf), "--json", env=env).stdout)
    assert check["measured"]["decode_tokens_per_s"] == result["decode_tokens_per_s"]
    # the users table keeps the model's shape at the measured scale
    assert {row["basis"] for row in check["users"]} == {"derived"}
    human = run_cli("check", str(assets.gemma_gguf), env=env).stdout
    assert "Measured by tierlocal bench" in " ".join(human.split())
    assert not list((tmp_path / "run").glob("serve-*.json"))  # the server it started is gone


def test_bench_attaches_to_the_running_serve(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    with serving(assets, tmp_path, "--ctx", "1024", "--port", str(port)):
        done = run_cli("bench", "--port", str(port), "--json", env=_env(assets, tmp_path), timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["url"] == f"http://127.0.0.1:{port}"
    nothing = run_cli("bench", env=_env(assets, tmp_path / "empty"))
    assert nothing.returncode == 1 and nothing.stderr.startswith("error: no tierlocal serve is running")  # as `status` exits


@pytest.mark.serial  # it compares engine speeds at 1 and 2 users: other tests' load once made 2 users read slower in all
def test_bench_users_measures_users_at_once_records_it_and_check_uses_it(assets: Assets, tmp_path: Path) -> None:
    """Real concurrent streaming clients against `serve --users 2` (two slots, one KV cache):
    two users wait longer for their first token than one (both prompts go in one batch) and
    each decodes no faster than one alone; check then shows the measured rows."""
    env = _env(assets, tmp_path)
    args = ("--users", "1,2", "--prompt", "256", "--tokens", "16", "--ctx", "512", "--threads", ENGINE_THREADS, "--json")
    done = run_cli("bench", str(assets.gemma_gguf), *args, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert_documented("bench-users", result)
    one, two = result["users"]
    assert (one["users"], two["users"], result["slots"]) == (1, 2, 2)
    assert one["prompt_tokens"] == two["prompt_tokens"] == 256 and one["tokens"] == two["tokens"] == 16
    assert two["first_token_p50_s"] > one["first_token_p50_s"]
    assert two["per_user_decode_tokens_per_s"] < one["per_user_decode_tokens_per_s"] * 1.1
    assert two["aggregate_decode_tokens_per_s"] > one["aggregate_decode_tokens_per_s"]  # batched: more in all
    assert [row["users"] for row in result["estimate"]] == [1, 2, 4, 8, 16]  # the plan's table, for 256-token prompts
    (record,) = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert record["kind"] == "users" and record["key"]["model"] == str(assets.gemma_gguf.resolve())
    plan = json.loads(run_cli("check", str(assets.gemma_gguf), "--users", "2", "--ctx", "512", "--json", env=env).stdout)
    assert plan["request"]["kv_unified"] is True and "-kvu" in plan["command"]
    assert plan["measured"] is None  # a users record is not a single-stream one
    rows = {row["users"]: row for row in plan["users"]}
    assert [rows[1]["basis"], rows[2]["basis"], rows[4]["basis"]] == ["measured", "measured", "derived"]
    assert rows[2]["per_user_decode_tokens_per_s"] == two["per_user_decode_tokens_per_s"]
    # 4 users on 2 slots: two wait, so the median first token comes later than with 2
    assert rows[4]["queued"] == 2 and rows[4]["first_token_p50_s"] > rows[2]["first_token_p50_s"]
    human = run_cli("check", str(assets.gemma_gguf), "--users", "2", "--ctx", "512", env=env).stdout
    assert "users at once:" in human and "bench --users" not in human  # measured: no call to measure

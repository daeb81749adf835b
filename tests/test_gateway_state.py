"""The gateway's configuration contract and its SQLite state: keys stored hashed, budgets that
concurrent processes cannot overrun, usage totals. (The HTTP server: test_gateway.py.)"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT, run_cli
from tierlocal.errors import UsageError
from tierlocal.gateway.config import load_config, parse_config
from tierlocal.gateway.store import SqliteStore, UsageRecord

# The configuration contract, as written, is the example shipped under systemd/.
CONTRACT = (REPO_ROOT / "systemd" / "gateway.example.toml").read_text()


def _contract(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(CONTRACT.replace('state_dir = "/var/lib/tierlocal"', f'state_dir = "{tmp_path / "state"}"'))
    return path


def test_the_contract_example_loads(tmp_path: Path) -> None:
    config = load_config(_contract(tmp_path))
    route = config.route("qwen3-14b")
    assert route is not None and [t.url for t in route.targets] == ["http://127.0.0.1:8080/v1", "https://api.moonshot.ai/v1"]
    assert (route.min_user_tokens_per_s, route.max_first_token_s) == (10.0, 5.0)
    assert [t.hosted for t in route.targets] == [False, True]
    assert route.targets[1].api_key_env == "MOONSHOT_API_KEY"
    assert config.prices["kimi-k3"].output == 15.0
    alice = config.user("alice")
    assert alice is not None and (alice.requests_per_minute, alice.budget_usd, alice.budget_period) == (60, 5.0, "month")
    assert config.server.state_dir == tmp_path / "state"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('model = "kimi-k3", api_key_env = "MOONSHOT_API_KEY" } ]', 'model = "kimi-k3", api_key = "sk-secret" } ]'),
            "routes[1].targets[0].api_key: keys never go in the config file",
        ),
        (('budget_period = "month"', 'budget_period = "fortnight"'), "users[0].budget_period: 'fortnight' is not a period"),
        (('url = "http://127.0.0.1:8080/v1"', 'url = "127.0.0.1:8080"'), "routes[0].targets[0].url: '127.0.0.1:8080' is not an http(s) URL"),
        (("requests_per_minute = 60", "requests_per_minute = -1"), "users[0].requests_per_minute: must be a whole number above 0, not -1"),
        (("min_user_tokens_per_s = 10", "min_user_tokens_per_s = 0"), "routes[0].min_user_tokens_per_s: must be a number above 0, not 0"),
        (("max_first_token_s = 5", 'max_first_token_s = "soon"'), "routes[0].max_first_token_s: must be a number above 0, not 'soon'"),
    ],
)
def test_bad_config_is_one_precise_error(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = _contract(tmp_path)
    text = path.read_text()
    assert text.count(edit[0]) == 1, edit[0]
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(UsageError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: {message}"
    assert "sk-secret" not in str(error.value) + (error.value.hint or "")


def test_keys_are_shown_once_and_stored_hashed(tmp_path: Path) -> None:
    config = _contract(tmp_path)
    added = run_cli("gateway", "keys", "add", "alice", "--config", str(config), "--json")
    assert added.returncode == 0, added.stderr
    key = json.loads(added.stdout)["key"]
    assert json.loads(added.stdout)["user"] == "alice" and key.startswith("tlk-") and len(key) > 40
    stored = b"".join(path.read_bytes() for path in (tmp_path / "state").iterdir())
    assert key.encode() not in stored and key[10:].encode() not in stored
    store = SqliteStore(tmp_path / "state")
    assert store.authenticate(key) == "alice"
    assert store.authenticate(key + "x") is None
    store.close()
    listed = run_cli("gateway", "keys", "list", "--config", str(config), "--json")
    assert key not in listed.stdout and json.loads(listed.stdout)[0]["prefix"] == key[:10]
    stranger = run_cli("gateway", "keys", "add", "mallory", "--config", str(config))
    assert stranger.returncode == 2 and "no [[users]] entry named 'mallory'" in stranger.stderr
    assert run_cli("gateway", "keys", "revoke", "alice", "--config", str(config)).returncode == 0
    store = SqliteStore(tmp_path / "state")
    assert store.authenticate(key) is None
    store.close()


def _reserve_many(state_dir: str, count: int, results: multiprocessing.Queue[int]) -> None:
    store = SqliteStore(Path(state_dir))
    granted = sum(store.reserve("alice", 0.01, 0.20, "month") is not None for _ in range(count))
    store.close()
    results.put(granted)


def test_concurrent_processes_cannot_overrun_a_budget(tmp_path: Path) -> None:
    """Ten processes race for 0.01 USD reservations, 10 each, against 0.20 USD: exactly 20 win."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = context.Queue()
    workers = [context.Process(target=_reserve_many, args=(str(tmp_path), 10, results)) for _ in range(10)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert sum(results.get(timeout=5) for _ in workers) == 20
    store = SqliteStore(tmp_path)
    assert store.spent("alice", "month") == pytest.approx(0.20)
    store.close()


def test_settling_replaces_the_hold_and_usage_totals_add_up(tmp_path: Path) -> None:
    config = _contract(tmp_path)
    store = SqliteStore(tmp_path / "state")
    held = store.reserve("alice", 1.00, 5.00, "month")
    assert held is not None and store.spent("alice", "month") == pytest.approx(1.00)
    store.settle(held, UsageRecord("alice", "kimi-k3", "kimi-k3", "https://api.moonshot.ai/v1", 200, 1000, 400, 200, 0.0051, 120.0))
    store.settle(None, UsageRecord("alice", "qwen3-14b", "qwen3-14b", "http://127.0.0.1:8080/v1", 200, 50, 0, 10, 0.0, 30.0))
    assert store.spent("alice", "month") == pytest.approx(0.0051)
    store.close()
    result = run_cli("usage", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    totals = json.loads(result.stdout)
    assert totals["users"]["alice"] == {"requests": 2, "prompt_tokens": 1050, "cached_tokens": 400, "completion_tokens": 210, "cost_usd": 0.0051}
    assert totals["models"]["kimi-k3"]["cost_usd"] == 0.0051 and totals["models"]["qwen3-14b"]["requests"] == 1


def _one_target(**target: object) -> dict[str, object]:
    return {"routes": [{"model": "kimi-k3", "targets": [{"url": "http://10.0.0.5:8000/v1", "model": "moonshotai/Kimi-K3", **target}]}]}


def test_tiers_default_by_key_and_a_cluster_of_your_own_is_tier_1() -> None:
    cluster = parse_config(_one_target(tier=1, usd_per_hour=56.0), "g.toml").routes[0].targets[0]
    assert (cluster.tier, cluster.usd_per_hour, cluster.hosted) == (1, 56.0, False)
    assert parse_config(_one_target(), "g.toml").routes[0].targets[0].tier == 2
    assert parse_config(_one_target(api_key_env="K"), "g.toml").routes[0].targets[0].tier == 3
    # A cluster behind a key is still tier 1: it has a key, and no per-token price.
    behind_key = parse_config(_one_target(tier=1, api_key_env="K"), "g.toml").routes[0].targets[0]
    assert (behind_key.tier, behind_key.hosted) == (1, True)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"tier": 4}, "routes[0].targets[0].tier: 4 is not a tier"),
        ({"tier": True}, "routes[0].targets[0].tier: True is not a tier"),
        ({"tier": 3}, "routes[0].targets[0].tier: a hosted API (tier 3) needs a key"),
        ({"usd_per_hour": 10.0}, "routes[0].targets[0].usd_per_hour: only a cluster of your own (tier = 1) has a cost per hour"),
        ({"tier": 1, "usd_per_hour": -1}, "routes[0].targets[0].usd_per_hour: must be a number above 0, not -1"),
        ({"tiers": 1}, "routes[0].targets[0]: unknown key 'tiers'"),
    ],
)
def test_a_bad_tier_is_one_precise_error(target: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_config(_one_target(**target), "g.toml")
    assert str(error.value) == f"g.toml: {message}"


def test_default_config_routes_kimi_to_the_hosted_api() -> None:
    config = parse_config({}, "(test)")
    assert config.routes == ()
    from tierlocal.gateway.config import default_config

    default = default_config()
    route = default.route("kimi-k3")
    assert route is not None and route.targets[0].url == "https://api.moonshot.ai/v1" and route.targets[0].api_key_env == "MOONSHOT_API_KEY"


def test_usage_gives_the_break_even_verdict_from_the_measured_volume(tmp_path: Path) -> None:
    config = _contract(tmp_path)
    store = SqliteStore(tmp_path / "state")
    try:
        # 1M prompt tokens (400k from the cache) and 100k output, just now: priced by hand at
        # the contract's rates that is 0.4·0.30 + 0.6·3.00 + 0.1·15.00 = $3.42.
        store.settle(None, UsageRecord("alice", "kimi-k3", "kimi-k3", "moonshot", 200, 1_000_000, 400_000, 100_000, 3.42, 900.0))
    finally:
        store.close()
    result = run_cli("usage", "--config", str(config), "--period", "all", "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)["break_even"]["kimi-k3"]
    # Under an hour of history is taken as one hour: a month is 720 of them.
    assert verdict["tokens_per_month"] == pytest.approx(1_100_000 * 720)
    assert verdict["api_usd_per_month"] == pytest.approx(3.42 * 720)
    plan = json.loads(run_cli("plan", "kimi-k3", "--json").stdout)
    assert verdict["rent_usd_per_month"] == pytest.approx(plan["break_even"]["monthly_cost_usd"])
    assert verdict["cheaper"] == ("api" if verdict["rent_usd_per_month"] > 3.42 * 720 else "rent")
    text = run_cli("usage", "--config", str(config), "--period", "all")
    assert "kimi-k3: at the measured volume" in text.stdout and "is cheaper" in text.stdout


# The schema exactly as tierlocal wrote it before migrations were numbered (user_version 0): a
# database written by a gateway already deployed. The first form lacked the last three columns.
SCHEMA_BEFORE_NUMBERING = """
CREATE TABLE IF NOT EXISTS keys (key_hash TEXT PRIMARY KEY, shown_prefix TEXT NOT NULL, user TEXT NOT NULL, created REAL NOT NULL, revoked REAL);
CREATE TABLE IF NOT EXISTS reservations (id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL, amount_usd REAL NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS usage (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, user TEXT NOT NULL, model TEXT NOT NULL,
    route TEXT NOT NULL, target TEXT NOT NULL, status INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL, latency_ms REAL NOT NULL,
    fallback_reason TEXT, request_id TEXT, request_body TEXT, response_body TEXT);
CREATE INDEX IF NOT EXISTS usage_user_time ON usage (user, time);
"""
FIRST_SCHEMA = SCHEMA_BEFORE_NUMBERING.replace(", request_id TEXT, request_body TEXT, response_body TEXT", "")


def _old_database(state_dir: Path, schema: str) -> tuple[str, list[tuple[object, ...]]]:
    """A database in an old schema with a live key, a hold and usage rows; (the key, the usage rows)."""
    import hashlib
    import sqlite3

    state_dir.mkdir(parents=True)
    key = "tlk-" + "k" * 43
    with sqlite3.connect(state_dir / "gateway.sqlite3") as db:
        db.executescript(schema)
        db.execute("INSERT INTO keys VALUES (?, ?, 'alice', 1.0, NULL)", (hashlib.sha256(key.encode()).hexdigest(), key[:10]))
        db.execute("INSERT INTO reservations (user, amount_usd, created) VALUES ('alice', 0.25, 2.0)")
        columns = "time, user, model, route, target, status, prompt_tokens, cached_tokens, completion_tokens, cost_usd, latency_ms, fallback_reason"
        for index in range(3):
            db.execute(
                f"INSERT INTO usage ({columns}) VALUES (?, 'alice', 'kimi-k3', 'kimi-k3', 'hosted', 200, ?, 0, 7, 0.001, 12.5, NULL)",
                (10.0 + index, 100 + index),
            )
        rows = db.execute(f"SELECT {columns} FROM usage ORDER BY id").fetchall()
    return key, rows


@pytest.mark.parametrize("schema", [SCHEMA_BEFORE_NUMBERING, FIRST_SCHEMA], ids=["before-numbering", "first-schema"])
def test_an_old_database_is_migrated_without_losing_a_row(tmp_path: Path, schema: str) -> None:
    import sqlite3

    from tierlocal.gateway.store.sqlite import MIGRATIONS

    key, rows = _old_database(tmp_path / "state", schema)
    store = SqliteStore(tmp_path / "state")
    try:
        assert store.authenticate(key) == "alice"
        record = UsageRecord("alice", "kimi-k3", "kimi-k3", "hosted", 200, 1, 0, 1, request_id="msg-after", tier=3, protocol="messages")
        store.settle(None, record)
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "state" / "gateway.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 6
        columns = "time, user, model, route, target, status, prompt_tokens, cached_tokens, completion_tokens, cost_usd, latency_ms, fallback_reason"
        assert db.execute(f"SELECT {columns} FROM usage WHERE id <= 3 ORDER BY id").fetchall() == rows
        assert db.execute("SELECT request_id FROM usage ORDER BY id").fetchall() == [(None,), (None,), (None,), ("msg-after",)]
        # Rows from before the tier was recorded say so (NULL); the new row names its tier.
        assert db.execute("SELECT tier FROM usage ORDER BY id").fetchall() == [(None,), (None,), (None,), (3,)]
        # Likewise the protocol (migration 6): NULL before, the client's protocol after.
        assert db.execute("SELECT protocol, upstream_protocol FROM usage ORDER BY id").fetchall() == [(None, None)] * 3 + [("messages", None)]
        assert db.execute("SELECT user, amount_usd FROM reservations").fetchall() == [("alice", 0.25)]
        # The old rows' cost, carried into the per-day totals budgets are checked against.
        days = db.execute("SELECT user, day, cost_usd FROM spend_by_day ORDER BY day").fetchall()
        assert days[0][:2] == ("alice", 0.0) and days[0][2] == pytest.approx(3 * 0.001)
    SqliteStore(tmp_path / "state").close()  # opening a current database again changes nothing


def test_a_database_newer_than_this_code_is_refused(tmp_path: Path) -> None:
    import sqlite3

    (tmp_path / "state").mkdir()
    with sqlite3.connect(tmp_path / "state" / "gateway.sqlite3") as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(UsageError, match="schema version 99; this tierlocal knows 6"):
        SqliteStore(tmp_path / "state")
    with sqlite3.connect(tmp_path / "state" / "gateway.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 99  # untouched: still in rollback-journal mode
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_the_budget_check_reads_the_days_the_settlements_added_up(tmp_path: Path) -> None:
    """What a reservation is checked against is what the usage rows of the period cost (kept as
    per-day totals by every settlement), plus what is held."""
    import sqlite3

    from tierlocal.gateway.store.base import period_start

    store = SqliteStore(tmp_path / "state")
    try:
        for index in range(50):
            held = store.reserve("alice", 0.5, 100.0, "month")
            assert held is not None
            store.settle(held, UsageRecord("alice", "kimi-k3", "kimi-k3", "hosted", 200, 10, 0, 5, cost_usd=0.01 * (index % 3)))
        store.settle(None, UsageRecord("bob", "kimi-k3", "kimi-k3", "hosted", 200, 10, 0, 5, cost_usd=7.0))
        open_hold = store.reserve("alice", 0.25, 100.0, "month")
        assert open_hold is not None
        spent = store.spent("alice", "month")
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "state" / "gateway.sqlite3") as db:
        rows = db.execute("SELECT SUM(cost_usd) FROM usage WHERE user = 'alice' AND time >= ?", (period_start("month"),)).fetchone()[0]
    assert spent == pytest.approx(rows + 0.25) == pytest.approx(0.01 * sum(index % 3 for index in range(50)) + 0.25)

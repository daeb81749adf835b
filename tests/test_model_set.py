"""A set of models planned together (:mod:`tierlocal.plan.model_set`, ``check A B C``,
``check --set FILE``): each member against what the pinned ones leave, every group checked, the
set file's errors. Real compact headers of the catalog (llama-quantize's own layouts); no engine."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.sparse_models import QWEN3_8B, write_sparse_gguf
from tierlocal.catalog import find_model, load_entry_headers, load_host_defaults
from tierlocal.cli.common import machine
from tierlocal.errors import UsageError
from tierlocal.fit.estimate import RunRequest
from tierlocal.fit.model import model_spec
from tierlocal.gguf import summarize
from tierlocal.plan.inputs import PlanAsk, PlanInputs
from tierlocal.plan.machine import machine_for
from tierlocal.plan.model_set import SetMember, SetPlan, plan_set
from tierlocal.plan.set_file import member_name, parse_set_file
from tierlocal.plan.source import check_model

GIB = 2**30
ASK = PlanAsk(4096, 1, RunRequest())
#: Three catalog entries of different sizes (about 0.6, 1.6 and 5 GB of weights).
KEYS = ("qwen3-0.6b:q8_0", "qwen3-1.7b:q8_0", "qwen3-8b:q4_k_m")


def _headed(key: str, ask: PlanAsk = ASK, **member: object) -> tuple[SetMember, object, object, str]:
    (entry,) = find_model(key)
    headers = load_entry_headers(entry)
    assert headers is not None
    return SetMember(key, key, ask, **member), model_spec(headers), summarize(headers), f"{key}.gguf"  # type: ignore[arg-type]


def _where(gpus: tuple[str, ...], ram: str) -> PlanInputs:
    return PlanInputs(machine_for(machine(gpus, ram), load_host_defaults()), host_is_here=False)


def _alone_host_bytes(key: str, where: PlanInputs) -> int:
    """A member's RAM in use with mmap when it is planned alone, as `check SOURCE` plans it."""
    _, spec, summary, path = _headed(key)
    check = check_model(key, spec, summary, where, ASK, model_path=path)  # type: ignore[arg-type]
    return next(memory.in_use_bytes for memory in check.host_memory if memory.load_mode == "mmap")


def _group_fits(plan: SetPlan, names: tuple[str, ...]) -> bool:
    return all(used <= budget for used, budget in zip(plan.resident_bytes(names), plan.budget_bytes, strict=True))


def test_three_members_of_which_any_two_fit_make_three_pairs_on_the_cpu() -> None:
    """A budget of the two largest members' RAM and a bit: every pair fits, the three do not, and
    each member holds what it holds alone (nothing pinned: each is planned on the whole machine)."""
    big = _where(("none",), "64GiB")
    alone = {key: _alone_host_bytes(key, big) for key in KEYS}
    two_largest = sum(sorted(alone.values())[1:])
    margin = big.machine.margin_bytes
    budget = (two_largest + margin) // 2**20 * 2**20 + 64 * 2**20
    assert budget - margin < sum(alone.values()), "the chosen members must not fit all at once"
    where = _where(("none",), f"{budget // 2**20}MiB")
    plan = plan_set([_headed(key) for key in KEYS], where)
    assert plan.device_names == ("host",) and plan.budget_bytes == (budget - margin,)
    assert [m.device_bytes for m in plan.members] == [(alone[key],) for key in KEYS]
    assert plan.fits and not plan.all_resident
    assert sorted(plan.resident_groups) == sorted(itertools.combinations(KEYS, 2))
    assert plan.max_resident == 2
    for group in plan.resident_groups:
        assert _group_fits(plan, group)
    assert not _group_fits(plan, KEYS)
    # Each member's prompt cache is a share of what the fullest pair leaves: the pair and both shares fit the budget.
    fullest = max(sum(plan.resident_bytes(g)) for g in plan.resident_groups)
    share = plan.members[0].cache_ram_bytes
    assert share > 0 and fullest + 2 * share <= budget - margin
    assert all(m.cache_ram_bytes == share and "--cache-ram" in m.command for m in plan.members)


def test_a_pinned_member_is_in_every_group_and_a_member_that_cannot_fit_beside_it_is_named() -> None:
    where = _where(("none",), "64GiB")
    alone = {key: _alone_host_bytes(key, where) for key in KEYS}
    margin = where.machine.margin_bytes
    # Room for the 8B pinned and the 1.7B, not for the 8B and the 0.6B and the 1.7B together.
    budget = (alone[KEYS[2]] + alone[KEYS[1]] + margin) // 2**20 * 2**20 + 16 * 2**20
    where = _where(("none",), f"{budget // 2**20}MiB")
    members = [_headed(KEYS[0]), _headed(KEYS[1]), _headed(KEYS[2], pinned=True)]
    plan = plan_set(members, where)
    assert plan.fits
    assert all(KEYS[2] in group for group in plan.resident_groups)
    assert sorted(plan.resident_groups) == [(KEYS[0], KEYS[2]), (KEYS[1], KEYS[2])]
    # A pinned member too big for what the other pinned one leaves: the set does not fit, and says which.
    tight = _where(("none",), f"{(alone[KEYS[2]] + margin + 16 * 2**20) // 2**20}MiB")
    plan = plan_set([_headed(KEYS[2], pinned=True), _headed(KEYS[1], pinned=True)], tight)
    assert not plan.fits
    assert [m.fits for m in plan.members] == [True, False]
    assert plan.members[1].reason


def test_a_member_beside_a_pinned_one_on_a_gpu_keeps_fewer_layers_there_and_says_so() -> None:
    """On a 12 GiB GPU the 8B model alone is all on the GPU; beside a pinned copy of itself it
    gets what is left: fewer layers, and the plan says so."""
    where = _where(("12GiB",), "64GiB")
    pinned = _headed(KEYS[2], pinned=True)
    other = (replace(pinned[0], name="second", pinned=False), *pinned[1:])
    plan = plan_set([pinned, other], where)
    first, second = plan.members
    assert first.check.estimate is not None and second.check.estimate is not None
    assert first.check.estimate.layers_offloaded == first.check.estimate.layers_total
    assert second.check.estimate.layers_offloaded < first.check.estimate.layers_total
    assert second.shrunk is not None and "GPU layers" in second.shrunk
    gpu_budget = plan.budget_bytes[0]
    assert first.device_bytes[0] + second.device_bytes[0] <= gpu_budget
    assert plan.all_resident and plan.max_resident == 2


def test_a_set_of_no_members_or_two_of_one_name_is_refused() -> None:
    where = _where(("none",), "16GiB")
    with pytest.raises(ValueError, match="1 to 12"):
        plan_set([], where)
    with pytest.raises(ValueError, match="share a name"):
        plan_set([_headed(KEYS[0]), _headed(KEYS[0])], where)


def test_a_set_file_gives_each_member_its_own_ask_and_refuses_what_a_set_cannot_be() -> None:
    default = PlanAsk(8192, 1, RunRequest(), up_to_training=True)
    document = {
        "set": {"load_wait_s": 30},
        "model": [
            {"name": "chat", "source": "qwen3-8b", "pinned": True, "ctx": 16384},
            {"source": "/models/coder-1.5b-q8_0.gguf", "role": "code", "parallel": 2, "idle_unload_s": 600},
        ],
    }
    members, settings = parse_set_file(document, default, "team.toml")
    assert settings.load_wait_s == 30
    chat, code = members
    assert (chat.name, chat.pinned, chat.ask.ctx, chat.ask.up_to_training, chat.ask.parallel) == ("chat", True, 16384, False, 1)
    assert (code.name, code.role, code.ask.ctx, code.ask.up_to_training, code.ask.parallel) == ("coder-1.5b-q8_0", "code", 8192, True, 2)
    assert code.idle_unload_s == 600.0
    bad = [
        ({"model": [{"source": "a.gguf", "colour": "red"}]}, "model 1: no key 'colour'"),
        ({"model": [{"source": "a.gguf", "role": "images"}]}, "role 'images'"),
        ({"model": [{"source": "a.gguf", "ctx": 0}]}, "'ctx' must be a whole number"),
        ({"model": [{"source": "a.gguf", "parallel": True}]}, "'parallel' must be a whole number"),
        ({"model": [{"source": "a.gguf", "pinned": True, "idle_unload_s": 60}]}, "never unloaded"),
        ({"model": [{"source": "a.gguf", "idle_unload_s": -1}]}, "idle_unload_s must be a number of seconds"),
        ({"model": [{"name": "x"}]}, "'source' is missing"),
        ({"model": [{"source": "a.gguf"}, {"source": "b/a.gguf"}]}, "both named 'a'"),
        ({"model": []}, "1 to 12"),
        ({"model": [{"source": "a.gguf"}] * 13}, "1 to 12"),
        ({"models": []}, "unknown table 'models'"),
        ({"set": {"wait": 3}, "model": [{"source": "a.gguf"}]}, "no key 'wait'"),
    ]
    for document, message in bad:
        with pytest.raises(UsageError, match=message.replace("(", r"\(")):
            parse_set_file(document, default, "team.toml")
    assert member_name("hf://Org/Repo/Model-Q4_K_M.gguf") == "Model-Q4_K_M"
    assert member_name("qwen3-8b") == "qwen3-8b"


def test_check_of_several_sources_prints_the_joint_plan(tmp_path: Path) -> None:
    """``check A B --json`` with a described machine; a set file with an error is one line and exit 2."""
    sparse_qwen3 = write_sparse_gguf(tmp_path / "qwen3-8b-q4k.gguf", QWEN3_8B)
    result = run_cli("check", str(sparse_qwen3), "qwen3-0.6b:q8_0", "--gpu", "none", "--ram", "24GiB", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [m["name"] for m in plan["members"]] == [sparse_qwen3.stem, "qwen3-0.6b:q8_0"]
    assert plan["fits"] and plan["all_resident"] and plan["max_resident"] == 2
    assert [d["name"] for d in plan["devices"]] == ["host"]
    bad = tmp_path / "set.toml"
    bad.write_text('[[model]]\nsource = "qwen3-8b"\nrole = "images"\n')
    result = run_cli("check", "--set", str(bad), "--gpu", "none", "--ram", "8GiB")
    assert result.returncode == 2
    assert "role 'images' is not one of chat, code, embeddings, rerank" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_member_whose_header_names_a_pooling_is_planned_as_an_embedding_server(tmp_path: Path) -> None:
    """An embedding model's file (Qwen3-Embedding's shape: qwen3 with pooling_type 3, last token)
    in a quick set is an embeddings member, planned with a micro-batch of outputs; the same shape
    without the key is a chat member."""
    from tests.support.sparse_models import QWEN3_1_7B

    pooled = write_sparse_gguf(tmp_path / "embed.gguf", replace(QWEN3_1_7B, extra={"qwen3.pooling_type": 3}))
    plain = write_sparse_gguf(tmp_path / "chat.gguf", QWEN3_1_7B)
    result = run_cli("check", str(pooled), str(plain), "--gpu", "none", "--ram", "32GiB", "--json")
    assert result.returncode == 0, result.stderr
    embed, chat = json.loads(result.stdout)["members"]
    assert (embed["role"], chat["role"]) == ("embeddings", "chat")
    compute = [m["plan"]["devices"][-1]["compute_bytes"] for m in (embed, chat)]
    # 512 tokens × 151,936 logits in f32 are the embedding server's compute peak; the chat one's is far smaller.
    assert compute[0] >= 512 * 151_936 * 4 > 4 * compute[1]

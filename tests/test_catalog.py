"""The model catalog: current and sourced, every entry with a compact header that the real
``llama-quantize --dry-run`` laid out, planned exactly as the file would be."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.assets import Assets
from tests.support.catalog_headers import HEADERS, MODELS, captured_header, header_path, quantised_header
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.compact_file import write_compact_as_gguf
from tierlocal.fit.model import VERIFIED_ARCHS


def _families() -> list[dict[str, object]]:
    return tomllib.loads(MODELS.read_text())["family"]


def _without_template(command: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg in ("--chat-template", "--chat-template-file"):
            skip = True
        elif arg not in ("--no-jinja", "--jinja"):
            kept.append(arg)
    return kept


def test_the_catalog_is_current_sourced_and_has_a_header_per_entry() -> None:
    families = _families()
    entries = [(family["name"], quant) for family in families for quant in family["quants"]]  # type: ignore[attr-defined]
    assert len(families) >= 60 and len(entries) >= 180
    assert len({family["series"] for family in families}) >= 20
    for family in families:
        assert str(family["source"]).startswith("https://huggingface.co/") and family["facts_date"] and family["licence"]
        assert "shape" in family, family["name"]
        for quant in family["quants"]:  # type: ignore[attr-defined]
            assert header_path(str(family["name"]), str(quant)).is_file(), (family["name"], quant)
    # Dense and MoE, small and large, hybrids: what people run on one machine.
    architectures = {family["architecture"] for family in families}
    assert {"llama", "qwen3", "qwen3moe", "gemma3", "deepseek2", "qwen3next", "qwen35", "qwen35moe", "gemma4", "lfm2", "nemotron_h"} <= architectures
    assert {"qwen2", "phi3", "olmo2", "smollm3", "seed_oss", "exaone4"} <= architectures
    # Every architecture the catalog plans was checked against the real engine (tests/test_memory*.py).
    assert architectures <= VERIFIED_ARCHS, architectures - VERIFIED_ARCHS
    assert min(int(f["params"]) for f in families) < 1e9 < 70e9 < max(int(f["params"]) for f in families)  # type: ignore[call-overload]
    # No header without its entry.
    assert {path.name for path in HEADERS.glob("*.json")} == {header_path(str(name), str(quant)).name for name, quant in entries}


def test_catalog_list_and_show() -> None:
    listed = run_cli("catalog", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    models = {model["name"]: model for model in json.loads(listed.stdout)["models"]}
    assert {"qwen3-30b-a3b", "gemma-3-27b", "llama-3.3-70b", "kimi-k3"} <= set(models)
    assert models["qwen3-30b-a3b"]["active_params"] < models["qwen3-30b-a3b"]["params"]
    shown = run_cli("catalog", "show", "qwen3-8b", "--json")
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    by_quant = {q["quant"]: q for q in facts["quantisations"]}
    # Bigger types, bigger files; the KV cache does not depend on the weights' type: 36 layers
    # × 8 KV heads × 128 × 2 (K and V) × 2 bytes per token at 8,192 tokens.
    assert by_quant["Q4_K_M"]["file_bytes"] < by_quant["Q6_K"]["file_bytes"] < by_quant["Q8_0"]["file_bytes"]
    assert by_quant["Q4_K_M"]["kv_bytes"]["8192"] == by_quant["Q8_0"]["kv_bytes"]["8192"] == 36 * 8 * 128 * 2 * 2 * 8192
    human = run_cli("catalog", "show", "nope-7b")
    assert human.returncode == 2 and human.stderr.startswith("error: 'nope-7b' is not in the catalog")


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-12b", "lfm2-1.2b", "qwen3.5-35b-a3b", "gemma-4-26b-a4b"])
def test_a_catalog_entry_is_planned_as_its_file(name: str, tmp_path: Path) -> None:
    """The compact header written back as a GGUF and planned by `check FILE` (real GGUF bytes
    through the parser) gives the plan `check NAME:QUANT` gives from the catalog."""
    compact = json.loads(header_path(name, "Q4_K_M").read_text())
    gguf = write_compact_as_gguf(compact, tmp_path / f"{name}.gguf")
    machine = ("--gpu", "8GiB", "--ram", "32GiB")
    from_file = run_cli("check", str(gguf), *machine, "--json")
    from_catalog = run_cli("check", f"{name}:q4_k_m", *machine, "--json")
    assert from_file.returncode == 0 and from_catalog.returncode == 0, from_file.stderr + from_catalog.stderr
    file_plan, catalog_plan = json.loads(from_file.stdout), json.loads(from_catalog.stdout)["plan"]
    assert catalog_plan["devices"] == file_plan["devices"]
    for key in ("request", "layers_offloaded", "layers_total", "est_decode_tokens_per_s", "host_memory", "speed"):
        assert catalog_plan[key] == file_plan[key], key
    # All but the model's path and the template: the written-back file has no template text
    # (the compact form keeps none); the published file brings its own. A model with both modes
    # is recommended in one of them, which its command asks llama-server for (--reasoning).
    command = catalog_plan["command"][3:]
    if command[-2:-1] == ["--reasoning"]:
        command = command[:-2]
    assert command == _without_template(file_plan["command"][3:])
    assert catalog_plan["model"]["params"] == file_plan["model"]["params"]


def test_the_generated_gemma_header_is_the_real_files(assets: Assets, tmp_path: Path) -> None:
    """Gemma 3 270M's published shape, through the real llama-quantize --dry-run at Q4_K_M,
    gives exactly the real file's tensor table: every name, shape and type."""
    family = next(f for f in _families() if f["name"] == "gemma-3-270m")
    generated = quantised_header("gemma-3-270m", family["shape"], "Q4_K_M", assets.llama_quantize, tmp_path)  # type: ignore[arg-type]
    real = captured_header(assets.gemma_gguf)
    tensors = [tensor[:3] for tensor in generated["files"][0]["tensors"]]  # type: ignore[index]
    assert sorted(tensors) == sorted(tensor[:3] for tensor in real["files"][0]["tensors"])  # type: ignore[index]
    assert len(tensors) == 236


def test_checked_in_headers_are_what_llama_quantize_says(assets: Assets) -> None:
    """Regenerating a few entries with the real tool changes nothing (the generator's --check)."""
    names = ["qwen3-30b-a3b", "gemma-3-4b", "deepseek-v2-lite", "nemotron-nano-9b-v2", "qwen3.5-9b", "gemma-4-26b-a4b"]
    names += ["phi-4-mini", "olmo-2-7b", "seed-oss-36b", "exaone-4.0-32b", "qwen2.5-7b"]
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.catalog_headers", "--check", "--quantize", str(assets.llama_quantize), *(f"--only={n}" for n in names)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("same ") == 33


#: The official Qwen3-Embedding GGUFs' sizes in bytes, as third-party code quotes them (the Hub is
#: not reachable here): Qwen/Qwen3-Embedding-{0.6B,4B,8B}-GGUF.
PUBLISHED_EMBEDDING_FILES = {("qwen3-embedding-0.6b", "Q8_0"): 639_150_592, ("qwen3-embedding-4b", "Q4_K_M"): 2_496_703_776}
PUBLISHED_EMBEDDING_FILES[("qwen3-embedding-8b", "Q4_K_M")] = 4_676_804_928


def test_the_embedding_headers_are_the_published_files_to_the_byte_but_their_tokenizer() -> None:
    """Each published file is its header's tensors plus one tokenizer: the same few MiB in all
    three (one Qwen3 vocabulary). An output head too many in the 8B (its config's untied lm_head,
    which the GGUF does not keep), a wrong width or vocabulary would break the equality."""
    from tierlocal.catalog import find_model, load_entry_headers
    from tierlocal.gguf import summarize

    rest = {}
    for (name, quant), size in PUBLISHED_EMBEDDING_FILES.items():
        entry = next(e for e in find_model(name) if e.quant == quant)
        headers = load_entry_headers(entry)
        assert headers is not None and entry.role == "embeddings"
        summary = summarize(headers)
        assert summary.pooling_type == 3 and summary.pooled_role == "embeddings"  # last-token pooling
        rest[name] = size - summary.tensor_bytes
    assert min(rest.values()) > 2 * 2**20 and max(rest.values()) - min(rest.values()) < 4096, rest


def test_embedding_models_are_ranked_for_embeddings_alone_and_planned_as_llama_server_serves_them() -> None:
    """`check` (chat) never offers an embedding model; `check --for embeddings` ranks only them, by
    their MTEB score, each planned with every token of a micro-batch an output and `--embeddings`."""
    machine = ("--gpu", "RTX 4090", "--ram", "64GiB")
    chat = run_cli("check", *machine, "--all", "--json")
    assert chat.returncode == 0, chat.stderr
    assert not [c for c in json.loads(chat.stdout)["candidates"] if c["model"].startswith("qwen3-embedding")]
    ranked = run_cli("check", *machine, "--for", "embeddings", "--all", "--json")
    assert ranked.returncode == 0, ranked.stderr
    payload = json.loads(ranked.stdout)
    assert {c["model"] for c in payload["candidates"]} == {"qwen3-embedding-0.6b", "qwen3-embedding-4b", "qwen3-embedding-8b"}
    scores = {c["model"]: c["quality"]["model_score"] for c in payload["candidates"]}
    assert scores["qwen3-embedding-0.6b"] < scores["qwen3-embedding-4b"] < scores["qwen3-embedding-8b"]
    plan = payload["plan"]
    # Every token of a micro-batch an output: (151,669 logits + 1,024 floats) × 4 B per row, up to
    # 512 rows once the first full batch comes, less the one row reserved at load.
    host = plan["devices"][-1]
    assert host["output_grows_by_bytes"] == (151_669 + 1024) * 4 * 512 - 151_669 * 4 and plan["command"][-1] == "--embeddings"
    assert any("prefill" in note for note in payload["notes"])
    named = run_cli("check", "qwen3-embedding-4b", *machine, "--json")  # a name ranks for its role unasked
    assert named.returncode == 0 and json.loads(named.stdout)["purpose"] == "embeddings", named.stderr
    wrong = run_cli("check", "qwen3-8b", "--for", "embeddings")
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: qwen3-8b is a generation model: --for embeddings does not rank it")


def test_a_model_without_a_score_says_why_in_json() -> None:
    listed = json.loads(run_cli("catalog", "list", "--json").stdout)["models"]
    by_name = {model["name"]: model for model in listed}
    assert by_name["kimi-k3"]["quality"] is None and "no published figures" in by_name["kimi-k3"]["quality_missing"]
    assert all((model["quality"] is None) == (model["quality_missing"] is not None) for model in listed)
    assert by_name["qwen3-8b"]["quality_missing"] is None and by_name["qwen3-8b"]["role"] == "chat"
    # Evidence in words and numbers: Qwen3.5-9B's chat score rests on its card and Artificial Analysis's runs.
    quality = json.loads(run_cli("catalog", "show", "qwen3.5-9b", "--json").stdout)["quality"]
    chat = quality["scores"]["chat"]
    assert chat["independent_figures"] >= 1 and chat["independent_sources"] == 1 and chat["thin"] is False
    # Its other mode, scored on its own figures: one independent benchmark, so thin.
    assert quality["mode"] == "thinking" and quality["other_modes"]["standard"]["chat"]["thin"] is True
    assert {figure["mode"] for figure in quality["figures"]} == {"thinking", "standard"}

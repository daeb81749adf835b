"""Chat templates without an engine: the status and family of real templates (tests/fixtures/
chat_templates, from the models' own repositories), the choice serve makes, the check of what an
engine rendered, and `check` / `inspect` on sparse GGUFs with and without a template."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.sparse_models import LLAMA3_8B, QWEN3_8B, write_sparse_gguf
from tierlocal.engines.flags import parse_help
from tierlocal.engines.prompt_formats import (
    CHAT_TEMPLATES_DIR,
    PROBE_MESSAGE,
    PROMPT_FORMATS,
    TemplateChoice,
    choose_template,
    format_for_architecture,
    jinja_template,
    render_problem,
)
from tierlocal.gguf.chat_template import MAX_TEMPLATE_CHARS, ChatTemplateInfo, describe_template

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"

# The family each model's card documents (see the fixtures' README).
PUBLISHED_FAMILIES = {
    "google-gemma-2-2b-it": "gemma",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "Qwen-Qwen3-0.6B": "chatml",
    "HuggingFaceTB-SmolLM3-3B": "chatml",
    "LFM2.5-8B-A1B": "chatml",
    "microsoft-Phi-3.5-mini-instruct": "phi3",
    "openai-gpt-oss-120b": "gpt-oss",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral-v7",
    "deepseek-ai-DeepSeek-V3.1": "deepseek3",
    "google-gemma-4-31B-it": None,
}


@pytest.mark.parametrize("model", sorted(PUBLISHED_FAMILIES))
def test_real_templates_parse_and_are_recognised(model: str) -> None:
    source = (TEMPLATES / f"{model}.jinja").read_text()
    info = describe_template(source)
    assert (info.status, info.family, info.chars) == ("present", PUBLISHED_FAMILIES[model], len(source))


def test_hugging_face_generation_blocks_parse() -> None:
    source = (TEMPLATES / "LFM2.5-8B-A1B.jinja").read_text()
    assert "{%- generation -%}" in source
    assert describe_template(source).usable


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{% for m in messages %}<start_of_turn>{{ m.content }{% endfor %}", "line 1"),
        ("{% if x %}never closed", "line 1"),
        ("{{ " * 200_000, ""),
        ("{{ 'x' }}" + " " * MAX_TEMPLATE_CHARS, "more than any real template"),
    ],
    ids=["unclosed-expression", "unclosed-block", "nested-200000-deep", "over-1-MiB"],
)
def test_templates_that_do_not_parse_are_reported_not_raised(source: str, error: str) -> None:
    info = describe_template(source)
    assert info.status == "unparseable" and not info.usable
    assert info.error and error in info.error
    assert info.describe().startswith("unparseable: ")


@pytest.mark.parametrize("source", [None, "", "  \n"])
def test_no_template_is_absent(source: str | None) -> None:
    assert describe_template(source).status == "absent"


def _absent() -> ChatTemplateInfo:
    return describe_template(None)


def test_an_absent_template_gets_the_format_of_its_architecture_as_tierlocals_jinja_template() -> None:
    choice = choose_template(_absent(), "gemma3")
    assert (choice.source, choice.name, choice.family) == ("builtin", "gemma", "gemma")
    # The built-in (--no-jinja --chat-template gemma) refuses every request with tools: a Jinja file of the same turns.
    assert choice.engine_args == ("--jinja", "--chat-template-file", str(CHAT_TEMPLATES_DIR / "gemma.jinja"))
    assert (CHAT_TEMPLATES_DIR / "gemma.jinja").is_file()
    assert choice.prompt_format is PROMPT_FORMATS["gemma"] and choice.warning is None
    assert choice.tools is not None and "gemma models were not trained on it" in choice.tools
    assert "tierlocal's Jinja template of llama-server's built-in 'gemma'" in choice.llama_server_note
    qwen = choose_template(_absent(), "qwen3moe")
    assert qwen.name == "chatml" and qwen.tools == "described to the model in the <tool_call> convention"


def test_every_format_has_a_jinja_template_that_parses() -> None:
    for name in PROMPT_FORMATS:
        path = jinja_template(name)
        assert path is not None and describe_template(path.read_text()).usable, name
    assert jinja_template("mistral-v7") is None


def test_llama_is_llama3_only_with_the_llama3_tokenizer() -> None:
    assert format_for_architecture("llama", "gpt2", "llama-bpe") == "llama3"
    for tokenizer in (("llama", "default"), ("gpt2", "smaug-bpe"), (None, None)):
        assert format_for_architecture("llama", *tokenizer) is None
    choice = choose_template(_absent(), "llama", tokenizer_model="llama")
    assert choice.source == "engine-default" and choice.engine_args == ()
    assert choice.warning is not None and "--chat-template NAME|FILE" in choice.warning and "ChatML" in choice.warning


def test_the_files_own_template_wins() -> None:
    info = describe_template((TEMPLATES / "google-gemma-2-2b-it.jinja").read_text())
    choice = choose_template(info, "gemma2")
    assert (choice.source, choice.family, choice.engine_args, choice.prompt_format) == ("header", "gemma", (), None)


def test_an_unparseable_template_falls_back_to_the_family_its_markers_show() -> None:
    info = describe_template("{% for m in messages %}<|im_start|>{{ m.content }{% endfor %}")
    choice = choose_template(info, "nosucharch")
    assert (choice.source, choice.name) == ("builtin", "chatml")
    assert "does not parse" in choice.note


def test_the_users_choice_wins_and_is_checked_against_the_engines_names() -> None:
    present = describe_template((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    named = choose_template(present, "qwen3", requested_name="llama3")
    assert (named.source, named.engine_args) == ("name", ("--jinja", "--chat-template-file", str(CHAT_TEMPLATES_DIR / "llama3.jinja")))
    # A built-in tierlocal has no Jinja template of is passed by name, and said to refuse tools.
    other = choose_template(present, "qwen3", requested_name="mistral-v7")
    assert other.engine_args == ("--no-jinja", "--chat-template", "mistral-v7")
    assert other.tools is not None and other.tools.startswith("requests with tools fail")
    file_info = describe_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    from_file = choose_template(present, "qwen3", requested_file=("/etc/t.jinja", file_info))
    assert (from_file.source, from_file.engine_args) == ("file", ("--chat-template-file", "/etc/t.jinja"))
    # A family the engine does not list is not passed to it.
    assert choose_template(_absent(), "gemma3", builtins=frozenset({"chatml"})).source == "engine-default"


def _choice(family: str) -> TemplateChoice:
    return choose_template(_absent(), {"gemma": "gemma3", "chatml": "qwen3"}[family])


def test_render_problem_catches_the_chatml_fallback_and_missing_markers() -> None:
    gemma = f"<start_of_turn>user\n{PROBE_MESSAGE}<end_of_turn>\n<start_of_turn>model\n"
    chatml = f"<|im_start|>user\n{PROBE_MESSAGE}<|im_end|>\n<|im_start|>assistant\n"
    assert render_problem(_choice("gemma"), gemma) is None
    assert render_problem(_choice("chatml"), chatml) is None
    assert "turn markers" in (render_problem(_choice("gemma"), chatml) or "")
    assert "ChatML" in (render_problem(replace(_choice("gemma"), family="gpt-oss"), chatml) or "")
    assert "does not contain the message" in (render_problem(_choice("gemma"), "gemma") or "")  # Jinja on + a name


def test_built_in_names_are_read_from_the_help_text() -> None:
    help_text = (
        "--chat-template JINJA_TEMPLATE          set custom jinja chat template\n"
        "                                        list of built-in templates:\n"
        "                                        bailing, chatml, gemma,\n"
        "                                        llama3, phi3\n"
        "                                        (env: LLAMA_ARG_CHAT_TEMPLATE)\n"
    )
    assert parse_help(help_text).chat_templates == frozenset({"bailing", "chatml", "gemma", "llama3", "phi3"})
    assert parse_help("--jinja  use jinja\n").chat_templates == frozenset()


def _check(path: Path, *args: str) -> dict:  # type: ignore[type-arg]
    done = run_cli("check", str(path), "--gpu", "24GiB", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_check_and_inspect_report_the_template_and_the_command_carries_the_choice(tmp_path: Path) -> None:
    qwen3_template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    own = write_sparse_gguf(tmp_path / "qwen3-own.gguf", replace(QWEN3_8B, chat_template=qwen3_template))
    none = write_sparse_gguf(tmp_path / "qwen3-none.gguf", QWEN3_8B)
    broken = write_sparse_gguf(tmp_path / "qwen3-broken.gguf", replace(QWEN3_8B, chat_template="{% for m in messages %}<|im_start|>{{ m.content }"))
    llama = write_sparse_gguf(tmp_path / "llama-spm.gguf", LLAMA3_8B)

    result = _check(own)["chat_template"]
    assert (result["status"], result["family"], result["serve"]["source"]) == ("present", "chatml", "header")
    assert "--chat-template" not in _check(own)["command"]
    result = _check(none)
    assert (result["chat_template"]["status"], result["chat_template"]["serve"]["name"]) == ("absent", "chatml")
    assert result["command"][-3:] == ["--jinja", "--chat-template-file", str(CHAT_TEMPLATES_DIR / "chatml.jinja")]
    result = _check(broken)["chat_template"]
    assert result["status"] == "unparseable" and result["error"].startswith("line 1")
    assert result["serve"]["name"] == "chatml"
    warned = _check(llama)["chat_template"]["serve"]
    assert warned["source"] == "engine-default" and "--chat-template" in warned["warning"]
    table = run_cli("check", str(llama), "--gpu", "24GiB")
    assert "warning: the file has no chat template" in " ".join(table.stdout.split())

    inspected = run_cli("inspect", str(own), "--json")
    assert json.loads(inspected.stdout)["chat_template"] == {
        "status": "present",
        "family": "chatml",
        "chars": len(qwen3_template),
        "error": None,
        "variants": [],
    }
    assert "absent" in run_cli("inspect", str(none)).stdout

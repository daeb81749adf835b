"""Chat templates through the real engines: `tierlocal serve` on the Gemma file (which has no
template) renders Gemma's turns through llama-server's /apply-template and Ollama's Go
TEMPLATE, a file's own template is kept, `--chat-template` is honoured or refused, and tierlocal's
Go templates build the same prompts as llama.cpp's built-ins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import ollama
import openai
import pytest

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli
from tests.support.engines import first_json_document, free_port, llama_server_argv, own_home, running
from tests.support.serving import serving
from tests.support.templated import with_chat_template
from tierlocal.engines.flags import parse_help
from tierlocal.engines.prompt_formats import CHAT_TEMPLATES_DIR, PROBE_MESSAGE, PROMPT_FORMATS, jinja_template
from tierlocal.gguf.chat_template import FAMILY_MARKERS

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
GEMMA_PROMPT = f"<start_of_turn>user\n{PROBE_MESSAGE}<end_of_turn>\n<start_of_turn>model\n"
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Name a colour."},
]


def _chat(port: int) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "Say hello"}], max_tokens=16, temperature=0)
    client.close()
    return answer.choices[0].message.content or ""


def test_the_pinned_engine_knows_every_name_tierlocal_passes(assets: Assets) -> None:
    help_text = subprocess.run([str(assets.llama_server_cpu), "--help"], capture_output=True, text=True, timeout=60).stdout
    builtins = parse_help(help_text).chat_templates
    assert set(PROMPT_FORMATS) | {family for family, _ in FAMILY_MARKERS if family != "gemma4"} <= builtins


def test_gemma_without_a_template_is_served_with_gemma_turns_not_chatml(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    with serving(assets, tmp_path, "--ctx", "1024", "--port", str(port)) as (process, ready):
        template = ready["chat_template"]
        assert (template["source"], template["name"], template["header"]["status"]) == ("builtin", "gemma", "absent")
        argv = ready["argv"]
        at = argv.index("--chat-template-file")
        assert argv[at - 1 : at + 2] == ["--jinja", "--chat-template-file", str(CHAT_TEMPLATES_DIR / "gemma.jinja")]
        assert template["rendered"] == GEMMA_PROMPT  # what llama-server's /apply-template returned
        answer = _chat(port)
        assert answer and not any(marker in answer for marker in CHATML_MARKERS), answer
        status = json.loads(run_cli("status", "--json", env={"TIERLOCAL_HOME": str(tmp_path)}).stdout)
        assert status["chat_template"] == template
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert "chat template: the file has no chat template; using tierlocal's Jinja template of llama-server's built-in 'gemma' for gemma3" in stderr
    assert "tool calls: described to the model in the <tool_call> convention (gemma models were not trained on it" in stderr


def test_the_same_engine_without_tierlocal_falls_back_to_chatml(assets: Assets, tmp_path: Path) -> None:
    """The failure the previous test guards against, on the same binary and file."""
    port = free_port()
    with running(
        llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, ctx=1024, parallel=1),
        tmp_path / "ls.log",
        f"http://127.0.0.1:{port}/health",
    ):
        prompt = httpx2.post(f"http://127.0.0.1:{port}/apply-template", json={"messages": [{"role": "user", "content": PROBE_MESSAGE}]}).json()[
            "prompt"
        ]
        assert prompt.startswith("<|im_start|>user")
        assert any(marker in _chat(port) for marker in CHATML_MARKERS)


@pytest.mark.long
def test_a_file_with_its_own_template_keeps_it(assets: Assets, tmp_path: Path) -> None:
    own = with_chat_template(assets.gemma_gguf, tmp_path / "gemma-own.gguf", (TEMPLATES / "google-gemma-2-2b-it.jinja").read_text())
    with serving(assets, tmp_path, "--ctx", "1024", "--port", str(free_port()), model=own) as (_, ready):
        template = ready["chat_template"]
        assert (template["source"], template["family"], template["header"]["status"]) == ("header", "gemma", "present")
        assert "--chat-template" not in ready["argv"] and "--no-jinja" not in ready["argv"]
        assert template["rendered"] == GEMMA_PROMPT  # llama-server drops the template's own <bos>: the tokenizer adds it
        check = json.loads(run_cli("check", str(own), "--json").stdout)
        assert check["chat_template"]["status"] == "present" and "--chat-template" not in check["command"]


@pytest.mark.long
def test_a_template_the_engine_cannot_parse_is_replaced_by_its_familys_built_in(assets: Assets, tmp_path: Path) -> None:
    """llama-server alone exits at load on this file (tests/fixtures/loadlogs/fail-chat-template.log)."""
    broken = with_chat_template(assets.gemma_gguf, tmp_path / "gemma-broken.gguf", "{% for m in messages %}<start_of_turn>{{ m.content }{% endfor %}")
    inspected = json.loads(run_cli("inspect", str(broken), "--json").stdout)["chat_template"]
    assert (inspected["status"], inspected["family"]) == ("unparseable", "gemma")
    with serving(assets, tmp_path, "--ctx", "1024", "--port", str(free_port()), model=broken) as (_, ready):
        assert (ready["chat_template"]["source"], ready["chat_template"]["name"]) == ("builtin", "gemma")
        assert ready["chat_template"]["rendered"] == GEMMA_PROMPT


def test_chat_template_flag_names_files_and_mistakes(assets: Assets, tmp_path: Path) -> None:
    with serving(assets, tmp_path / "a", "--ctx", "1024", "--port", str(free_port()), "--chat-template", "chatml") as (_, ready):
        assert ready["chat_template"]["source"] == "name"
        assert ready["chat_template"]["rendered"] == f"<|im_start|>user\n{PROBE_MESSAGE}<|im_end|>\n<|im_start|>assistant\n"
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
    with serving(assets, tmp_path / "b", "--ctx", "1024", "--port", str(free_port()), "--chat-template", str(jinja)) as (_, ready):
        assert ready["chat_template"]["source"] == "file" and str(jinja.resolve()) in ready["argv"]
        assert ready["chat_template"]["rendered"] == f"[user] {PROBE_MESSAGE}\n[assistant] "
    env = {"TIERLOCAL_HOME": str(tmp_path / "c"), "TIERLOCAL_LLAMA_SERVER": str(assets.llama_server_cpu)}
    refused = run_cli("serve", str(assets.gemma_gguf), "--chat-template", "gemma-9", "--port", str(free_port()), env=env)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: --chat-template 'gemma-9' is neither a file nor a built-in template of llama-server")
    assert "gemma, " in refused.stderr and not (tmp_path / "c" / "run").exists()
    bad_file = tmp_path / "bad.jinja"
    bad_file.write_text("{% if %}")
    refused = run_cli("serve", str(assets.gemma_gguf), "--chat-template", str(bad_file), "--port", str(free_port()), env=env)
    assert refused.returncode == 2 and "the chat template does not parse (line 1" in refused.stderr


def _ollama_serve(assets: Assets, tmp_path: Path, port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "TIERLOCAL_HOME": str(tmp_path / "tl"), "OLLAMA_MODELS": str(tmp_path / "models"), **own_home(tmp_path / "home")}
    argv = [sys.executable, "-m", "tierlocal", "serve", str(assets.gemma_gguf), "--engine", "ollama", "--ollama", str(assets.ollama)]
    return subprocess.Popen(
        [*argv, "--port", str(port), "--ctx", "1024", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )


def test_ollama_gets_gemmas_go_template_and_stop_string(assets: Assets, tmp_path: Path) -> None:
    port = free_port()
    process = _ollama_serve(assets, tmp_path, port)
    try:
        ready = first_json_document(process)
        name = ready["actual"]["ollama_model"]
        assert ready["chat_template"]["ollama_template"] == PROMPT_FORMATS["gemma"].ollama_template
        client = ollama.Client(host=f"http://127.0.0.1:{port}")
        assert "<end_of_turn>" in (client.show(name).parameters or "")
        answer = client.chat(model=name, messages=[{"role": "user", "content": "Say hello"}], options={"num_predict": 16, "temperature": 0})
        client.close()
        assert answer.message.content and not any(marker in answer.message.content for marker in CHATML_MARKERS), answer.message.content
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.parametrize("name", sorted(PROMPT_FORMATS))
def test_go_templates_build_the_prompt_llama_cpps_built_in_builds(assets: Assets, tmp_path: Path, name: str) -> None:
    """The same four-turn conversation through llama-server's built-in (/apply-template, then
    /tokenize) and through Ollama with tierlocal's Go template (prompt_eval_count): the same
    number of tokens, on the Gemma vocabulary."""
    engine_port, ollama_port = free_port(), free_port()
    argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, engine_port, "--no-jinja", "--chat-template", name, ctx=1024, parallel=1)
    with running(argv, tmp_path / "ls.log", f"http://127.0.0.1:{engine_port}/health"):
        url = f"http://127.0.0.1:{engine_port}"
        prompt = httpx2.post(f"{url}/apply-template", json={"messages": CONVERSATION}).json()["prompt"]
        tokens = httpx2.post(f"{url}/tokenize", json={"content": prompt, "add_special": True, "parse_special": True}).json()["tokens"]
    env = {"OLLAMA_HOST": f"127.0.0.1:{ollama_port}", "OLLAMA_MODELS": str(tmp_path / "models"), "HOME": str(tmp_path / "home")}
    with running([str(assets.ollama), "serve"], tmp_path / "ollama.log", f"http://127.0.0.1:{ollama_port}/api/version", env=env):
        client = ollama.Client(host=f"http://127.0.0.1:{ollama_port}")
        form = PROMPT_FORMATS[name]
        client.create(model=f"fmt-{name}", files={assets.gemma_gguf.name: client.create_blob(assets.gemma_gguf)}, template=form.ollama_template)
        reply = client.chat(model=f"fmt-{name}", messages=CONVERSATION, options={"num_predict": 1, "temperature": 0, "num_ctx": 1024})
        client.close()
    assert all(marker in prompt for marker in form.turn_markers)
    assert reply.prompt_eval_count == len(tokens), prompt


@pytest.mark.parametrize("name", sorted(PROMPT_FORMATS))
def test_tierlocals_jinja_templates_build_the_prompt_llama_cpps_built_in_builds(assets: Assets, tmp_path: Path, name: str) -> None:
    """The same four-turn conversation, and one message with the generation prompt, through
    llama-server's built-in (--no-jinja) and through tierlocal's Jinja template of it: the same
    prompt, character for character."""
    path = jinja_template(name)
    assert path is not None
    prompts = []
    for args in (("--no-jinja", "--chat-template", name), ("--jinja", "--chat-template-file", str(path))):
        port = free_port()
        argv = llama_server_argv(assets.llama_server_cpu, assets.gemma_gguf, port, *args, ctx=512, parallel=1)
        with running(argv, tmp_path / f"{args[0]}.log", f"http://127.0.0.1:{port}/health"):
            url = f"http://127.0.0.1:{port}/apply-template"
            prompts.append([httpx2.post(url, json={"messages": messages}).json()["prompt"] for messages in (CONVERSATION, CONVERSATION[1:2])])
    assert prompts[0] == prompts[1]
    assert all(marker in prompts[1][0] for marker in PROMPT_FORMATS[name].turn_markers)


#: An agent's weather tool, as OpenAI's and Anthropic's clients send it.
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
#: Two questions answered through the tool: the third is asked as the model saw the first two answered.
CITIES = (("Rome", "sunny"), ("Paris", "rainy"))


def _openai_history() -> list[dict]:  # type: ignore[type-arg]
    messages: list[dict] = []  # type: ignore[type-arg]
    for index, (city, weather) in enumerate(CITIES):
        call = {"id": f"call_{index}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": weather},
            {"role": "assistant", "content": f"It is {weather} in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Oslo?"}]


def _anthropic_history() -> list[dict]:  # type: ignore[type-arg]
    messages: list[dict] = []  # type: ignore[type-arg]
    for index, (city, weather) in enumerate(CITIES):
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{index}", "name": "get_weather", "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{index}", "content": weather}]},
            {"role": "assistant", "content": f"It is {weather} in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Oslo?"}]


def test_tool_calls_work_on_a_model_without_a_template_through_both_clients(assets: Assets, tmp_path: Path) -> None:
    """Issue 47: the Gemma file has no chat template, and serve gave llama-server its built-in
    (--no-jinja), so every request with tools — every coding agent's — failed with 500 "tools
    param requires --jinja flag". With tierlocal's Jinja template the tools reach the prompt, and
    the call the model writes (greedy, after two calls in the conversation) comes back as a
    tool call through the real openai and anthropic clients."""
    import anthropic

    port = free_port()
    with serving(assets, tmp_path, "--ctx", "2048", "--port", str(port)) as (_process, ready):
        assert ready["chat_template"]["tools"].startswith("described to the model in the <tool_call> convention")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="gemma",
            messages=_openai_history(),
            tools=[{"type": "function", "function": WEATHER}],
            max_tokens=40,
            temperature=0,  # type: ignore[arg-type, list-item]
        )
        client.close()
        calls = answer.choices[0].message.tool_calls or []
        assert [(call.function.name, json.loads(call.function.arguments)) for call in calls] == [("get_weather", {"city": "Oslo"})], answer  # type: ignore[union-attr]
        messages = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
        reply = messages.messages.create(
            model="gemma",
            max_tokens=40,
            extra_body={"temperature": 0},  # this client's create() takes no temperature of its own
            messages=_anthropic_history(),  # type: ignore[arg-type]
            tools=[{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}],  # type: ignore[list-item]
        )
        messages.close()
        uses = [(block.name, block.input) for block in reply.content if block.type == "tool_use"]
        assert uses == [("get_weather", {"city": "Oslo"})], reply

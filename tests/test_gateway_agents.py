"""Coding agents' protocols through the gateway, end to end: the real ``anthropic`` SDK (Claude
Code's protocol, Anthropic Messages) and the real ``openai`` SDK's Responses (Codex CLI's) against
`tierlocal gateway`, in front of a real llama-server (local, which answers both natively) and a
second real llama-server started with --api-key, standing in for Moonshot's Anthropic endpoint
(it speaks the same protocol: x-api-key, /v1/messages, Anthropic's events)."""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

from tests.support.assets import Assets
from tests.support.engines import free_port
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.gatewayrun import Engine, RunningGateway, gateway, gemma_server

HOSTED_KEY = "sk-hosted-" + secrets.token_hex(16)
ENV = {"HOSTED_KEY": HOSTED_KEY}
# Moonshot's K3 prices (USD per million tokens) as the gateway's config gives them, read here
# independently of the gateway to check what it charged.
PRICES = {"input_cache_hit": 0.30, "input_cache_miss": 3.00, "output": 15.00}
PRICES_TOML = '[prices."kimi-k3"]\ninput_cache_hit = 0.30\ninput_cache_miss = 3.00\noutput = 15.00\n'
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather now in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# A conversation in which the assistant called the tool and the tool answered.
TOOL_TURNS: list[dict[str, object]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 degrees and sunny"}]},
]


@pytest.fixture(scope="module")
def local_engine(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with gemma_server(assets, tmp_path_factory.mktemp("local"), ctx=4096, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def hosted_engine(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with gemma_server(assets, tmp_path_factory.mktemp("hosted"), "--api-key", HOSTED_KEY, ctx=4096, parallel=4) as engine:
        yield engine


def route(model: str, *targets: str) -> str:
    return f'[[routes]]\nmodel = "{model}"\ntargets = [\n' + "".join(f"  {target},\n" for target in targets) + "]\n"


def local(url: str, speaks: str = "") -> str:
    return f'{{ url = "{url}", model = "qwen3-14b"{speaks} }}'


def moonshot_anthropic(url: str) -> str:
    """Moonshot's Anthropic endpoint as a target: its base, its key, Messages only."""
    return f'{{ url = "{url}", model = "kimi-k3", api_key_env = "HOSTED_KEY", speaks = ["messages"] }}'


def usage_rows(gw: RunningGateway) -> list[sqlite3.Row]:
    with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return db.execute("SELECT * FROM usage ORDER BY id").fetchall()


def claude(gw: RunningGateway, key: str | None = None) -> anthropic.Anthropic:
    """The Anthropic SDK as Claude Code points it at the gateway (ANTHROPIC_BASE_URL is the root)."""
    return anthropic.Anthropic(base_url=gw.url.removesuffix("/v1"), api_key=key or gw.key, max_retries=0)


def cost(prompt: int, cached: int, completion: int) -> float:
    return ((prompt - cached) * PRICES["input_cache_miss"] + cached * PRICES["input_cache_hit"] + completion * PRICES["output"]) / 1e6


def test_messages_stream_with_a_tool_result_is_answered_natively_by_the_local_engine(tmp_path: Path, local_engine: Engine) -> None:
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url))) as gw:
        api = claude(gw)
        with api.messages.stream(model="qwen3-14b", max_tokens=8, tools=[WEATHER_TOOL], messages=TOOL_TURNS) as stream:  # type: ignore[arg-type]
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
        assert final.usage.output_tokens == 8 and final.usage.input_tokens > 20 and final.stop_reason == "max_tokens"
        whole = api.messages.create(model="qwen3-14b", max_tokens=3, messages=[{"role": "user", "content": "Say hello"}])
        assert whole.type == "message" and whole.usage.output_tokens == 3 and whole.content[0].type == "text"
        counted = api.messages.count_tokens(model="qwen3-14b", tools=[WEATHER_TOOL], messages=TOOL_TURNS)  # type: ignore[arg-type]
        assert counted.input_tokens > 20

        rows = usage_rows(gw)
        assert [row["protocol"] for row in rows] == ["messages", "messages", "count_tokens"]
        assert all(row["upstream_protocol"] is None and row["status"] == 200 and row["tier"] == 2 for row in rows)
        assert rows[0]["completion_tokens"] == 8 and rows[1]["completion_tokens"] == 3 and rows[2]["completion_tokens"] == 0
        assert rows[0]["prompt_tokens"] == final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
        assert rows[0]["request_id"] == final.id and rows[1]["request_id"] == whole.id
        assert "protocol=messages" in gw.log_text()
        # On start the gateway says what Claude Code and Codex CLI set, never with a key in it.
        root = gw.url.removesuffix("/v1")
        assert f"export ANTHROPIC_BASE_URL={root}" in gw.log_text() and f'base_url = "{gw.url}"' in gw.log_text()
        assert gw.key not in gw.log_text()


def test_responses_stream_is_answered_natively_and_server_state_is_refused(tmp_path: Path, local_engine: Engine) -> None:
    with gateway(tmp_path, route("qwen3-14b", local(local_engine.url))) as gw:
        api = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0)
        events = list(api.responses.create(model="qwen3-14b", input="Say hello", max_output_tokens=6, stream=True))
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        completed = events[-1].response  # type: ignore[union-attr]
        assert completed.usage is not None and completed.usage.output_tokens == 6
        text = "".join(event.delta for event in events if event.type == "response.output_text.delta")  # type: ignore[union-attr]
        assert text
        whole = api.responses.create(model="qwen3-14b", input="Say hello", max_output_tokens=3)
        assert whole.usage is not None and whole.usage.output_tokens == 3 and whole.output_text
        with pytest.raises(openai.BadRequestError) as refused:
            api.responses.create(model="qwen3-14b", input="And then?", previous_response_id=whole.id, max_output_tokens=3)
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == "previous_response_id" and "keep" in error["message"]

        rows = usage_rows(gw)
        assert [row["protocol"] for row in rows] == ["responses", "responses"]  # the refusal was never admitted
        assert rows[0]["completion_tokens"] == 6 and rows[0]["prompt_tokens"] == completed.usage.input_tokens
        assert rows[0]["request_id"] == completed.id and rows[1]["request_id"] == whole.id


def test_messages_through_a_chat_only_target_are_translated_tool_calls_included(tmp_path: Path, local_engine: Engine) -> None:
    """A chat-only target (the real engine behind a proxy that, where asked, turns its answer into
    a tool call as a tool-calling model gives one): Messages in, chat to the target, Messages out."""
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as upstream:
        with gateway(tmp_path, route("qwen3-14b", local(upstream.url + "/v1", ', speaks = ["chat_completions"]'))) as gw:
            api = claude(gw)
            with api.messages.stream(model="qwen3-14b", max_tokens=8, tools=[WEATHER_TOOL], messages=TOOL_TURNS, system="Be brief.") as stream:  # type: ignore[arg-type]
                kinds = [event.type for event in stream]
                final = stream.get_final_message()
            assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"] and "content_block_delta" in kinds
            assert final.model == "qwen3-14b" and final.usage.output_tokens == 8 and final.stop_reason == "max_tokens"
            assert final.content[0].type == "text" and final.content[0].text
            # What the target got: chat completions, the tool result a tool message after the call.
            sent = upstream.seen[0]
            assert sent.path == "/v1/chat/completions" and sent.body["stream_options"] == {"include_usage": True}
            assert [message["role"] for message in sent.body["messages"]] == ["system", "user", "assistant", "tool"]
            assert sent.body["messages"][2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            assert sent.body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_01", "content": "18 degrees and sunny"}
            assert sent.body["tools"][0]["function"]["parameters"] == WEATHER_TOOL["input_schema"]
            # A tool call comes back as a tool_use block, whole and streamed.
            weather: list[dict[str, object]] = [{"role": "user", "content": "What is the weather in Paris?"}]
            force = {"type": "tool", "name": "get_weather"}
            upstream.queue(Fault(tool_call=("get_weather", {"city": "Paris"})))
            whole = api.messages.create(model="qwen3-14b", max_tokens=16, tools=[WEATHER_TOOL], tool_choice=force, messages=weather)  # type: ignore[arg-type]
            assert upstream.seen[-1].body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
            assert whole.stop_reason == "tool_use" and [(b.type, b.name, b.input) for b in whole.content] == [  # type: ignore[union-attr]
                ("tool_use", "get_weather", {"city": "Paris"})
            ]
            upstream.queue(Fault(tool_call=("get_weather", {"city": "Paris"})))
            with api.messages.stream(model="qwen3-14b", max_tokens=16, tools=[WEATHER_TOOL], messages=weather) as stream:  # type: ignore[arg-type]
                streamed = stream.get_final_message()
            assert streamed.stop_reason == "tool_use" and [(b.type, b.name, b.input) for b in streamed.content] == [  # type: ignore[union-attr]
                ("tool_use", "get_weather", {"city": "Paris"})
            ]
            assert streamed.usage.output_tokens > 0

            rows = usage_rows(gw)
            assert [(row["protocol"], row["upstream_protocol"]) for row in rows] == [("messages", "chat_completions")] * 3
            assert rows[0]["completion_tokens"] == 8 and rows[0]["prompt_tokens"] == final.usage.input_tokens + (
                final.usage.cache_read_input_tokens or 0
            )
            assert rows[2]["completion_tokens"] == streamed.usage.output_tokens
            assert "protocol=messages->chat_completions" in gw.log_text()


def test_with_the_local_engine_down_messages_fall_back_to_moonshots_anthropic_endpoint(tmp_path: Path, hosted_engine: Engine) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    # (a route named kimi-k3 would have its local targets dropped here: K3 cannot fit this machine)
    body = route("coder", local(dead), moonshot_anthropic(hosted_engine.url)) + PRICES_TOML
    with gateway(tmp_path, body, env=ENV) as gw:
        api = claude(gw)
        with api.messages.stream(model="coder", max_tokens=6, tools=[WEATHER_TOOL], messages=TOOL_TURNS) as stream:  # type: ignore[arg-type]
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text and final.usage.output_tokens == 6
        (row,) = usage_rows(gw)
        assert row["protocol"] == "messages" and row["upstream_protocol"] is None and row["tier"] == 3
        assert row["target"] == f"{hosted_engine.url}#kimi-k3" and row["fallback_reason"] == "engine_down"
        prompt = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
        assert row["prompt_tokens"] == prompt and row["completion_tokens"] == 6
        assert row["cost_usd"] == pytest.approx(cost(prompt, final.usage.cache_read_input_tokens or 0, 6), rel=1e-9)
        assert HOSTED_KEY not in gw.log_text()


FUNCTION_TOOL = {"type": "function", "name": "get_weather", "description": "The weather now in a city.", "parameters": WEATHER_TOOL["input_schema"]}
# The same conversation in Responses' items: the call and its output.
TOOL_ITEMS: list[dict[str, object]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_01", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_01", "output": "18 degrees and sunny"},
]


def test_responses_through_a_chat_only_target_are_translated_tool_calls_included(tmp_path: Path, local_engine: Engine) -> None:
    with FaultProxy(f"http://127.0.0.1:{local_engine.port}") as upstream:
        with gateway(tmp_path, route("qwen3-14b", local(upstream.url + "/v1", ', speaks = ["chat_completions"]'))) as gw:
            api = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0)
            stream = api.responses.create(
                model="qwen3-14b",
                instructions="Be brief.",
                input=TOOL_ITEMS,
                tools=[FUNCTION_TOOL],
                max_output_tokens=6,
                stream=True,  # type: ignore[arg-type, list-item]
            )
            events = list(stream)
            kinds = [event.type for event in events]
            assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
            assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
            assert [event.sequence_number for event in events] == list(range(len(events)))
            final = events[-1].response  # type: ignore[union-attr]
            text = "".join(event.delta for event in events if event.type == "response.output_text.delta")  # type: ignore[union-attr]
            assert final.output_text == text and text and final.usage is not None and final.usage.output_tokens == 6
            assert final.incomplete_details is not None and final.incomplete_details.reason == "max_output_tokens"
            sent = upstream.seen[0].body
            assert [message["role"] for message in sent["messages"]] == ["system", "user", "assistant", "tool"] and sent["max_tokens"] == 6
            assert sent["messages"][3] == {"role": "tool", "tool_call_id": "call_01", "content": "18 degrees and sunny"}
            assert sent["tools"][0]["function"]["name"] == "get_weather"
            # Tool calls come back as function_call items, whole and streamed.
            upstream.queue(Fault(tool_call=("get_weather", {"city": "Paris"})))
            whole = api.responses.create(model="qwen3-14b", input="Weather in Paris?", tools=[FUNCTION_TOOL], max_output_tokens=16)  # type: ignore[list-item]
            assert [(item.type, item.name, item.arguments) for item in whole.output] == [("function_call", "get_weather", '{"city": "Paris"}')]  # type: ignore[union-attr]
            upstream.queue(Fault(tool_call=("get_weather", {"city": "Paris"})))
            streamed = list(api.responses.create(model="qwen3-14b", input="Weather?", tools=[FUNCTION_TOOL], max_output_tokens=16, stream=True))  # type: ignore[list-item]
            done = streamed[-1].response  # type: ignore[union-attr]
            assert streamed[-1].type == "response.completed" and done.output[0].type == "function_call"
            assert json.loads(done.output[0].arguments) == {"city": "Paris"}  # type: ignore[union-attr]
            deltas = "".join(event.delta for event in streamed if event.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
            assert json.loads(deltas) == {"city": "Paris"}
            with pytest.raises(openai.BadRequestError) as refused:  # a built-in tool cannot run on a chat-only target
                api.responses.create(model="qwen3-14b", input="Search", tools=[{"type": "web_search"}])  # type: ignore[list-item]
            assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "tools"

            rows = usage_rows(gw)
            assert [(row["protocol"], row["upstream_protocol"]) for row in rows[:3]] == [("responses", "chat_completions")] * 3
            assert rows[0]["completion_tokens"] == 6 and rows[0]["prompt_tokens"] == final.usage.input_tokens


def test_a_fallback_may_cross_protocols(tmp_path: Path, hosted_engine: Engine) -> None:
    """The local engine (native) down, K3 behind Moonshot's two endpoints: Messages go on to the
    Anthropic one natively; Responses, which it does not speak, to the chat one, translated; a
    route with the chat endpoint alone takes both translated. The usage rows say which."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    chat_url = hosted_engine.url.replace("127.0.0.1", "localhost")  # the same stand-in, told apart by its address
    hosted_chat = f'{{ url = "{chat_url}", model = "kimi-k3", api_key_env = "HOSTED_KEY" }}'
    body = route("coder", local(dead), moonshot_anthropic(hosted_engine.url), hosted_chat) + route("chat-only", local(dead), hosted_chat)
    with gateway(tmp_path, body + PRICES_TOML, env=ENV) as gw:
        api = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0)
        for model in ("coder", "chat-only"):
            with claude(gw).messages.stream(model=model, max_tokens=5, messages=TOOL_TURNS, tools=[WEATHER_TOOL]) as stream:  # type: ignore[arg-type]
                message = stream.get_final_message()
            response = api.responses.create(model=model, input=TOOL_ITEMS, tools=[FUNCTION_TOOL], max_output_tokens=5)  # type: ignore[arg-type, list-item]
            assert message.usage.output_tokens == 5 and response.usage is not None and response.usage.output_tokens == 5
        rows = usage_rows(gw)
        anthropic_target, chat_target = f"{hosted_engine.url}#kimi-k3", f"{chat_url}#kimi-k3"
        assert [(row["route"], row["protocol"], row["upstream_protocol"], row["target"]) for row in rows] == [
            ("coder", "messages", None, anthropic_target),
            ("coder", "responses", "chat_completions", chat_target),
            ("chat-only", "messages", "chat_completions", chat_target),
            ("chat-only", "responses", "chat_completions", chat_target),
        ]
        assert [(row["fallback_reason"], row["tier"]) for row in rows] == [("engine_down", 3)] * 4
        for row in rows:
            assert row["cost_usd"] == pytest.approx(cost(row["prompt_tokens"], row["cached_tokens"], 5), rel=1e-9)
        assert HOSTED_KEY not in gw.log_text()


def test_an_anthropic_client_gets_anthropic_errors(tmp_path: Path, local_engine: Engine, hosted_engine: Engine) -> None:
    """A bad key, an exhausted budget, an upstream that fails and a route that cannot speak
    Messages: each the Anthropic SDK's own exception, each body in Anthropic's shape."""
    dead = f"http://127.0.0.1:{free_port()}/v1"
    body = (
        route("kimi-k3", moonshot_anthropic(hosted_engine.url))
        + route("down", local(dead))
        + route("chat-only", local(local_engine.url, ', speaks = ["chat_completions"]'))
        + PRICES_TOML
        + '[[users]]\nname = "alice"\nbudget_usd = 0.0000001\nbudget_period = "day"\n'
    )
    hello: list[dict[str, object]] = [{"role": "user", "content": "Say hello"}]
    with gateway(tmp_path, body, env=ENV) as gw:
        cases: list[tuple[type[anthropic.APIStatusError], str, str, anthropic.Anthropic]] = [
            (anthropic.AuthenticationError, "kimi-k3", "authentication_error", claude(gw, "tlk-not-a-key")),
            (anthropic.RateLimitError, "kimi-k3", "rate_limit_error", claude(gw)),
            (anthropic.InternalServerError, "down", "overloaded_error", claude(gw)),
            (anthropic.BadRequestError, "chat-only", "invalid_request_error", claude(gw)),  # a count needs the target's tokenizer
        ]
        for error_class, model, kind, api in cases:
            with pytest.raises(error_class) as caught:
                if model == "chat-only":
                    api.messages.count_tokens(model=model, messages=hello)  # type: ignore[arg-type]
                else:
                    api.messages.create(model=model, max_tokens=4, messages=hello)  # type: ignore[arg-type]
            error = caught.value.body
            assert isinstance(error, dict) and error["type"] == "error" and error["error"]["type"] == kind, (model, error)
            assert set(error["error"]) == {"type", "message"} and HOSTED_KEY not in json.dumps(error)
        raw = httpx2.post(
            gw.url + "/messages", json={"model": "down", "max_tokens": 4, "messages": hello, "stream": True}, headers=gw.headers(), timeout=60
        )
        assert raw.status_code == 503 and raw.json()["type"] == "error" and "[DONE]" not in raw.text
        assert HOSTED_KEY not in gw.log_text()


@pytest.mark.parametrize("workers", [1, 2])
def test_fifty_concurrent_messages_never_overrun_a_budget(tmp_path: Path, hosted_engine: Engine, workers: int) -> None:
    budget = 0.005
    body = route("kimi-k3", moonshot_anthropic(hosted_engine.url)) + PRICES_TOML + f'[[users]]\nname = "bob"\nbudget_usd = {budget}\n'
    request = {"model": "kimi-k3", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hello"}]}
    with gateway(tmp_path, body, user="bob", env=ENV, workers=workers) as gw:
        headers = {"x-api-key": gw.key, "anthropic-version": "2023-06-01"}
        with ThreadPoolExecutor(50) as pool:
            burst = list(pool.map(lambda _: httpx2.post(gw.url + "/messages", json=request, headers=headers, timeout=120), range(50)))
        statuses = [answer.status_code for answer in burst]
        assert set(statuses) == {200, 429} and statuses.count(429) > 0, statuses
        assert all(answer.json()["error"]["type"] == "rate_limit_error" for answer in burst if answer.status_code == 429)
        served = [answer.json() for answer in burst if answer.status_code == 200]
        assert all(message["type"] == "message" for message in served)
        rows = usage_rows(gw)
        assert len(rows) == len(served) and all(row["protocol"] == "messages" for row in rows)
        spent = sum(cost(row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) for row in rows)
        assert spent <= budget and spent == pytest.approx(sum(row["cost_usd"] for row in rows), rel=1e-9)
        with sqlite3.connect(gw.state_dir / "gateway.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM reservations").fetchone()[0] == 0

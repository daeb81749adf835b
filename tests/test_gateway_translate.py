"""The gateway's protocol seam without a network: each dialect's usage, stream framing and error
shape, the choice of native or translated leg, and the Messages/Responses ⇄ chat translators —
their output validated against the real ``anthropic`` and ``openai`` SDKs' own types."""

from __future__ import annotations

import json

import anthropic.types as anthropic_types
import openai.types.responses as responses_types
import pytest
from pydantic import TypeAdapter

from tierlocal.gateway.dialects import DIALECTS
from tierlocal.gateway.dialects.anthropic_messages import anthropic_error_body, anthropic_usage
from tierlocal.gateway.dialects.leg import leg_for
from tierlocal.gateway.dialects.openai_responses import responses_usage
from tierlocal.gateway.dialects.translate_messages import ChatToMessagesStream, chat_to_message, messages_to_chat
from tierlocal.gateway.dialects.translate_responses import ChatToResponsesStream, chat_to_response, responses_to_chat
from tierlocal.gateway.dialects.translation import TranslationError
from tierlocal.gateway.pricing import Usage
from tierlocal.gateway.wire import Exchange

MESSAGES, RESPONSES, CHAT, COUNT = (DIALECTS[path] for path in ("/v1/messages", "/v1/responses", "/v1/chat/completions", "/v1/messages/count_tokens"))
STREAM_EVENT = TypeAdapter(anthropic_types.RawMessageStreamEvent)
RESPONSE_EVENT = TypeAdapter(responses_types.ResponseStreamEvent)


def _events(raw: list[bytes]) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    out = []
    for event in raw:
        lines = event.decode().strip().split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), event
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def _chunk(delta: dict, finish: str | None = None) -> dict:  # type: ignore[type-arg]
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _exchange(dialect: object) -> Exchange:
    from tierlocal.gateway.config import Route, Target, User

    return Exchange(User("a"), Route("m", (Target("http://127.0.0.1:1/v1", "m"),)), True, True, 10, dialect)  # type: ignore[arg-type]


def test_each_protocol_reads_its_own_usage_fields() -> None:
    # Anthropic: the input not read from the cache, the cache reads and writes apart.
    assert anthropic_usage({"input_tokens": 60, "cache_read_input_tokens": 40, "cache_creation_input_tokens": 5, "output_tokens": 7}) == Usage(
        105, 40, 7
    )
    start = anthropic_usage({"input_tokens": 60, "cache_read_input_tokens": 40, "output_tokens": 1})
    assert anthropic_usage({"output_tokens": 12}, start) == Usage(100, 40, 12)  # a message_delta keeps the input
    assert anthropic_usage({"input_tokens": -3, "output_tokens": True}) == Usage(0, 0, 0)  # hostile values count as nothing
    # Responses: cached tokens are inside input_tokens.
    assert responses_usage({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 30}, "output_tokens": 9}) == Usage(100, 30, 9)
    assert MESSAGES.usage_from({"usage": "nonsense"}) is None and COUNT.usage_from({"input_tokens": 5}) is None


def test_native_streams_are_relayed_with_their_usage_and_end() -> None:
    exchange = _exchange(MESSAGES)
    batch = [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":50,"output_tokens":1}}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    out, done, failure = MESSAGES.forward_batch(batch, exchange, str)
    assert out == batch and done and failure is None and exchange.usage == Usage(50, 0, 4) and exchange.content_events == 1
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
    assert MESSAGES.forward_batch([error], _exchange(MESSAGES), str) == ([], False, "busy")
    tail = _events([MESSAGES.stream_tail("cut", exchange)])
    assert tail == [("error", {"type": "error", "error": {"type": "api_error", "message": "the upstream stream broke: cut"}})]
    assert MESSAGES.stream_tail(None, exchange) == b"" and b"[DONE]" not in MESSAGES.stream_tail("x", exchange)

    exchange = _exchange(RESPONSES)
    completed = {"type": "response.completed", "response": {"id": "resp_1", "usage": {"input_tokens": 20, "output_tokens": 3}}}
    out, done, _ = RESPONSES.forward_batch([b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n"], exchange, str)
    assert done and exchange.usage == Usage(20, 0, 3)
    failed = b'event: error\ndata: {"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":3}\n\n'
    assert RESPONSES.forward_batch([failed], _exchange(RESPONSES), str)[2] == "boom"
    assert RESPONSE_EVENT.validate_python(_events([RESPONSES.stream_tail("cut", exchange)])[0][1]).type == "error"


def test_errors_take_the_clients_shape() -> None:
    for status, kind in (
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (429, "rate_limit_error"),
        (503, "overloaded_error"),
        (502, "api_error"),
    ):
        body = MESSAGES.error_body(status, "why", "anything", "code")
        assert body == anthropic_error_body(status, "why") == {"type": "error", "error": {"type": kind, "message": "why"}}
        assert anthropic_types.ErrorResponse.model_validate(body).error.type == kind
    assert RESPONSES.error_body(400, "why", "invalid_request_error", "c", "p") == {
        "error": {"message": "why", "type": "invalid_request_error", "param": "p", "code": "c"}
    }


def test_a_leg_is_native_where_the_target_speaks_the_protocol_else_translated_else_none() -> None:
    assert not leg_for(MESSAGES, ("messages",)).translated  # type: ignore[union-attr]
    assert leg_for(MESSAGES, ("chat_completions",)).upstream.name == "chat_completions"  # type: ignore[union-attr]
    assert leg_for(RESPONSES, ("chat_completions", "messages")).translated  # type: ignore[union-attr]
    assert leg_for(COUNT, ("chat_completions",)) is None  # a count needs the target's own tokenizer
    assert leg_for(CHAT, ("messages",)) is None  # nothing is translated into Messages
    assert RESPONSES.unsupported({"previous_response_id": "resp_1"})[0] == "previous_response_id"  # type: ignore[index]
    assert RESPONSES.unsupported({"background": False, "store": True}) is None


def test_a_messages_request_becomes_chat_with_tools_and_results_in_order() -> None:
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"],
        "top_k": 5,
        "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "…"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "bad"}], "is_error": True},
                    {"type": "text", "text": "and?"},
                ],
            },
        ],
    }
    chat = messages_to_chat(body)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "user"]  # type: ignore[attr-defined, index]
    messages = chat["messages"]
    assert messages[1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}  # type: ignore[index]
    assert messages[2] == {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }  # type: ignore[index]
    assert messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "Error: bad"}  # type: ignore[index]
    assert chat["stop"] == ["END"] and chat["tool_choice"] == "required" and "top_k" not in chat and chat["max_tokens"] == 64
    for bad in (
        {"messages": "x"},
        {"messages": [{"role": "system", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
    ):
        with pytest.raises(TranslationError):
            messages_to_chat(bad)
    with pytest.raises(TranslationError) as server_tool:
        messages_to_chat({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert server_tool.value.param == "tools"


def test_a_chat_answer_becomes_a_message_whole_and_streamed() -> None:
    document = {
        "id": "c1",
        "choices": [
            {
                "message": {"content": "hi", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": '{"x": 2}'}}]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    message = anthropic_types.Message.model_validate(chat_to_message(document, "m", Usage(100, 40, 7)))
    assert [block.type for block in message.content] == ["text", "tool_use"] and message.stop_reason == "tool_use"
    assert message.content[1].input == {"x": 2} and message.usage.input_tokens == 60 and message.usage.cache_read_input_tokens == 40  # type: ignore[union-attr]

    stream = ChatToMessagesStream("m")
    raw = stream.feed(_chunk({"role": "assistant", "content": "He"})) + stream.feed(_chunk({"content": "llo"}))
    raw += stream.feed(_chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": '{"x"'}}]}))
    raw += stream.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}, "tool_calls"))
    raw += stream.finish(Usage(10, 0, 5))
    events = _events(raw)
    for _name, data in events:
        STREAM_EVENT.validate_python(data)  # every event is one the SDK knows
    names = [name for name, _ in events]
    starts = ["content_block_start", "content_block_delta", "content_block_delta", "content_block_stop"]
    assert names == ["message_start", *starts, *starts, "message_delta", "message_stop"]
    assert [data.get("index") for name, data in events if name == "content_block_start"] == [0, 1]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] == 5
    empty = _events(ChatToMessagesStream("m").finish(None))  # nothing came: still a whole, valid stream
    assert [name for name, _ in empty] == ["message_start", "message_delta", "message_stop"]


def test_a_responses_request_becomes_chat() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "max_output_tokens": 32,
        "input": [
            {"role": "developer", "content": "Rules."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
    }
    chat = responses_to_chat(body)
    messages = chat["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool"]  # type: ignore[attr-defined, index]
    assert [call["id"] for call in messages[3]["tool_calls"]] == ["c1", "c2"]  # type: ignore[index]  # one assistant turn, two calls
    assert chat["max_tokens"] == 32 and chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True}}
    for bad in (
        {"input": [{"type": "file_search_call"}]},
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
    ):
        with pytest.raises(TranslationError):
            responses_to_chat(bad)


def test_a_chat_answer_becomes_a_response_whole_and_streamed() -> None:
    document = {"id": "c1", "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}]}
    response = responses_types.Response.model_validate(chat_to_response(document, "m", Usage(10, 4, 3)))
    assert response.status == "incomplete" and response.output_text == "hi" and response.usage.input_tokens_details.cached_tokens == 4  # type: ignore[union-attr]

    stream = ChatToResponsesStream("m")
    raw = stream.feed(_chunk({"content": "He"})) + stream.feed(_chunk({"content": "llo"}))
    raw += stream.feed(_chunk({"tool_calls": [{"index": 0, "id": "call_9", "function": {"name": "f", "arguments": '{"x"'}}]}))
    raw += stream.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "tool_calls"))
    raw += stream.finish(Usage(8, 0, 6))
    events = [RESPONSE_EVENT.validate_python(data) for _name, data in _events(raw)]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Hello" and final.output[1].type == "function_call" and json.loads(final.output[1].arguments) == {"x": 1}  # type: ignore[union-attr]
    assert final.usage.output_tokens == 6  # type: ignore[union-attr]

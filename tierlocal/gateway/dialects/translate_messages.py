"""Anthropic Messages ⇄ OpenAI chat completions, for a target that speaks only chat: the request
translated to chat, the answer (whole, or chunk by chunk as a stream) translated back into
Messages. Pure (no I/O). Field by field as Anthropic's Messages reference and OpenAI's chat
reference define them:

- ``system`` → a system message; text and image blocks → content parts; an assistant's
  ``tool_use`` blocks → ``tool_calls`` (input as JSON arguments); a user's ``tool_result`` blocks →
  ``tool`` messages (before the user's other blocks); ``thinking`` blocks are the model's own and
  are not sent back.
- ``tools`` (``input_schema``) → functions (``parameters``); ``tool_choice`` auto/any/tool/none →
  auto/required/the function/none; ``stop_sequences`` → ``stop``; ``max_tokens``, ``temperature``,
  ``top_p``, ``stream`` as they are. Fields chat has no place for (``top_k``, ``thinking``,
  ``metadata``, ``service_tier``) are not sent.
- Back: text → a text block, ``tool_calls`` → ``tool_use`` blocks, ``reasoning_content`` → a
  thinking block; ``finish_reason`` stop/length/tool_calls → ``stop_reason``
  end_turn/max_tokens/tool_use; usage with the cache reads apart from the rest of the input.
"""

from __future__ import annotations

import json

from ..pricing import Usage
from .translation import TranslationError, sse_event

__all__ = ["messages_to_chat", "chat_to_message", "ChatToMessagesStream", "STOP_REASONS"]

#: Chat's finish_reason → Messages' stop_reason.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}
#: Request fields copied as they are.
SAME_FIELDS = ("max_tokens", "temperature", "top_p", "stream")


def _text_of(content: object) -> str:
    """A tool result's or a system prompt's text: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(block.get("text", "")) for block in content if isinstance(block, dict) and block.get("type") == "text")
    return ""


def _part(block: dict[str, object]) -> dict[str, object] | None:
    """A user's text or image block as a chat content part (None: not content)."""
    if block.get("type") == "text":
        return {"type": "text", "text": block.get("text", "")}
    if block.get("type") == "image":
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == "base64":
            return {"type": "image_url", "image_url": {"url": f"data:{source.get('media_type')};base64,{source.get('data')}"}}
        if isinstance(source, dict) and source.get("type") == "url":
            return {"type": "image_url", "image_url": {"url": source.get("url")}}
    if block.get("type") in ("thinking", "redacted_thinking"):
        return None
    raise TranslationError("messages", f"a {block.get('type')!r} block cannot be sent to a target that speaks only chat completions")


def _assistant(blocks: list[object]) -> dict[str, object]:
    text = "".join(str(block.get("text", "")) for block in blocks if isinstance(block, dict) and block.get("type") == "text")
    calls = [
        {"id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}}
        for block in blocks
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    message: dict[str, object] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[object]) -> list[dict[str, object]]:
    """A user turn: its tool results first (each a ``tool`` message), then its other content."""
    out: list[dict[str, object]] = []
    parts: list[dict[str, object]] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise TranslationError("messages", "a content block must be an object")
        if block.get("type") == "tool_result":
            text = _text_of(block.get("content"))
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": f"Error: {text}" if block.get("is_error") else text})
        elif (part := _part(block)) is not None:
            parts.append(part)
    if parts:
        out.append({"role": "user", "content": parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts})
    return out


def _messages(body: dict[str, object]) -> list[dict[str, object]]:
    chat: list[dict[str, object]] = []
    if body.get("system"):
        chat.append({"role": "system", "content": _text_of(body["system"])})
    turns = body.get("messages")
    if not isinstance(turns, list):
        raise TranslationError("messages", "messages must be a list")
    for turn in turns:
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise TranslationError("messages", "each message has a role, user or assistant")
        content = turn.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise TranslationError("messages", "a message's content is a string or a list of blocks")
        chat.extend([_assistant(blocks)] if turn["role"] == "assistant" else _user(blocks))
    return chat


def _tool_choice(choice: object) -> object:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))


def messages_to_chat(body: dict[str, object]) -> dict[str, object]:
    """A Messages request as a chat completions request.

    Raises:
        TranslationError: a block or tool chat has no form for (e.g. a document, a server tool).
    """
    chat: dict[str, object] = {name: body[name] for name in SAME_FIELDS if name in body}
    chat["model"] = body.get("model")
    chat["messages"] = _messages(body)
    if isinstance(body.get("stop_sequences"), list):
        chat["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        for tool in tools:
            if not isinstance(tool, dict) or "input_schema" not in tool:
                raise TranslationError("tools", "only client tools (name, input_schema) can be sent to a target that speaks only chat completions")
        chat["tools"] = [
            {
                "type": "function",
                "function": {"name": tool.get("name"), "description": tool.get("description", ""), "parameters": tool["input_schema"]},
            }
            for tool in tools
        ]
        if (choice := _tool_choice(body.get("tool_choice"))) is not None:
            chat["tool_choice"] = choice
    return chat


def _usage_json(usage: Usage | None) -> dict[str, int]:
    usage = usage or Usage()
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }


def chat_to_message(document: dict[str, object], model: str, usage: Usage | None) -> dict[str, object]:
    """A whole chat completion as a Messages response for ``model`` (the id the client sent)."""
    choices = document.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    content: list[dict[str, object]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
    return {
        "id": f"msg_{document.get('id', '')}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": _usage_json(usage),
    }


class ChatToMessagesStream:
    """Chat completion chunks in, Messages events out: ``message_start`` at the first chunk, a
    content block per text run, thinking run or tool call (started, its deltas, stopped), and
    at the end ``message_delta`` (stop reason, usage) and ``message_stop``."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.started = False
        self.block: tuple[str, int] | None = None  # ("text" | "thinking" | "tool:<index>", block index)
        self.blocks = 0
        self.stop_reason = "end_turn"

    def _open(self, kind: str, start: dict[str, object]) -> list[bytes]:
        out = self._close()
        self.block = (kind, self.blocks)
        self.blocks += 1
        out.append(sse_event("content_block_start", {"type": "content_block_start", "index": self.block[1], "content_block": start}))
        return out

    def _close(self) -> list[bytes]:
        if self.block is None:
            return []
        index, self.block = self.block[1], None
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, kind: str, start: dict[str, object], delta: dict[str, object]) -> list[bytes]:
        out = self._open(kind, start) if self.block is None or self.block[0] != kind else []
        assert self.block is not None
        out.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": self.block[1], "delta": delta}))
        return out

    def feed(self, chunk: dict[str, object]) -> list[bytes]:
        """The events one chat chunk makes."""
        out: list[bytes] = []
        if not self.started:
            self.started = True
            message: dict[str, object] = {"id": f"msg_{chunk.get('id', '')}", "type": "message", "role": "assistant", "model": self.model}
            message.update(content=[], stop_reason=None, stop_sequence=None, usage={"input_tokens": 0, "output_tokens": 0})
            out.append(sse_event("message_start", {"type": "message_start", "message": message}))
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                out += self._deltas(delta)
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.stop_reason = STOP_REASONS.get(str(choice["finish_reason"]), "end_turn")
        return out

    def _deltas(self, delta: dict[str, object]) -> list[bytes]:
        out: list[bytes] = []
        if delta.get("reasoning_content"):
            out += self._delta("thinking", {"type": "thinking", "thinking": ""}, {"type": "thinking_delta", "thinking": delta["reasoning_content"]})
        if delta.get("content"):
            out += self._delta("text", {"type": "text", "text": ""}, {"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:  # type: ignore[attr-defined]
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            kind = f"tool:{call.get('index', 0)}"
            if self.block is None or self.block[0] != kind:
                start: dict[str, object] = {
                    "type": "tool_use",
                    "id": call.get("id") or f"toolu_{self.blocks}",
                    "name": function.get("name"),
                    "input": {},
                }
                out += self._open(kind, start)
            if function.get("arguments"):
                out += self._delta(kind, {}, {"type": "input_json_delta", "partial_json": function["arguments"]})
        return out

    def finish(self, usage: Usage | None) -> list[bytes]:
        """The closing events, with the usage the upstream reported."""
        out = self.feed({}) if not self.started else []
        out += self._close()
        delta: dict[str, object] = {"type": "message_delta", "delta": {"stop_reason": self.stop_reason, "stop_sequence": None}}
        delta["usage"] = _usage_json(usage)
        out.append(sse_event("message_delta", delta))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out

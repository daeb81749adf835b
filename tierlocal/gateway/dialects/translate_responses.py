"""OpenAI Responses ⇄ chat completions, for a target that speaks only chat: the request
translated to chat, the answer (whole, or chunk by chunk as a stream) translated back into a
Response. Pure (no I/O). Field by field as OpenAI's Responses and chat references define them:

- ``instructions`` → a system message; ``input`` (a string, or items): messages with
  ``input_text``/``output_text``/``input_image`` parts → chat messages (``developer`` as system),
  ``function_call`` items → an assistant's ``tool_calls``, ``function_call_output`` → ``tool``
  messages; ``reasoning`` items are the model's own and are not sent back.
- ``tools`` (function tools only: built-in tools such as web search need OpenAI's servers) →
  functions; ``tool_choice``; ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``,
  ``parallel_tool_calls``, ``stream``; ``text.format`` json_schema → ``response_format``.
- Back: one ``message`` output item with the text, one ``function_call`` item per tool call;
  status ``incomplete`` (``max_output_tokens``) when the output was cut; usage with the cached
  input inside ``input_tokens``. A stream gives the same items with their events, each with a
  ``sequence_number``, ending with ``response.completed`` (or ``response.incomplete``).
"""

from __future__ import annotations

import time

from ..pricing import Usage
from .translation import TranslationError, sse_event

__all__ = ["responses_to_chat", "chat_to_response", "ChatToResponsesStream"]

SAME_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "stream")
PART_TYPES = {"input_text": "text", "output_text": "text", "text": "text"}


def _content(content: object) -> object:
    """A message item's content as chat content: a string, or parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError("input", "a message's content is a string or a list of parts")
    parts: list[dict[str, object]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in PART_TYPES and isinstance(part, dict):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image" and isinstance(part, dict):
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise TranslationError("input", f"a {kind!r} part cannot be sent to a target that speaks only chat completions")
    if all(part["type"] == "text" for part in parts):
        return "".join(str(part["text"]) for part in parts)
    return parts


def _items(items: list[object]) -> list[dict[str, object]]:
    chat: list[dict[str, object]] = []
    for item in items:
        if not isinstance(item, dict):
            raise TranslationError("input", "each input item is an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(str(item.get("role")), item.get("role"))
            chat.append({"role": role, "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            if chat and chat[-1]["role"] == "assistant" and not chat[-1].get("content"):
                calls = chat[-1].setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(call)
            else:
                chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            chat.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output if isinstance(output, str) else _content(output)})
        elif kind != "reasoning":
            raise TranslationError("input", f"a {kind!r} item cannot be sent to a target that speaks only chat completions")
    return chat


def _tools(tools: list[object], choice: object) -> dict[str, object]:
    out: dict[str, object] = {}
    functions = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise TranslationError("tools", f"the built-in tool {kind!r} needs OpenAI's servers; a chat-only target takes function tools only")
        function = {name: tool[name] for name in ("name", "description", "parameters", "strict") if name in tool}
        functions.append({"type": "function", "function": function})
    out["tools"] = functions
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return out


def responses_to_chat(body: dict[str, object]) -> dict[str, object]:
    """A Responses request as a chat completions request.

    Raises:
        TranslationError: an item, part or tool chat has no form for.
    """
    chat: dict[str, object] = {name: body[name] for name in SAME_FIELDS if name in body}
    chat["model"] = body.get("model")
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    messages: list[dict[str, object]] = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    given = body.get("input")
    messages += [{"role": "user", "content": given}] if isinstance(given, str) else _items(given if isinstance(given, list) else [])
    chat["messages"] = messages
    if isinstance(body.get("tools"), list) and body["tools"]:
        chat.update(_tools(body["tools"], body.get("tool_choice")))  # type: ignore[arg-type]
    text = body.get("text")
    form = text.get("format") if isinstance(text, dict) else None
    if isinstance(form, dict) and form.get("type") == "json_schema":
        schema = {name: form[name] for name in ("name", "schema", "strict", "description") if name in form}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(form, dict) and form.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _usage_json(usage: Usage | None) -> dict[str, object]:
    usage = usage or Usage()
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part] if status == "completed" else []}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, object]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def _response(response_id: str, model: str, output: list[dict[str, object]], finish: str | None, usage: Usage | None) -> dict[str, object]:
    cut = finish == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None if usage is None else _usage_json(usage),
    }


def chat_to_response(document: dict[str, object], model: str, usage: Usage | None) -> dict[str, object]:
    """A whole chat completion as a Response for ``model`` (the id the client sent)."""
    choices = document.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    base = str(document.get("id", ""))
    output: list[dict[str, object]] = []
    if message.get("content"):
        output.append(_message_item(f"msg_{base}", str(message["content"])))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        output.append(_call_item(str(call.get("id")), str(function.get("name")), str(function.get("arguments") or "")))
    finish = choice.get("finish_reason")
    return _response(f"resp_{base}", model, output, finish if isinstance(finish, str) else None, usage)


class ChatToResponsesStream:
    """Chat completion chunks in, Responses events out: ``response.created`` and
    ``response.in_progress`` at the first chunk; a message item for the text (added, its part,
    text deltas, done) and a function_call item per tool call (added, argument deltas, done);
    at the end ``response.completed`` (``response.incomplete`` when cut) with the usage."""

    def __init__(self, model: str) -> None:
        self.model, self.response_id, self.sequence = model, "", 0
        self.text: str | None = None  # the message item's text so far (None: no message item)
        self.calls: dict[int, dict[str, str]] = {}  # chat tool-call index → id, name, arguments
        self.output: list[tuple[str, int]] = []  # output items in order: ("text", 0) or ("call", index)
        self.finish_reason: str | None = None

    def _event(self, name: str, data: dict[str, object]) -> bytes:
        self.sequence += 1
        return sse_event(name, {"type": name, **data, "sequence_number": self.sequence - 1})

    def _item(self, kind: str, key: int, status: str = "completed") -> dict[str, object]:
        if kind == "text":
            return _message_item(f"msg_{self.response_id}", self.text or "", status)
        call = self.calls[key]
        return _call_item(call["id"], call["name"], call["arguments"] if status == "completed" else "", status)

    def feed(self, chunk: dict[str, object]) -> list[bytes]:
        out: list[bytes] = []
        if not self.response_id:
            self.response_id = f"resp_{chunk.get('id', '') or 'gateway'}"
            started = _response(self.response_id, self.model, [], None, None) | {"status": "in_progress"}
            out += [self._event("response.created", {"response": started}), self._event("response.in_progress", {"response": started})]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out += self._text(delta) + self._tool_calls(delta)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def _text(self, delta: dict[str, object]) -> list[bytes]:
        if not delta.get("content"):
            return []
        out: list[bytes] = []
        index = len(self.output)
        if self.text is None:
            self.text = ""
            self.output.append(("text", 0))
            out.append(self._event("response.output_item.added", {"output_index": index, "item": self._item("text", 0, "in_progress")}))
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": f"msg_{self.response_id}", "output_index": index, "content_index": 0}
            out.append(self._event("response.content_part.added", {**where, "part": part}))
        self.text += str(delta["content"])
        position = self.output.index(("text", 0))
        where = {"item_id": f"msg_{self.response_id}", "output_index": position, "content_index": 0}
        return [*out, self._event("response.output_text.delta", {**where, "delta": delta["content"], "logprobs": []})]

    def _tool_calls(self, delta: dict[str, object]) -> list[bytes]:
        out: list[bytes] = []
        for call in delta.get("tool_calls") or []:  # type: ignore[attr-defined]
            if not isinstance(call, dict):
                continue
            key = int(call.get("index", 0))
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            if key not in self.calls:
                self.calls[key] = {"id": str(call.get("id") or f"call_{key}"), "name": str(function.get("name") or ""), "arguments": ""}
                self.output.append(("call", key))
                item = self._item("call", key, "in_progress")
                out.append(self._event("response.output_item.added", {"output_index": len(self.output) - 1, "item": item}))
            if function.get("arguments"):
                self.calls[key]["arguments"] += str(function["arguments"])
                where = {"item_id": f"fc_{self.calls[key]['id']}", "output_index": self.output.index(("call", key))}
                out.append(self._event("response.function_call_arguments.delta", {**where, "delta": function["arguments"]}))
        return out

    def finish(self, usage: Usage | None) -> list[bytes]:
        out = self.feed({}) if not self.response_id else []
        items: list[dict[str, object]] = []
        for index, (kind, key) in enumerate(self.output):
            item = self._item(kind, key)
            if kind == "text":
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                out.append(self._event("response.output_text.done", {**where, "text": self.text, "logprobs": []}))
                part: dict[str, object] = {"type": "output_text", "text": self.text, "annotations": []}
                out.append(self._event("response.content_part.done", {**where, "part": part}))
            else:
                where = {"item_id": item["id"], "output_index": index}
                out.append(self._event("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}))
            out.append(self._event("response.output_item.done", {"output_index": index, "item": item}))
            items.append(item)
        final = _response(self.response_id, self.model, items, self.finish_reason, usage)
        out.append(self._event("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final}))
        return out

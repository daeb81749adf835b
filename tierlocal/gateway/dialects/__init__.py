"""The protocols the gateway speaks, one :class:`~.base.Dialect` each, by the gateway path that
clients send them to."""

from __future__ import annotations

from .anthropic_messages import AnthropicCountTokens, AnthropicMessages
from .base import Dialect, Forwarded
from .openai_chat import OpenAIChat, OpenAICompletions, OpenAIEmbeddings, OpenAIRerank
from .openai_responses import OpenAIResponses

__all__ = ["Dialect", "Forwarded", "DIALECTS", "FAMILIES", "OPENAI_CHAT", "dialect_for_path"]

#: The protocol whose shape answers a path the gateway does not route (e.g. /v1/models, 404s).
OPENAI_CHAT = OpenAIChat()
#: Client path → its protocol, for every path the gateway proxies.
DIALECTS: dict[str, Dialect] = {
    dialect.client_path: dialect
    for dialect in (
        OPENAI_CHAT,
        OpenAICompletions(),
        OpenAIEmbeddings(),
        OpenAIRerank(),
        AnthropicMessages(),
        AnthropicCountTokens(),
        OpenAIResponses(),
    )
}
#: The protocol families a target may list in ``speaks``.
FAMILIES = tuple(sorted({dialect.family for dialect in DIALECTS.values()}))


def dialect_for_path(path: str) -> Dialect:
    """The protocol of a request to ``path`` (OpenAI's for any path the gateway does not proxy)."""
    return DIALECTS.get(path, OPENAI_CHAT)

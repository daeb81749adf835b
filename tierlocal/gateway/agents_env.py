"""What a developer sets to point a coding agent at the gateway, as lines to print and as data:
Claude Code (Anthropic Messages: ``ANTHROPIC_BASE_URL`` is the root, the SDK adds /v1/messages;
``ANTHROPIC_AUTH_TOKEN`` is sent as a bearer token, ``ANTHROPIC_MODEL`` picks the model), Codex
CLI (OpenAI Responses: a ``[model_providers.…]`` table in ``~/.codex/config.toml`` with
``base_url``, ``env_key`` and ``wire_api = "responses"``), and any chat-completions client
(``OPENAI_BASE_URL``/``OPENAI_API_KEY``). The key itself is never printed: each developer has
their own (``tierlocal gateway keys add NAME``). Pure."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

__all__ = ["AgentSetup", "agent_setups", "KEY_PLACEHOLDER"]

#: Where each developer's own gateway key goes.
KEY_PLACEHOLDER = "<your gateway key>"


@dataclass(frozen=True)
class AgentSetup:
    """One agent: its name, the protocol it speaks, and what to set (shell lines and, for Codex,
    the config file's lines)."""

    agent: str
    protocol: str
    environment: dict[str, str]
    config_file: str | None = None
    config_lines: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "agent": self.agent,
            "protocol": self.protocol,
            "environment": self.environment,
            "config_file": self.config_file,
            "config_lines": list(self.config_lines),
        }

    def lines(self) -> list[str]:
        out = [f"{self.agent} ({self.protocol}):"]
        out += [f"  export {name}={shlex.quote(value)}" for name, value in self.environment.items()]
        if self.config_file:
            out.append(f"  and in {self.config_file}:")
            out += [f"    {line}" for line in self.config_lines]
        return out


def agent_setups(root_url: str, model: str) -> tuple[AgentSetup, ...]:
    """The setups for a gateway at ``root_url`` (scheme, host and port, no path) and the model id
    a developer asks for first."""
    return (
        AgentSetup(
            "Claude Code",
            "Anthropic Messages",
            {"ANTHROPIC_BASE_URL": root_url, "ANTHROPIC_AUTH_TOKEN": KEY_PLACEHOLDER, "ANTHROPIC_MODEL": model},
        ),
        AgentSetup(
            "Codex CLI",
            "OpenAI Responses",
            {"TIERLOCAL_API_KEY": KEY_PLACEHOLDER},
            "~/.codex/config.toml",
            (
                'model_provider = "tierlocal"',
                f'model = "{model}"',
                "[model_providers.tierlocal]",
                'name = "tierlocal gateway"',
                f'base_url = "{root_url}/v1"',
                'env_key = "TIERLOCAL_API_KEY"',
                'wire_api = "responses"',
            ),
        ),
        AgentSetup("chat-completions agents", "OpenAI chat completions", {"OPENAI_BASE_URL": f"{root_url}/v1", "OPENAI_API_KEY": KEY_PLACEHOLDER}),
    )

"""The chat template a GGUF header carries (``tokenizer.chat_template``): present, absent or
unparseable, and which known prompt family it belongs to. Pure.

A template is Jinja source written for Hugging Face's ``apply_chat_template``; llama-server
renders it with its own Jinja engine. Whether it parses is checked here with Jinja2 (the
reference implementation; compiled, never rendered); ``tierlocal serve`` then checks what the
engine really renders (``POST /apply-template``). The family comes from the turn markers in
the source, the way llama.cpp's ``llm_chat_detect_template`` (src/llama-chat.cpp) tells its
built-in formats apart; family names are llama-server's built-in template names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .parse import GGUFHeader
from .tables import Keys

__all__ = ["ChatTemplateInfo", "chat_template_info", "describe_template", "template_family", "FAMILY_MARKERS", "MAX_TEMPLATE_CHARS"]

#: The key, and the prefix of named variants (``tokenizer.chat_template.tool_use``).
TEMPLATE_KEY = Keys.Tokenizer.CHAT_TEMPLATE

#: Longer than any real template (the largest, with tool schemas, are ~40 KB): refused unparsed.
MAX_TEMPLATE_CHARS = 1 << 20

#: (family, markers that must all be in the source), most specific first. Markers from the
#: models' own tokenizer configs; names as llama-server's ``--chat-template`` built-ins.
FAMILY_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kimi-k2", ("<|im_middle|>",)),
    ("gpt-oss", ("<|start|>", "<|channel|>")),
    ("phi4", ("<|im_start|>", "<|im_sep|>")),
    ("chatml", ("<|im_start|>",)),
    ("mistral-v7", ("[INST]", "[SYSTEM_PROMPT]")),
    ("llama2", ("[INST]", "<<SYS>>")),
    ("mistral-v3", ("[INST]",)),
    ("phi3", ("<|assistant|>", "<|end|>")),
    ("chatglm4", ("[gMASK]<sop>",)),
    ("gemma", ("<start_of_turn>",)),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>")),
    ("llama4", ("<|header_start|>", "<|header_end|>")),
    ("deepseek3", ("<｜User｜>", "<｜Assistant｜>")),
    ("granite", ("<|start_of_role|>",)),
    ("exaone3", ("[|assistant|]", "[|endofturn|]")),
)

# Hugging Face's `{% generation %}` block marks assistant text for training masks; it renders
# its body unchanged. Jinja2 needs an extension for it, so it is removed before parsing.
_GENERATION_TAG = re.compile(r"{%-?\s*(?:end)?generation\s*-?%}")


@dataclass(frozen=True)
class ChatTemplateInfo:
    """What a header says of its chat template. ``status``: ``present``, ``absent`` or
    ``unparseable`` (``error`` says why); ``family``: a known family whose markers it has
    (None: none known); ``chars``: its length; ``variants``: named extra templates."""

    status: str
    family: str | None = None
    chars: int = 0
    error: str | None = None
    variants: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.status == "present"

    def describe(self) -> str:
        """One line for tables: ``present (gemma, 1,532 chars)``, ``absent``, ``unparseable: …``."""
        if self.status == "absent":
            return "absent"
        if self.status == "unparseable":
            return f"unparseable: {self.error}"
        return f"present ({self.family or 'unknown family'}, {self.chars:,} chars)"

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "family": self.family, "chars": self.chars, "error": self.error, "variants": list(self.variants)}


def template_family(source: str) -> str | None:
    """The first family in :data:`FAMILY_MARKERS` whose markers are all in ``source``."""
    return next((family for family, markers in FAMILY_MARKERS if all(marker in source for marker in markers)), None)


def _parse_error(source: str) -> str | None:
    """Why Jinja2 cannot compile ``source`` (None: it can). Compiling runs nothing."""
    import jinja2.sandbox  # only when there is a template to read: a slow import

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        environment.parse(_GENERATION_TAG.sub("", source))
    except jinja2.TemplateSyntaxError as exc:
        return f"line {exc.lineno}: {exc.message}"
    except RecursionError:
        return "nested too deeply to parse"
    return None


def chat_template_info(headers: Sequence[GGUFHeader]) -> ChatTemplateInfo:
    """The chat template of a model (the first shard's header holds it)."""
    metadata = headers[0].metadata if headers else {}
    variants = tuple(sorted(key.removeprefix(TEMPLATE_KEY + ".") for key in metadata if key.startswith(TEMPLATE_KEY + ".")))
    source = metadata.get(TEMPLATE_KEY)
    return describe_template(source if isinstance(source, str) else None, variants)


def describe_template(source: str | None, variants: tuple[str, ...] = ()) -> ChatTemplateInfo:
    """Status and family of one template's Jinja source (None or blank: absent)."""
    if source is None or not source.strip():
        return ChatTemplateInfo("absent", variants=variants)
    family = template_family(source)
    if len(source) > MAX_TEMPLATE_CHARS:
        return ChatTemplateInfo("unparseable", family, len(source), f"{len(source):,} characters, more than any real template", variants)
    error = _parse_error(source)
    return ChatTemplateInfo("unparseable" if error else "present", family, len(source), error, variants)

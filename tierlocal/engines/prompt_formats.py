"""Which prompt format an engine uses for a model, and how to tell it. Pure.

A GGUF's own template (``tokenizer.chat_template``) wins. Without one — or with one the
engine cannot parse — llama-server silently falls back to ChatML, which a Gemma or Llama
model was never trained on. So tierlocal picks the format for the architecture and passes it
explicitly: for llama-server, tierlocal's Jinja template of that format (``--jinja
--chat-template-file``, chat_templates/ beside this module: the built-in's turns, plus tools,
which the built-in formats refuse: "tools param requires --jinja flag"), or, for a format it
has none of, the built-in ``--no-jinja --chat-template NAME`` (with Jinja on, llama-server takes
the name as a literal one-word template and renders ``"gemma"``); for Ollama, a Go ``TEMPLATE``
with its stop strings. The Go templates below were written for tierlocal from the formats'
turn markers; each renders a conversation as the matching llama.cpp built-in does, with the
generation prompt after a final user turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..gguf.chat_template import FAMILY_MARKERS, ChatTemplateInfo

__all__ = [
    "PromptFormat",
    "PROMPT_FORMATS",
    "TemplateChoice",
    "format_for_architecture",
    "choose_template",
    "render_problem",
    "jinja_template",
    "PROBE_MESSAGE",
    "CHAT_TEMPLATES_DIR",
]

#: The one-message conversation serve renders through the engine before saying ready.
PROBE_MESSAGE = "Reply with one word."
#: tierlocal's Jinja templates, one per format of :data:`PROMPT_FORMATS` (NAME.jinja; what they
#: hold: README.md there).
CHAT_TEMPLATES_DIR = Path(__file__).with_name("chat_templates")
#: The formats Qwen 2.5+ and Hermes were trained with tools in: the convention tierlocal's templates use.
_TOOL_CONVENTION_FAMILIES = frozenset({"chatml"})


@dataclass(frozen=True)
class PromptFormat:
    """One family's format: llama-server's built-in ``name``; the markers a rendered
    one-user-message conversation holds; an Ollama Go template and its stop strings; the
    name llama-cpp-python's ``--chat_format`` gives it (None: it has none)."""

    name: str
    turn_markers: tuple[str, ...]
    ollama_template: str
    ollama_stop: tuple[str, ...]
    python_chat_format: str | None = None


def _go_template(turn: str, end: str) -> str:
    """A Go template: each message as ``turn`` (with ``{role}``), its content, ``end``; after a
    final user turn, the assistant's turn opened (the generation prompt). A final assistant
    turn is left open, to be continued."""
    opening = turn.replace("{role}", "{{ .Role }}")
    generation = turn.replace("{role}", "assistant")
    return (
        "{{- range $i, $_ := .Messages }}\n"
        "{{- $last := eq (len (slice $.Messages $i)) 1 -}}\n"
        + opening
        + '{{ .Content }}{{ if or (ne .Role "assistant") (not $last) }}'
        + end
        + "{{ end }}\n"
        '{{- if and $last (ne .Role "assistant") }}' + generation + "{{ end }}\n"
        "{{- end }}"
    )


_GEMMA_GO_TEMPLATE = (
    '{{- $system := "" }}\n'
    "{{- range $i, $_ := .Messages }}\n"
    "{{- $last := eq (len (slice $.Messages $i)) 1 }}\n"
    '{{- if eq .Role "system" }}{{ $system = .Content }}\n'
    '{{- else if eq .Role "assistant" }}<start_of_turn>model\n'
    "{{ .Content }}{{ if not $last }}<end_of_turn>\n"
    "{{ end }}\n"
    "{{- else }}<start_of_turn>user\n"
    '{{ if $system }}{{ $system }}\n\n{{ $system = "" }}{{ end }}{{ .Content }}<end_of_turn>\n'
    "{{ if $last }}<start_of_turn>model\n"
    "{{ end }}\n"
    "{{- end }}\n"
    "{{- end }}"
)

PROMPT_FORMATS: Mapping[str, PromptFormat] = {
    # Gemma has no system turn: like llama.cpp's built-in, a system message opens the next
    # user turn, followed by a blank line.
    "gemma": PromptFormat(
        "gemma",
        ("<start_of_turn>user\n", "<end_of_turn>", "<start_of_turn>model\n"),
        _GEMMA_GO_TEMPLATE,
        ("<end_of_turn>",),
        "gemma",
    ),
    "chatml": PromptFormat(
        "chatml",
        ("<|im_start|>user\n", "<|im_end|>", "<|im_start|>assistant\n"),
        _go_template("<|im_start|>{role}\n", "<|im_end|>\n"),
        ("<|im_start|>", "<|im_end|>"),
        "chatml",
    ),
    "llama3": PromptFormat(
        "llama3",
        ("<|start_header_id|>user<|end_header_id|>", "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>"),
        _go_template("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "llama-3",
    ),
    "phi3": PromptFormat(
        "phi3",
        ("<|user|>\n", "<|end|>", "<|assistant|>\n"),
        _go_template("<|{role}|>\n", "<|end|>\n"),
        ("<|end|>", "<|user|>", "<|assistant|>"),
    ),
}

#: general.architecture → format, where the architecture alone decides it (model cards:
#: Gemma 1–3n use <start_of_turn>; Qwen 2–3.5 use ChatML; Phi-3/3.5 use <|user|>/<|end|>).
_ARCHITECTURE_FORMATS = {
    **dict.fromkeys(("gemma", "gemma2", "gemma3", "gemma3n"), "gemma"),
    **dict.fromkeys(("qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "qwen3next", "qwen35", "qwen35moe"), "chatml"),
    "phi3": "phi3",
}


def format_for_architecture(architecture: str, tokenizer_model: str | None = None, tokenizer_pre: str | None = None) -> str | None:
    """The built-in format for a model without a usable template (None: not known). ``llama``
    is Llama 3.x only with its BPE tokenizer (``gpt2`` model, ``llama-bpe`` pre-tokenizer):
    Llama 2 and Mistral share the architecture with other formats."""
    if architecture == "llama":
        return "llama3" if tokenizer_model == "gpt2" and tokenizer_pre == "llama-bpe" else None
    return _ARCHITECTURE_FORMATS.get(architecture)


@dataclass(frozen=True)
class TemplateChoice:
    """The template an engine will use. ``source``: ``header`` (the file's own), ``builtin``
    (the engine's, chosen by tierlocal), ``name`` / ``file`` (the user's ``--chat-template``), or
    ``engine-default`` (nothing known: llama-server's ChatML fallback). ``family``: whose turn
    markers to expect; ``engine_args``: llama-server options; ``note``: what serve says;
    ``warning``: what the user should act on."""

    source: str
    name: str | None = None
    family: str | None = None
    path: str | None = None
    engine_args: tuple[str, ...] = ()
    note: str = ""
    warning: str | None = None
    #: The format's details where tierlocal has them (built-in choices only).
    prompt_format: PromptFormat | None = field(default=None, compare=False)
    #: What becomes of a request with ``tools`` (None: what the file's or the user's template does).
    tools: str | None = None

    @property
    def llama_server_note(self) -> str:
        """The note as llama-server serves it: a format tierlocal has a Jinja template of is that template."""
        if self.source in ("builtin", "name") and "--chat-template-file" in self.engine_args:
            return self.note.replace("llama-server's built-in", "tierlocal's Jinja template of llama-server's built-in")
        return self.note

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "name": self.name,
            "family": self.family,
            "path": self.path,
            "engine_args": list(self.engine_args),
            "note": self.llama_server_note,
            "warning": self.warning,
            "tools": self.tools,
        }


def jinja_template(name: str) -> Path | None:
    """tierlocal's Jinja template of the format ``name`` (None: it has none)."""
    return CHAT_TEMPLATES_DIR / f"{name}.jinja" if name in PROMPT_FORMATS else None


def _builtin(name: str, source: str, note: str) -> TemplateChoice:
    """The format ``name``: tierlocal's Jinja template of it where there is one (tools work),
    else llama-server's built-in (requests with tools fail)."""
    path = jinja_template(name)
    if path is None:
        tools = "requests with tools fail with a built-in format (llama-server needs --jinja for them): pass --chat-template FILE (Jinja)"
        return TemplateChoice(source, name, name, None, ("--no-jinja", "--chat-template", name), note, None, PROMPT_FORMATS.get(name), tools)
    trained = name in _TOOL_CONVENTION_FAMILIES
    tools = "described to the model in the <tool_call> convention" + (
        "" if trained else f" ({name} models were not trained on it: a small or older one may answer in prose instead)"
    )
    return TemplateChoice(source, name, name, None, ("--jinja", "--chat-template-file", str(path)), note, None, PROMPT_FORMATS[name], tools)


def choose_template(
    info: ChatTemplateInfo,
    architecture: str,
    *,
    tokenizer_model: str | None = None,
    tokenizer_pre: str | None = None,
    requested_name: str | None = None,
    requested_file: tuple[str, ChatTemplateInfo] | None = None,
    builtins: frozenset[str] | None = None,
) -> TemplateChoice:
    """The template to serve with: the user's ``--chat-template`` (a built-in name, or a file's
    path and what its text is), else the file's own if it parses, else the built-in for the
    family its markers show or for the architecture, else llama-server's fallback with a warning.
    ``builtins``: the names the engine knows (None: not known; any name is passed on)."""
    if requested_file is not None:
        path, file_info = requested_file
        return TemplateChoice(
            "file", None, file_info.family, path, ("--chat-template-file", path), f"using the chat template in {path} (--chat-template)"
        )
    if requested_name is not None:
        return _builtin(requested_name, "name", f"using llama-server's built-in chat template '{requested_name}' (--chat-template)")
    if info.usable:
        return TemplateChoice("header", None, info.family, note=f"using the file's own chat template ({info.family or 'unknown family'})")
    known = builtins if builtins is not None else frozenset(PROMPT_FORMATS) | {family for family, _ in FAMILY_MARKERS}
    why = "the file has no chat template" if info.status == "absent" else f"the file's chat template does not parse ({info.error})"
    if info.family is not None and info.family in known:
        return _builtin(info.family, "builtin", f"{why}; using llama-server's built-in '{info.family}', the family its turn markers show")
    name = format_for_architecture(architecture, tokenizer_model, tokenizer_pre)
    if name is not None and name in known:
        return _builtin(name, "builtin", f"{why}; using llama-server's built-in '{name}' for {architecture} (--chat-template to choose another)")
    return TemplateChoice(
        "engine-default",
        note=f"{why}; llama-server will fall back to ChatML",
        warning=f"{why} and tierlocal knows no prompt format for {architecture}: the engine will use ChatML, which the model may "
        "never have seen; pass --chat-template NAME|FILE",
    )


def render_problem(choice: TemplateChoice, rendered: str) -> str | None:
    """What is wrong with the prompt the engine built for :data:`PROBE_MESSAGE` from one user
    turn (None: it is right): the message missing, the family's turn markers missing, or
    ChatML where the family is not ChatML (llama-server's silent fallback)."""
    if PROBE_MESSAGE not in rendered:
        return f"the engine's prompt does not contain the message: {rendered[:160]!r}"
    expected = PROMPT_FORMATS.get(choice.family or "")
    if expected is not None:
        missing = [marker for marker in expected.turn_markers if marker not in rendered]
        if missing:
            return f"the engine's prompt lacks {choice.family}'s turn markers {missing}: {rendered[:160]!r}"
    family_markers = dict(FAMILY_MARKERS).get(choice.family or "", ())
    if choice.family is not None and "<|im_start|>" not in family_markers and "<|im_start|>" in rendered:
        return f"the engine renders ChatML for a {choice.family} model: {rendered[:160]!r}"
    return None

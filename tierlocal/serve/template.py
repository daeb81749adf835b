"""The chat template a serve session uses: the user's ``--chat-template NAME|FILE`` resolved
against the engine, and the prompt the running engine really builds (``POST /apply-template``)
checked before serve says ready. I/O: reads the template file, asks the engine."""

from __future__ import annotations

from pathlib import Path

from ..engines.prompt_formats import PROBE_MESSAGE, PROMPT_FORMATS, TemplateChoice, choose_template, render_problem
from ..errors import EngineFailed, UsageError
from ..gguf import ModelSummary
from ..gguf.chat_template import MAX_TEMPLATE_CHARS, describe_template

__all__ = ["resolve_template", "rendered_prompt", "TEMPLATE_HINT"]

#: What a user can do about a wrong or missing template.
TEMPLATE_HINT = "pass --chat-template NAME (one of llama-server's built-ins, e.g. gemma, llama3, chatml) or --chat-template FILE (Jinja)"


def _read_template_file(path: Path) -> str:
    if path.stat().st_size > MAX_TEMPLATE_CHARS * 4:
        raise UsageError(
            f"{path}: {path.stat().st_size:,} bytes is not a chat template", hint="give a Jinja template file (real ones are under 100 KB)"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text", hint="give a Jinja chat template file") from None


def resolve_template(
    requested: str | None, summary: ModelSummary, builtins: frozenset[str] | None, *, engine: str = "llama-server"
) -> TemplateChoice:
    """The template to serve ``summary``'s model with. ``requested``: ``--chat-template`` as typed
    (a file path, or a built-in name); ``builtins``: the names the engine lists (None: unknown).
    For Ollama (and llama-cpp-python), a name must be one tierlocal has a Go template (a
    ``--chat_format``) for, and files are refused.

    Raises:
        UsageError: a file that is not a parseable template, or a name the engine does not know.
    """
    if engine == "ollama":
        builtins = frozenset(PROMPT_FORMATS)
    elif engine == "python":
        builtins = frozenset(name for name, form in PROMPT_FORMATS.items() if form.python_chat_format)
    elif builtins is not None:
        builtins |= frozenset(PROMPT_FORMATS)  # tierlocal's Jinja templates of these, whatever the binary lists
    if requested is not None and Path(requested).is_file():
        if engine != "llama-server":
            raise UsageError(
                f"--chat-template {requested}: a Jinja file works with llama-server only", hint=f"give one of {', '.join(sorted(builtins or ()))}"
            )
        info = describe_template(_read_template_file(Path(requested)))
        if not info.usable:
            raise UsageError(
                f"{requested}: the chat template does not parse ({info.error or info.status})", hint="fix the template, or give a built-in name"
            )
        return choose_template(
            summary.chat_template,
            summary.architecture,
            tokenizer_model=summary.tokenizer_model,
            tokenizer_pre=summary.tokenizer_pre,
            requested_file=(str(Path(requested).resolve()), info),
        )
    if requested is not None and builtins and requested not in builtins:
        raise UsageError(
            f"--chat-template {requested!r} is neither a file nor a built-in template of {engine}",
            hint=f"give a Jinja file, or one of: {', '.join(sorted(builtins))}",
        )
    return choose_template(
        summary.chat_template,
        summary.architecture,
        tokenizer_model=summary.tokenizer_model,
        tokenizer_pre=summary.tokenizer_pre,
        requested_name=requested,
        builtins=builtins or None,
    )


def rendered_prompt(url: str, choice: TemplateChoice, headers: dict[str, str] | None = None) -> str | None:
    """The prompt llama-server at ``url`` builds from one user message, checked against the
    chosen template's family. None: this llama-server has no ``/apply-template``.

    Raises:
        EngineFailed: the prompt is not in the expected format (the hint names the flag).
    """
    import httpx2  # loads when a server is asked, not with every command that imports this

    try:
        response = httpx2.post(f"{url}/apply-template", json={"messages": [{"role": "user", "content": PROBE_MESSAGE}]}, headers=headers, timeout=30)
    except httpx2.HTTPError as exc:
        raise EngineFailed(f"llama-server did not answer /apply-template: {type(exc).__name__}", hint="see the engine log") from None
    if response.status_code == 404:
        return None
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if not isinstance(prompt, str):
        raise EngineFailed(f"llama-server could not apply the chat template (HTTP {response.status_code}): {response.text[:200]}", hint=TEMPLATE_HINT)
    problem = render_problem(choice, prompt)
    if problem is not None:
        raise EngineFailed(f"wrong prompt format: {problem}; nothing is served", hint=TEMPLATE_HINT)
    return prompt

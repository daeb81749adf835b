"""The documentation pages made from the code, so they cannot drift from it (an MkDocs hook).

A page asks for a generated section with a comment on a line of its own:

- ``<!-- generated: gateway-config -->``: the gateway's TOML reference, table by table, from
  the keys :mod:`tierlocal.gateway.config_values` accepts and the ``#:`` comment, type and
  default of each dataclass field behind them (:mod:`tierlocal.gateway.config`,
  :class:`tierlocal.published.ApiPrices`);
- ``<!-- generated: error-tree -->``: the tree of error classes and exit codes, from
  :mod:`tierlocal.errors`' docstring;
- ``<!-- generated: raises CLASS -->``: every place tierlocal raises CLASS (or builds one
  through ``config_error``), read from the source with :mod:`ast`: the message and the hint the
  user sees, ``…`` where the text is computed.

A key without a field or a comment, an unknown section, or an error class that is raised
nowhere fails the build (MkDocs runs strict), so tests/test_docs.py fails with it.
Written here because no MkDocs plugin reads ``#:`` field comments or raise sites.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tierlocal
from tierlocal import errors
from tierlocal.gateway import config, config_values
from tierlocal.published import ApiPrices

PACKAGE = Path(tierlocal.__file__).parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([A-Za-z]+))? -->$", re.MULTILINE)

#: (heading, what it is, the keys the file takes there, the dataclass behind them)
GATEWAY_TABLES: tuple[tuple[str, str, frozenset[str], type], ...] = (
    ("[server]", "Where the gateway listens and keeps its state; every key is optional.", config_values.SERVER_KEYS, config.ServerConfig),
    ("[[routes]]", "One per model id clients send; its targets are tried in order.", config_values.ROUTE_KEYS, config.Route),
    ("targets = [ { … } ]", "One upstream of a route, as an inline table in its `targets` list.", config_values.TARGET_KEYS, config.Target),
    (
        "[prices.MODEL]",
        "A hosted model's prices in USD per million tokens; recipes/apis.toml gives the dated defaults, this table overrides them. All three keys "
        "are needed.",
        config_values.PRICE_KEYS,
        ApiPrices,
    ),
    ("[[users]]", "One per gateway user: limits and a budget; `gateway keys add NAME` makes the user's key.", config_values.USER_KEYS, config.User),
)


def field_comments(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment (the lines just above it), joined into one sentence."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"([a-z_]+): ", stripped)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def _type_name(annotation: Any) -> str:
    """A field's type as the TOML file spells it."""
    names = {str: "string", int: "integer", float: "number", bool: "true/false", Path: "path"}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        parts = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(_type_name(part) for part in parts)
    if typing.get_origin(annotation) is tuple:
        return "list of strings" if typing.get_args(annotation)[:1] == (str,) else "list of tables"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        return "—" if field.default is None else f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"
    if field.default_factory is not dataclasses.MISSING:
        return "see the description"
    return "required"


def gateway_config_reference() -> str:
    """The TOML reference, table by table."""
    out: list[str] = []
    for heading, what, keys, cls in GATEWAY_TABLES:
        hints = typing.get_type_hints(cls)
        fields = {field.name: field for field in dataclasses.fields(cls)}
        comments = field_comments(cls)
        out += [f"### `{heading}`", "", what, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        order = {name: index for index, name in enumerate(fields)}
        for key in sorted(keys, key=lambda key: order.get(config_values.TOML_FIELDS.get(key, key), len(order))):
            name = config_values.TOML_FIELDS.get(key, key)
            if name not in fields:
                raise ValueError(f"{heading} key {key!r} has no field in {cls.__name__}")
            if name not in comments:
                raise ValueError(f"{cls.__name__}.{name} ({heading} {key}) has no #: comment to document it")
            meaning = comments[name].replace("|", "\\|")
            out.append(f"| `{key}` | {_type_name(hints[name])} | {_default(fields[name])} | {meaning} |")
        out.append("")
    return "\n".join(out)


def error_tree() -> str:
    """The class tree and exit codes of errors.py's docstring, as a code block."""
    doc = errors.__doc__ or ""
    tree = doc.split("The tree::", 1)[1].split("The CLI catches", 1)[0]
    return "```text\n" + inspect.cleandoc(tree) + "\n```\n"


def _text(node: ast.expr | None) -> str | None:
    """A message or hint as the user reads it: ``…`` where a value is filled in."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "…" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_text(node.left) or "…") + (_text(node.right) or "…")
    return "…"


def raise_sites() -> Iterator[tuple[str, str, str | None, str]]:
    """(class, message, hint, module) for every error tierlocal builds, in the source's order."""
    names = set(errors.__all__)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else None
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if callee in names and node.args:
                yield callee, _text(node.args[0]) or "…", _text(keywords.get("hint")), module
            elif callee == "config_error" and len(node.args) == 4:  # (source, where, what, hint) → UsageError
                yield "UsageError", f"FILE: {_text(node.args[1])}: {_text(node.args[2])}", _text(node.args[3]), module


def _cell(text: str) -> str:
    """Text for a table cell: pipes and newlines out; outside `code`, ``<``, ``>`` and ``*``
    kept literal rather than read as HTML or emphasis."""
    parts = text.replace("\n", " ").split("`")
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


def raises_table(name: str) -> str:
    """Every message and hint of one error class."""
    if name not in errors.__all__:
        raise ValueError(f"{name} is not an error class of tierlocal.errors")
    rows = sorted({(message, hint or "—", module) for cls, message, hint, module in raise_sites() if cls == name}, key=lambda row: (row[2], row[0]))
    cls = getattr(errors, name)
    head = f"Exit code {cls.exit_code}. {inspect.cleandoc(cls.__doc__ or '').splitlines()[0]}\n\n"
    if not rows:
        return head + "Not raised directly: its subclasses below are.\n"
    lines = ["| error: … | hint: … | where |", "|---|---|---|"]
    lines += [f"| {_cell(message)} | {_cell(hint)} | `{module}` |" for message, hint, module in rows]
    return head + "\n".join(lines) + "\n"


def render(match: re.Match[str]) -> str:
    kind, argument = match.group(1), match.group(2)
    if kind == "gateway-config":
        return gateway_config_reference()
    if kind == "error-tree":
        return error_tree()
    if kind == "raises" and argument:
        return raises_table(argument)
    raise ValueError(f"unknown generated section {match.group(0)!r}")


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs hook: fill every ``<!-- generated: … -->`` line of a page."""
    return MARKER.sub(render, markdown)

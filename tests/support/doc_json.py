"""The JSON shapes docs/reference/json.md documents, read from the page, and a check of a
command's real output against one (the notation is the page's own: see its introduction).

``documented_mismatches("status", obj)`` lists every difference (empty: the output is what
the page says); ``assert_documented`` fails with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from tests.support.cli import REPO_ROOT

__all__ = ["JSON_PAGE", "Shape", "shapes", "documented_mismatches", "assert_documented"]

JSON_PAGE = REPO_ROOT / "docs" / "reference" / "json.md"
_BLOCK = re.compile(r"<!-- json: ([a-z-]+) -->\n```text\n(.*?)\n```", re.DOTALL)
_TOKEN = re.compile(r"\s*(\{…\}|[{}\[\],:|?*…]|<[a-z-]+>|[A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Shape:
    """One documented value: ``kind`` is "any", "object", "map" (keyed by names), "list" or
    "ref"; ``nullable`` when it may be null."""

    kind: str
    keys: dict[str, Shape] = field(default_factory=dict)
    optional: set[str] = field(default_factory=set)
    open: bool = False
    item: Shape | None = None
    ref: str | None = None
    nullable: bool = False


class _Parser:
    def __init__(self, text: str, name: str) -> None:
        self.tokens = _TOKEN.findall(text)
        self.name = name
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"json.md block {self.name!r}: expected {expected or 'more'} at token {self.at}, got {token!r}")
        self.at += 1
        return token

    def value(self) -> Shape:
        token = self.peek()
        if token == "null":
            self.take()
            self.take("|")
            shape = self.value()
            shape.nullable = True
            return shape
        if token == "{…}":
            self.take()
            return Shape("object", open=True)
        if token == "{":
            return self.object()
        if token == "[":
            self.take()
            item = None if self.peek() == "]" else self.value()
            self.take("]")
            return Shape("list", item=item)
        if token is not None and token.startswith("<"):
            self.take()
            return Shape("ref", ref=token[1:-1])
        raise ValueError(f"json.md block {self.name!r}: unexpected {token!r}")

    def object(self) -> Shape:
        self.take("{")
        shape = Shape("object")
        while self.peek() != "}":
            token = self.take()
            if token == "…":
                shape.open = True
            elif token == "*":
                self.take(":")
                return self._map()
            else:
                if self.peek() == "?":
                    self.take()
                    shape.optional.add(token)
                shape.keys[token] = Shape("any")
                if self.peek() == ":":
                    self.take()
                    shape.keys[token] = self.value()
            if self.peek() == ",":
                self.take()
        self.take("}")
        return shape

    def _map(self) -> Shape:
        item = self.value()
        self.take("}")
        return Shape("map", item=item)


@cache
def shapes() -> dict[str, Shape]:
    """Every shape the page documents, by the name in its ``<!-- json: NAME -->`` line."""
    found: dict[str, Shape] = {}
    for name, body in _BLOCK.findall(JSON_PAGE.read_text()):
        parser = _Parser(body, name)
        found[name] = parser.value()
        if parser.peek() is not None:
            raise ValueError(f"json.md block {name!r}: text after the shape: {parser.peek()!r}")
    return found


def _check(shape: Shape, value: Any, where: str, problems: list[str]) -> None:
    if value is None and (shape.nullable or shape.kind == "any"):
        return
    if shape.kind == "ref":
        target = shapes().get(shape.ref or "")
        if target is None:
            problems.append(f"{where}: the page names <{shape.ref}>, which it does not define")
            return
        _check(target, value, where, problems)
        return
    if shape.kind == "any":
        return
    if shape.kind in ("object", "map") and not isinstance(value, dict):
        problems.append(f"{where}: documented as an object, is {type(value).__name__}")
        return
    if shape.kind == "list":
        if not isinstance(value, list):
            problems.append(f"{where}: documented as a list, is {type(value).__name__}")
        elif shape.item is not None:
            for index, element in enumerate(value):
                _check(shape.item, element, f"{where}[{index}]", problems)
        return
    if shape.kind == "map":
        assert shape.item is not None
        for key, element in value.items():
            _check(shape.item, element, f"{where}.{key}", problems)
        return
    if not shape.keys:  # {…}: an object whose keys the page does not list
        return
    missing = [key for key in shape.keys if key not in value and key not in shape.optional]
    extra = [] if shape.open else [key for key in value if key not in shape.keys]
    problems += [f"{where}: documented key {key!r} is missing" for key in missing]
    problems += [f"{where}: key {key!r} is not documented" for key in extra]
    for key, child in shape.keys.items():
        if key in value:
            _check(child, value[key], f"{where}.{key}", problems)


def documented_mismatches(name: str, value: Any) -> list[str]:
    """Every way ``value`` differs from the page's shape ``name``."""
    if name not in shapes():
        return [f"docs/reference/json.md documents no shape {name!r}"]
    problems: list[str] = []
    _check(shapes()[name], value, name, problems)
    return problems


def assert_documented(name: str, value: Any) -> None:
    """Fail, listing the differences, unless ``value`` is what docs/reference/json.md says."""
    problems = documented_mismatches(name, value)
    assert not problems, "output differs from docs/reference/json.md:\n" + "\n".join(problems[:20])

"""A client's request body, read as untrusted input: JSON parsed with a bound on nesting, and the
output it may produce — every field that multiplies or extends it (``n``, ``best_of``,
``max_completion_tokens``, ``max_tokens``) — turned into the number of tokens to reserve, with
the body rewritten so no upstream can generate more than was reserved. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .config import GatewayConfig, Route
from .dialects import Dialect
from .dialects.leg import leg_for
from .wire import Reject

__all__ = [
    "parse_json_object",
    "parse_request",
    "OutputLimits",
    "output_limits",
    "MAX_JSON_DEPTH",
    "MAX_CHOICES",
    "MAX_OUTPUT_TOKENS",
    "CAP_FIELDS",
    "CHOICE_FIELDS",
]

#: Deepest nesting of arrays and objects a request may have (OpenAI requests with tool schemas
#: nest a few dozen levels at most).
MAX_JSON_DEPTH = 128
#: Most choices a request may ask for (``n``, ``best_of``).
MAX_CHOICES = 128
#: Largest output cap a request may reserve, per choice.
MAX_OUTPUT_TOKENS = 1 << 20
#: Fields that cap the output per choice, and fields that multiply it.
CAP_FIELDS = ("max_completion_tokens", "max_tokens")
CHOICE_FIELDS = ("n", "best_of")


def _invalid(message: str, code: str = "invalid_json", param: str | None = None) -> Reject:
    return Reject(400, message, "invalid_request_error", code, should_retry=False, param=param)


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` nests arrays/objects deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_json_object(raw: bytes) -> dict[str, object]:
    """The request body as a JSON object.

    Raises:
        Reject: 400 ``invalid_json``: not UTF-8 JSON, nested deeper than :data:`MAX_JSON_DEPTH`
            (the C decoder's own recursion bound stops far deeper bodies before Python does), or
            not an object.
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _invalid("the request body is not valid JSON") from None
    except RecursionError:
        raise _invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    if _depth_exceeds(body, MAX_JSON_DEPTH):
        raise _invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return body


def parse_request(raw: bytes, dialect: Dialect, config: GatewayConfig) -> tuple[dict[str, object], Route]:
    """A request to ``dialect``'s path: its JSON object and the route its model names.

    Raises:
        Reject: not JSON, not an object, no model, a field ``dialect`` cannot honour, a route
            with no target that speaks it (400), or a model with no route (404).
    """
    body = parse_json_object(raw)
    if (refused := dialect.unsupported(body)) is not None:
        raise Reject(400, refused[1], "invalid_request_error", "unsupported_parameter", should_retry=False, param=refused[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Reject(400, "the request names no model", "invalid_request_error", "missing_model", should_retry=False)
    route = config.route(model)
    if route is None:
        known = ", ".join(r.model for r in config.routes[:20]) or "none"
        raise Reject(
            404,
            f"the gateway has no route for model {model[:100]!r} (it serves: {known})",
            "invalid_request_error",
            "model_not_found",
            should_retry=False,
        )
    if not any(leg_for(dialect, target.speaks) is not None for target in route.targets):
        raise Reject(
            400,
            f"no target of {route.model!r} speaks {dialect.name} (they speak {', '.join(route.targets[0].speaks)}): add "
            f"\"{dialect.family}\" to a target's speaks in the gateway's config, if its upstream answers it",
            "invalid_request_error",
            "protocol_not_served",
            should_retry=False,
        )
    return body, route


@dataclass(frozen=True)
class OutputLimits:
    """Output tokens per choice and the number of choices a request may produce; ``adjusted``
    says which fields were replaced and why (for the request's log line)."""

    per_choice: int
    choices: int = 1
    adjusted: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        """Output tokens to reserve: every choice at its cap."""
        return self.per_choice * self.choices


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _choices(body: dict[str, object], choice_fields: tuple[str, ...]) -> int:
    """The most completions the upstream may generate: ``n``, or ``best_of`` (generated server
    side and billed, though only ``n`` come back).

    Raises:
        Reject: 400 ``invalid_value`` for a count that is not an integer from 1 to :data:`MAX_CHOICES`.
    """
    counts = [1]
    for name in choice_fields:
        if name not in body or body[name] is None:
            continue
        count = _positive_int(body[name])
        if count is None or count > MAX_CHOICES:
            raise _invalid(f"{name} must be an integer from 1 to {MAX_CHOICES}", "invalid_value", name)
        counts.append(count)
    return max(counts)


def output_limits(
    body: dict[str, object],
    *,
    default_max_tokens: int,
    budgeted: bool,
    cap_fields: tuple[str, ...] = CAP_FIELDS,
    choice_fields: tuple[str, ...] = CHOICE_FIELDS,
) -> OutputLimits:
    """What a request may produce, and for a budgeted user the body capped to it.

    Per choice: the smallest positive cap the client gave (an upstream honours one field or the
    other, so both must fit what is reserved), at most :data:`MAX_OUTPUT_TOKENS`; without one, a
    budgeted user's default (``default_max_tokens``). For a budgeted user every cap field present
    is rewritten to that number (the first of ``cap_fields`` added when none is), so whichever
    field the upstream honours, it generates no more than was reserved. ``cap_fields`` and
    ``choice_fields`` are the protocol's (OpenAI chat's by default; a dialect names its own).

    Raises:
        Reject: 400 for ``n``/``best_of`` out of range.
    """
    choices = _choices(body, choice_fields)
    given = {name: body[name] for name in cap_fields if name in body and body[name] is not None}
    valid = [count for value in given.values() if (count := _positive_int(value)) is not None]
    adjusted = [f"{name}={json.dumps(value)[:20]} is not a positive integer" for name, value in given.items() if _positive_int(value) is None]
    if valid:
        per_choice = min(min(valid), MAX_OUTPUT_TOKENS)
        if per_choice < max(valid):
            adjusted.append(f"caps differ ({', '.join(f'{name}={value}' for name, value in given.items())}): the smaller holds")
    else:
        per_choice = default_max_tokens
        if given:
            adjusted.append(f"reserved and sent the default {default_max_tokens}")
    if budgeted:
        for name in given or {cap_fields[-1]: None}:
            body[name] = per_choice
    return OutputLimits(per_choice, choices, tuple(adjusted) if budgeted else ())

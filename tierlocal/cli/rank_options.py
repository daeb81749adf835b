"""What a ranking (the catalog's, a Hub repository's) is asked, from ``check``'s options: the
context per slot (the purpose's default, or --ctx), the slots, the machine's request, and the
choices that order the candidates."""

from __future__ import annotations

from typing import Any, TypedDict

from .. import constants
from ..errors import UsageError
from ..fit.estimate import RunRequest
from ..plan.source import parse_ctx

__all__ = ["RankingChoices", "ranking_ask"]


class RankingChoices(TypedDict):
    """What a ranking is asked beyond context and slots (``check``'s options as click passes them)."""

    min_speed: float
    purpose: str
    prefer: str
    licence: str
    thinking: str


def ranking_ask(
    ctx: str | None, parallel: str, request: RunRequest, users: int | None, choices: RankingChoices, *, ranked: str, needs: str
) -> dict[str, Any]:
    """What a ranking (the catalog's, a repository's) is asked, from the options as given;
    ``ranked`` and ``needs`` word the error for a --ctx or --parallel only one file's plan takes.

    Raises:
        UsageError: --ctx or --parallel is not a number.
    """
    if (ctx is not None and not ctx.isdigit()) or not parallel.isdigit():
        raise UsageError(f"{ranked} takes numbers for --ctx and --parallel", hint=f"'max' and 'auto' need {needs}")
    purpose = choices["purpose"]
    tokens = parse_ctx(ctx) if ctx is not None else constants.LONG_CONTEXT_CTX if purpose == "long-context" else constants.DEFAULT_CTX
    return {
        "ctx": tokens,
        "parallel": int(parallel),
        "min_tokens_per_s": choices["min_speed"],
        "purpose": purpose,
        "request": request,
        "prefer": choices["prefer"],
        "ctx_up_to_training": ctx is None,
        "licence": choices["licence"],
        "users": users,
        "thinking": choices["thinking"],
    }

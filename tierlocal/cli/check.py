"""``tierlocal check``: the catalog recommendation for this machine (no SOURCE), or the
per-device plan for one model (SOURCE), as tables or ``--json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypedDict, Unpack

import click

from .. import constants
from ..catalog import ModelEntry, find_model, load_host_defaults, load_models, load_rental_offers
from ..errors import UsageError
from ..fetch.hub import is_repo_source
from ..fit.estimate import Machine, RunRequest
from ..hardware.types import Hardware
from ..plan.inputs import PlanAsk
from ..plan.local_cost import local_cost, rental_price
from ..plan.machine import machine_for
from ..plan.recommend import LICENCE_FILTERS, PREFERENCES, PURPOSES, THINKING, role_for
from ..plan.source import SourceCheck, parse_ctx, parse_parallel
from ..recommendation import catalog_recommendation
from ..serve.set_plan import plan_model_set
from .check_file import check_one_source
from .common import gpu_option, json_option, machine, ngl_option, planning_options, print_json, ram_options, read_projector
from .rank_options import RankingChoices, ranking_ask
from .recommend_view import render_catalog_recommendation
from .set_view import render_set_plan
from .source_view import render_source_check

__all__ = ["check"]


@click.command()
@click.argument("sources", nargs=-1, metavar="[SOURCE]...")
@click.option(
    "--set",
    "set_file",
    metavar="FILE",
    help="Plan a set of models together from a set file (TOML: each [[model]] with its source, role, ctx, parallel, pinned, idle_unload_s); "
    "several SOURCEs are a quick set.",
)
@gpu_option
@click.option(
    "--ctx",
    show_default=f"{constants.DEFAULT_CTX}, or the model's trained context if shorter",
    help="Context tokens per slot (llama-server's -c is that × --parallel), or 'max' with SOURCE.",
)
@click.option(
    "--parallel",
    default="1",
    show_default=True,
    help="Slots, each with its own KV cache; with SOURCE also 'auto' (llama-server's 4 unified) or 'max'.",
)
@click.option(
    "--users",
    type=click.IntRange(1, 256),
    default=None,
    help="Plan for this many users at once: that many slots (unless --parallel says otherwise), each user's decode speed, the "
    "throughput and the wait for the first token; --min-speed is then each user's floor.",
)
@click.option(
    "--price-per-hour",
    type=click.FloatRange(0, min_open=True),
    help="What the machine costs, USD per hour, for the cost of a local token (default: a named GPU's median on-demand rental price, "
    "recipes/gpu_rental.toml).",
)
@click.option(
    "--api-price",
    type=click.FloatRange(0, min_open=True),
    help="A hosted API's price, USD per million output tokens, to compare a local token with (the break-even volume per day).",
)
@ngl_option
@planning_options
@click.option(
    "--mmproj",
    "mmproj",
    metavar="FILE|URL",
    default=None,
    help="A multimodal projector (mmproj GGUF, header only) loaded beside SOURCE: its weights and compute buffer are planned on the device "
    "llama-server puts it on.",
)
@click.option(
    "--min-speed",
    type=click.FloatRange(0),
    default=constants.DEFAULT_MIN_TOKENS_PER_S,
    show_default=True,
    help="Slowest acceptable decode speed, tokens/s, for the catalog recommendation (the best estimate: measured, calibrated or from published "
    "GPU results; else the bandwidth bound); with --users, each user's.",
)
@click.option(
    "--for",
    "purpose",
    type=click.Choice(PURPOSES),
    default="chat",
    show_default=True,
    help="What the catalog recommendation is for: the task whose published benchmarks score the models (docs/how-it-works/quality.md); "
    "long-context also plans 32k tokens and keeps models trained for 128k+.",
)
@click.option(
    "--prefer",
    type=click.Choice(list(PREFERENCES)),
    default="balanced",
    show_default=True,
    help="How the catalog recommendation weighs quality against speed: quality (speed only breaks ties), balanced (2 score points per halving of "
    "the time to a typical answer, reasoning included), speed (8).",
)
@click.option(
    "--thinking",
    type=click.Choice(THINKING),
    default="auto",
    show_default=True,
    help="Which modes the catalog recommendation weighs: auto (a model that can answer with or without a reasoning trace is a candidate in each, "
    "with its own score and time to answer; gpt-oss at each reasoning effort with figures); on (thinking modes only); off (answering directly "
    "only); low, medium, high (thinking at that reasoning effort only: gpt-oss).",
)
@click.option(
    "--licence",
    type=click.Choice(list(LICENCE_FILTERS)),
    default="any",
    show_default=True,
    help="Which licences the catalog recommendation may pick: any; commercial (not the non-commercial ones); open (no use-based terms: Apache, "
    "MIT). recipes/licences.toml says what each allows.",
)
@click.option("--all", "show_all", is_flag=True, help="List every catalog entry, not only the nearest ones.")
@ram_options
@json_option
def check(
    sources: tuple[str, ...],
    set_file: str | None,
    gpus: tuple[str, ...],
    ctx: str | None,
    parallel: str,
    users: int | None,
    price_per_hour: float | None,
    api_price: float | None,
    ngl: int | None,
    n_cpu_moe: int | None,
    cache_type_k: str,
    cache_type_v: str,
    flash_attn: str,
    ubatch: int,
    mmproj: str | None,
    ram: str | None,
    ram_bandwidth: str | None,
    as_json: bool,
    **choices: Unpack[CatalogChoices],
) -> None:
    """What fits this machine (or the one --gpu describes), and how to run it.

    Without SOURCE (or with a catalog name): plan every entry of the built-in catalog (recipes/models.toml, each quantisation's header
    in recipes/headers/) with the same estimator as a file, offline, and rank them, each with why it lost; and say which frontier
    models can never fit one machine.

    With SOURCE (a GGUF path, URL or hf:// file — header only — or a catalog name): the per-device estimate of weights, KV cache,
    compute and output buffers, the largest -ngl that fits (or the one you give), --ctx max / --parallel max solved, the llama-server
    command line and the Ollama settings. With hf://OWNER/REPO[@REVISION]: each of its quantisations so, ranked as the catalog is.
    With several SOURCEs, or --set FILE: the set planned together (docs/model-sets.md).

    \b
    Examples:
      tierlocal check
      tierlocal check --gpu "2xRTX 3090" --ram 64GiB
      tierlocal check --ram 16GiB --for long-context
      tierlocal check --gpu 12GiB --for code --prefer speed
      tierlocal check qwen3-30b-a3b --gpu 24GiB
      tierlocal check hf://unsloth/Qwen3-8B-GGUF --gpu 12GiB
      tierlocal check --gpu 24GiB --ctx 32768
      tierlocal check ./model.gguf --ctx max --json
      tierlocal check ./gemma-3-4b-it-Q4_K_M.gguf --mmproj ./mmproj-model-f16.gguf
      tierlocal check kimi-k3
      tierlocal check --gpu "RTX 4090" --users 8 --min-speed 20
      tierlocal check ./chat.gguf ./code.gguf --ram 32GiB
      tierlocal check --set team.toml --gpu 24GiB
    """
    hardware = machine(gpus, ram, ram_bandwidth)
    source = sources[0] if len(sources) == 1 else None
    named = find_model(source) if source is not None else []  # a catalog name: its quantisations
    if mmproj and (source is None or named):
        raise UsageError("--mmproj plans a projector beside one model", hint="give the model as SOURCE (a GGUF path, URL or hf:// file)")
    parallel, request = _for_users(users, parallel, _request(ngl, n_cpu_moe, cache_type_k, cache_type_v, flash_attn, ubatch, mmproj))
    if len(sources) > 1 or set_file is not None:
        return _check_set(sources, set_file, hardware, ctx, parallel, request, users, as_json)
    priced = partial(_with_cost, machine_for(hardware, load_host_defaults()), price_per_hour, api_price)
    one = _check_repo if source is not None and is_repo_source(source) else _check_file  # a repository's quantisations, or one file
    ranking = partial(one, source) if source is not None and not named else partial(_check_catalog, named)
    ranking(hardware, ctx, parallel, request, users, priced, as_json=as_json, **choices)


def _check_repo(*args: Any, **kwargs: Any) -> None:
    """``check hf://OWNER/REPO`` (:mod:`.check_repo`, imported only then: the hub's reader and its progress bar)."""
    from .check_repo import check_repo

    check_repo(*args, **kwargs)


def _check_file(
    source: str,
    hardware: Hardware,
    ctx: str | None,
    parallel: str,
    request: RunRequest,
    users: int | None,
    priced: Callable[[SourceCheck], SourceCheck],
    *,
    as_json: bool,
    min_speed: float,
    **_: object,
) -> None:
    """``check SOURCE``: one file's plan, shown."""
    result = priced(check_one_source(source, hardware, ctx, parallel, request, users, _slots_floor(parallel, min_speed)))
    print_json(result.to_json()) if as_json else render_source_check(result, min_speed=min_speed)


class CatalogChoices(TypedDict):
    """What ``check`` asks of the catalog recommendation only (its options as click passes them)."""

    min_speed: float
    purpose: str
    prefer: str
    licence: str
    thinking: str
    show_all: bool


def _for_users(users: int | None, parallel: str, request: RunRequest) -> tuple[str, RunRequest]:
    """``--users``: one slot per user unless --parallel says otherwise, and one batch for every
    user (llama-server's -kvu)."""
    if users is not None and not _given("parallel"):
        parallel = str(users)
    return parallel, replace(request, kv_unified=True) if users is not None and users > 1 else request


def _check_set(
    sources: tuple[str, ...],
    set_file: str | None,
    hardware: Hardware,
    ctx: str | None,
    parallel: str,
    request: RunRequest,
    users: int | None,
    as_json: bool,
) -> None:
    """``check A B C`` / ``check --set FILE``: the joint plan of a model set."""
    tokens = parse_ctx(ctx) if ctx is not None else constants.DEFAULT_CTX
    default = PlanAsk(tokens, parse_parallel(parallel), request, users, up_to_training=ctx is None)
    plan, settings = plan_model_set(sources, set_file, hardware, replace(default, cap_at_training=True))
    print_json(plan.to_json()) if as_json else render_set_plan(plan, settings)


def _request(
    ngl: int | None, n_cpu_moe: int | None, cache_type_k: str, cache_type_v: str, flash_attn: str, ubatch: int, mmproj: str | None
) -> RunRequest:
    """What the planning options ask of llama-server (the projector's header read from ``mmproj``)."""
    return RunRequest(
        ngl=ngl,
        n_cpu_moe=n_cpu_moe,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=flash_attn != "off",
        n_ubatch=ubatch,
        projector=read_projector(mmproj) if mmproj else None,
    )


def _check_catalog(
    named: list[ModelEntry],
    hardware: Hardware,
    ctx: str | None,
    parallel: str,
    request: RunRequest,
    users: int | None,
    priced: Callable[[SourceCheck], SourceCheck],
    *,
    min_speed: float,
    purpose: str,
    prefer: str,
    licence: str,
    thinking: str,
    show_all: bool,
    as_json: bool,
) -> None:
    """The catalog recommendation, ranked: of every entry, or of a catalog name's quantisations (``named``)."""
    entries = named or list(load_models())
    purpose = _named_purpose(named, purpose)
    chosen = RankingChoices(min_speed=min_speed, purpose=purpose, prefer=prefer, licence=licence, thinking=thinking)
    ask = ranking_ask(ctx, parallel, request, users, chosen, ranked="the catalog recommendation", needs="a GGUF SOURCE")
    recommendation = catalog_recommendation(entries, hardware, **ask)
    # The best entry's plan; for a catalog name nothing of which fits, its closest entry's (why).
    shown = recommendation.best or (recommendation.candidates[0] if named and recommendation.candidates else None)
    if shown is not None and shown.plan is not None:
        shown = replace(shown, plan=priced(shown.plan))
        recommendation = replace(recommendation, candidates=tuple(shown if c.key == shown.key else c for c in recommendation.candidates))
    if as_json:
        payload = recommendation.to_json()
        payload["plan"] = shown.plan.to_json() if shown and shown.plan else None
        print_json(payload)
    else:
        shown_plan = partial(render_source_check, min_speed=min_speed)
        render_catalog_recommendation(recommendation, show_all=show_all, render_plan=shown_plan, closest=shown)


def _named_purpose(named: list[ModelEntry], purpose: str) -> str:
    """The purpose a catalog name is ranked for: an embedding model's is ``embeddings`` (the
    default ``--for chat`` then means it); a named model of another role than ``--for`` ranks is refused.

    Raises:
        UsageError: ``--for`` asks for what the named model does not serve.
    """
    roles = {entry.role for entry in named}
    if roles == {"embeddings"} and not _given("purpose"):
        return "embeddings"
    if roles and roles != {role_for(purpose)}:
        name = named[0].family
        raise UsageError(
            f"{name} is {'an embedding' if 'embeddings' in roles else 'a generation'} model: --for {purpose} does not rank it",
            hint=f"drop --for, or give --for {'embeddings' if 'embeddings' in roles else 'chat'}",
        )
    return purpose


def _slots_floor(parallel: str, min_speed: float) -> float | None:
    """The per-user floor ``--parallel max`` keeps: ``--min-speed`` when given (tokens/s)."""
    return (min_speed or None) if parallel == "max" and _given("min_speed") else None


def _given(option: str) -> bool:
    """Whether the command line gave ``option`` (not its default)."""
    return click.get_current_context().get_parameter_source(option) is not click.core.ParameterSource.DEFAULT


def _with_cost(machine: Machine, price_per_hour: float | None, api_price: float | None, result: SourceCheck) -> SourceCheck:
    """``result`` with what a local token costs: at ``price_per_hour``, else at the named GPU's median rental price."""
    if not result.users:
        return result
    if price_per_hour is not None:
        price: tuple[float, str] | None = (price_per_hour, "given (--price-per-hour)")
    elif machine.gpu_name is not None and result.estimate is not None and result.estimate.layers_offloaded:
        price = rental_price(machine.gpu_name, max(len(machine.gpu_devices), 1), load_rental_offers())
    else:
        price = None
    if price is None:
        return result
    asked = result.users_asked or (result.estimate.params.n_seq_max if result.estimate else 1)
    return replace(result, cost=local_cost(result.users, asked, price[0], price[1], api_price))

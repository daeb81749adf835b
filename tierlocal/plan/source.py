"""One GGUF model planned on one machine (``tierlocal check SOURCE``, ``serve``): the
per-device estimate, the verdict, the decode speed, a cache-type suggestion, and the run as
each engine takes it. Pure: the headers and the machine come in as arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypedDict, Unpack

from ..engines.flags import planned_command, role_flags
from ..engines.ollama import OllamaSettings, ollama_settings
from ..engines.prompt_formats import TemplateChoice, choose_template
from ..errors import UsageError
from ..fit.concurrency import UsersSpeed
from ..fit.estimate import Machine, RunEstimate, RunRequest
from ..fit.headline import HeadlineSpeed, headline_speed
from ..fit.host_memory import LOAD_MODES, HostMemory, host_memory, prompt_cache_cap
from ..fit.model import ModelSpec, model_spec
from ..fit.search import max_context, max_parallel, plan_run
from ..fit.speed import DecodeSpeed
from ..gguf import ChatTemplateInfo, GGUFHeader, ModelSummary, summarize
from .inputs import PlanAsk, PlanInputs
from .local_cost import LocalCost
from .machine import without_gpu
from .notes import context_note
from .speeds import batching_note, plan_speeds

__all__ = ["SourceCheck", "CacheSuggestion", "check_model", "check_source", "default_template", "parse_ctx", "parse_parallel"]


@dataclass(frozen=True)
class CacheSuggestion:
    """q8_0 K and V (with flash attention, which they need) when they change the answer: the
    context and layers on the GPU they give, and whether that fits."""

    ctx: int
    layers_offloaded: int
    fits: bool
    cache_type_k: str = "q8_0"
    cache_type_v: str = "q8_0"
    flash_attn: str = "on"

    def to_json(self) -> dict[str, object]:
        return {
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "flash_attn": self.flash_attn,
            "ctx": self.ctx,
            "layers_offloaded": self.layers_offloaded,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class SourceCheck:
    """A planned run of one model: the estimate (None when nothing fits), what it came from,
    and how it is run. ``host_only``: a machine with a GPU planned on the CPU alone."""

    source: str
    architecture: str
    params: int
    file_bytes: int
    estimate: RunEstimate | None
    reason: str | None
    command: list[str]
    ollama: OllamaSettings | None
    speed: DecodeSpeed | None
    suggestion: CacheSuggestion | None
    host_only: bool = False
    chat_template: ChatTemplateInfo = field(default_factory=lambda: ChatTemplateInfo("absent"))
    #: The template serve will use (the file's, or the engine built-in tierlocal picks).
    template: TemplateChoice = field(default_factory=lambda: TemplateChoice("engine-default"))
    #: System RAM as the kernel counts it, per load mode (mmap first: llama-server's default).
    host_memory: tuple[HostMemory, ...] = ()
    #: The CPU features the repack figures assume, and where they came from.
    cpu_features: tuple[str, ...] = ()
    #: What `tierlocal bench` measured for this model file, engine build and device (None:
    #: nothing recorded): time, decode_tokens_per_s, prefill_tokens_per_s, runs.
    measured: dict[str, object] | None = None
    #: False for an architecture whose rules were not checked against llama.cpp here (the
    #: generic estimate); the header keys of a state the estimate could not size.
    verified: bool = True
    unknown_state: tuple[str, ...] = ()
    #: The context length the model was trained for (tokens; its header's ``context_length``).
    n_ctx_train: int = 0
    #: Tokens per slot asked for past the trained context and planned at it instead (0: none).
    ctx_asked: int = 0
    #: The host is this machine (no ``--ram``): `tierlocal hw --calibrate` could time its CPU.
    host_is_here: bool = True
    #: Why this CPU's calibration went unused (filed under another engine build), if it did.
    calibration_note: str | None = None
    #: Users at once on the planned slots (:mod:`tierlocal.fit.concurrency`): per-user decode,
    #: aggregate and first token for each count of the table (``users`` asked included).
    users: tuple[UsersSpeed, ...] = ()
    #: The users the plan was asked for (``--users``; None: not asked).
    users_asked: int | None = None
    #: What the file serves by its header's pooling (``embeddings``, ``rerank``; None: a generation model).
    pooled_role: str | None = None
    #: What a local output token costs at the machine's price per hour (None: no price known).
    cost: LocalCost | None = None
    #: Why the plan has fewer slots than memory holds (``--parallel max`` with ``--min-speed``).
    slots_note: str | None = None

    @property
    def users_note(self) -> str | None:
        """What the users table assumes that this plan's llama-server does not do (:func:`batching_note`)."""
        return batching_note(self.estimate) if self.users and self.estimate is not None else None

    def users_at(self, count: int) -> UsersSpeed | None:
        """The table's row for ``count`` users, if it has one."""
        return next((row for row in self.users if row.users == count), None)

    @property
    def context_note(self) -> str | None:
        """What a context past the trained one means (:func:`context_note`)."""
        return context_note(self.estimate, self.n_ctx_train, self.ctx_asked) if self.estimate is not None else None

    @property
    def unverified_note(self) -> str | None:
        """What the estimate of an unverified architecture does and does not count."""
        if self.verified and not self.unknown_state:
            return None
        note = f"unverified architecture ({self.architecture}): weights exact from the tensor table, KV cache from the header's attention shape"
        if self.unknown_state:
            note += f"; a recurrent or linear-attention state ({', '.join(self.unknown_state[:4])}) is not counted"
        return note

    @property
    def headline(self) -> HeadlineSpeed:
        """The best speed there is (:func:`headline_speed`)."""
        return headline_speed(self.estimate, self.speed, self.measured)

    def to_json(self) -> dict[str, object]:
        """The documented ``check SOURCE --json`` object (bytes, tokens/s)."""
        estimate = self.estimate
        payload: dict[str, object] = {
            "model": {
                "source": self.source,
                "architecture": self.architecture,
                "params": self.params,
                "layers": estimate.layers_total - 1 if estimate else None,
                "file_bytes": self.file_bytes,
                "verified": self.verified,
                "unverified_note": self.unverified_note,
                "unknown_state": list(self.unknown_state),
                "n_ctx_train": self.n_ctx_train,
            },
            "fits": bool(estimate and estimate.fits),
            "reason": self.reason,
            "chat_template": {**self.chat_template.to_json(), "serve": self.template.to_json()},
        }
        if estimate is None:
            return payload
        request, params = estimate.request, estimate.params
        payload["request"] = {
            "ctx": params.n_ctx_padded,
            "ctx_per_slot": params.n_ctx_seq,
            "parallel": params.n_seq_max,
            "kv_unified": params.kv_unified,
            "ngl": request.ngl,
            "n_cpu_moe": request.n_cpu_moe or 0,
            "cache_type_k": request.cache_type_k,
            "cache_type_v": request.cache_type_v,
            "flash_attn": "on" if request.flash_attn else "off",
            "n_ubatch": request.n_ubatch,
        }
        payload["devices"] = [device.to_json() for device in estimate.devices]
        payload["context_note"] = self.context_note
        payload["calibration_note"] = self.calibration_note
        payload["layers_offloaded"] = estimate.layers_offloaded
        payload["layers_total"] = estimate.layers_total
        payload.update(self.headline.to_json())
        payload["speed"] = self.speed.to_json() if self.speed else {}
        payload["command"] = self.command
        payload["ollama"] = self.ollama.to_json() if self.ollama else {}
        payload["suggestion"] = self.suggestion.to_json() if self.suggestion else None
        payload["host_memory"] = {"cpu_features": list(self.cpu_features), "modes": [memory.to_json() for memory in self.host_memory]}
        payload["measured"] = self.measured
        payload["users_asked"] = self.users_asked
        payload["users_note"] = self.users_note
        payload["slots_note"] = self.slots_note
        payload["users"] = [row.to_json() for row in self.users]
        payload["cost"] = self.cost.to_json() if self.cost else None
        if request.projector is not None and estimate.projector is not None:
            payload["projector"] = {**request.projector.to_json(), **estimate.projector.to_json()}
        return payload


def parse_ctx(text: str) -> int | None:
    """``--ctx``: tokens, or ``max`` (None) to solve for the largest that fits."""
    if text == "max":
        return None
    if not text.isdigit() or not 256 <= int(text) <= 1 << 24:
        raise UsageError(f"--ctx {text!r} is not a context size", hint="give tokens (256 to 16777216) or 'max'")
    return int(text)


def parse_parallel(text: str) -> int | str | None:
    """``--parallel``: slots, ``auto`` (llama-server's 4 unified slots: None) or ``max``."""
    if text in ("max",):
        return "max"
    if text == "auto":
        return None
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise UsageError(f"--parallel {text!r} is not a slot count", hint="give 1 to 256, 'auto' or 'max'")
    return int(text)


def _cache_suggestion(estimate: RunEstimate, plan: Callable[[RunRequest], RunEstimate | None]) -> CacheSuggestion | None:
    """q8_0 K and V (which need flash attention) when they change the answer: more layers on
    the GPU, a fit where f16 does not, or a longer context."""
    request = estimate.request
    if request.cache_type_k != "f16" or request.cache_type_v != "f16":
        return None
    quantised = plan(replace(request, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn=True, ngl=None, n_cpu_moe=None))
    if quantised is None:
        return None
    better = (
        (quantised.fits and not estimate.fits)
        or quantised.layers_offloaded > estimate.layers_offloaded
        or quantised.params.n_ctx_padded > estimate.params.n_ctx_padded
    )
    if not better:
        return None
    return CacheSuggestion(quantised.params.n_ctx_padded, quantised.layers_offloaded, quantised.fits)


def _base_request(request: RunRequest, ctx: int | None, parallel: int | str | None) -> tuple[RunRequest, str]:
    """The request to plan from, and why it fails if nothing fits. ``ctx`` is tokens per slot
    (every command's ``--ctx``): llama-server's ``-c`` is that × the slots; ``auto``'s slots
    share one KV cache of ``ctx`` tokens (each may use all of it)."""
    slots = None if isinstance(parallel, str) else parallel  # "max" is solved for by the planner
    if parallel == "max":
        return replace(request, ctx=ctx or 4096, parallel=1), "not even one slot fits"
    if ctx is None:
        return replace(request, parallel=slots), "not even 256 tokens of context fit"
    return replace(request, ctx=ctx * (slots or 1), parallel=slots), "it needs more memory than the machine has free"


def default_template(summary: ModelSummary) -> TemplateChoice:
    """The template serve uses for a model when the user names none."""
    return choose_template(summary.chat_template, summary.architecture, tokenizer_model=summary.tokenizer_model, tokenizer_pre=summary.tokenizer_pre)


def check_source(source: str, headers: list[GGUFHeader], where: PlanInputs, ask: PlanAsk, **options: Unpack[ShownOptions]) -> SourceCheck:
    """Plan ``source`` from its header(s) (:func:`check_model`)."""
    return check_model(source, model_spec(headers), summarize(headers), where, ask, **options)


class ShownOptions(TypedDict, total=False):
    """How :func:`check_model` shows a plan, beside what it plans."""

    template: TemplateChoice | None
    model_path: str | None
    detail: bool


def check_model(
    source: str,
    spec: ModelSpec,
    summary: ModelSummary,
    where: PlanInputs,
    ask: PlanAsk,
    *,
    template: TemplateChoice | None = None,
    model_path: str | None = None,
    detail: bool = True,
) -> SourceCheck:
    """Plan ``source`` (``spec`` and ``summary`` of its header) as ``ask`` says on ``where``'s machine, priced with its
    figures: honour what the user set, solve for ``max``; serve with ``template`` (None: :func:`default_template`). The
    command names ``model_path`` (default: ``source``, or a placeholder for a remote one). Without ``detail`` the plan leaves
    out what only a shown plan prints: the times to first token, the q8_0 cache suggestion and the users table (a ranking of
    the catalog plans every entry, and shows a few); with it the table of :data:`USER_COUNTS` is priced too."""
    request, machine, users = ask.request, where.machine, ask.users
    # A file that names a pooling serves vectors: llama-server outputs every token of a micro-batch then.
    request = replace(request, all_outputs=True) if summary.pooled_role else request
    spec = _checked_pair(spec, request)
    ctx, ctx_asked = _per_slot(ask.ctx, spec.n_ctx_train, up_to_training=ask.up_to_training, cap_at_training=ask.cap_at_training)
    base, reason = _base_request(request, ctx, ask.parallel)
    estimate, plan, machine, host_only = _plan_here(spec, base, machine, ctx, ask.parallel, keep_gpu=bool(request.ngl))
    template = template or default_template(summary)
    model_path = model_path or (source if not source.startswith(("http://", "https://", "hf://")) else "<path after tierlocal pull>")
    memory, command = _memory_and_command(spec, estimate, machine, model_path, template, host_only=host_only)
    command = [*command, *role_flags(summary.pooled_role, pooled=True)] if command else command
    speed, table = plan_speeds(spec, estimate, machine, where.host_speed, where.gpu_speed, detail=detail, users=users) if estimate else (None, ())
    return SourceCheck(
        source=source,
        architecture=spec.architecture,
        params=summary.params,
        file_bytes=summary.file_bytes,
        estimate=estimate,
        reason=None if estimate is not None and estimate.fits else reason,
        command=command,
        ollama=ollama_settings(estimate) if estimate else None,
        speed=speed,
        suggestion=_cache_suggestion(estimate, plan) if estimate and detail else None,
        host_only=host_only,
        chat_template=summary.chat_template,
        template=template,
        host_memory=memory,
        cpu_features=machine.cpu_features,
        verified=spec.verified,
        unknown_state=spec.unknown_state,
        n_ctx_train=spec.n_ctx_train,
        ctx_asked=ctx_asked,
        host_is_here=where.host_is_here,
        users=table,
        users_asked=users,
        pooled_role=summary.pooled_role,
    )


_Planner = Callable[[RunRequest], RunEstimate | None]


def _memory_and_command(
    spec: ModelSpec, estimate: RunEstimate | None, machine: Machine, model_path: str, template: TemplateChoice, *, host_only: bool
) -> tuple[tuple[HostMemory, ...], list[str]]:
    """System RAM per load mode (with what the prompt cache may add) and the llama-server command of the plan."""
    memory = _host_memory(spec, estimate, machine)
    cache_ram = prompt_cache_cap(memory[0].in_use_bytes, machine.host_free_bytes, machine.margin_bytes) if memory else None
    memory = tuple(replace(mode, grows_by_bytes=cache_ram) for mode in memory if cache_ram is not None)
    if estimate is None:
        return memory, []
    return memory, planned_command(model_path, estimate, host_only=host_only, template_args=template.engine_args, cache_ram_bytes=cache_ram)


def _per_slot(ctx: int | None, n_ctx_train: int, *, up_to_training: bool, cap_at_training: bool) -> tuple[int | None, int]:
    """The context to plan per slot, and the one asked past the trained context that it replaces
    (0: none, or ``ctx`` was the default, which is capped silently)."""
    if ctx is None or not n_ctx_train or ctx <= n_ctx_train or not (up_to_training or cap_at_training):
        return ctx, 0
    return n_ctx_train, 0 if up_to_training else ctx


def _plan_here(
    spec: ModelSpec, base: RunRequest, machine: Machine, ctx: int | None, parallel: int | str | None, *, keep_gpu: bool
) -> tuple[RunEstimate | None, _Planner, Machine, bool]:
    """The plan of ``base`` on ``machine``, the planner that made it, the machine it is for,
    and whether that is the CPU alone: a GPU too small even for its compute buffer and runtime
    runs the model on the CPU (llama-server's -dev none) rather than calling a model that fits in
    RAM unfit — unless the user set the GPU layers (``keep_gpu``)."""

    def planner(target: Machine) -> _Planner:
        return lambda r: _solve(spec, r, target, ctx, parallel)

    estimate = planner(machine)(base)
    if (estimate is None or not estimate.fits) and machine.gpu_name is not None and not keep_gpu:
        cpu_machine = without_gpu(machine)
        fallback = planner(cpu_machine)(base)
        if fallback is not None and fallback.fits:
            return fallback, planner(cpu_machine), cpu_machine, True
    return estimate, planner(machine), machine, False


def _solve(spec: ModelSpec, request: RunRequest, machine: Machine, ctx: int | None, parallel: int | str | None) -> RunEstimate | None:
    """The plan for ``request``: the most slots (``--parallel max``), the longest context
    (``--ctx max``), or the largest -ngl that fits."""
    if parallel == "max":
        return max_parallel(spec, request, machine)
    if ctx is None:
        return max_context(spec, request, machine)
    return plan_run(spec, request, machine)


def _checked_pair(spec: ModelSpec, request: RunRequest) -> ModelSpec:
    """``spec``, once the request's projector makes embeddings of its width (mtmd refuses to
    load a pair that does not)."""
    projector = request.projector
    if projector is not None and projector.verified and projector.projection_dim and projector.projection_dim != spec.n_embd:
        raise UsageError(
            f"the projector {projector.source} makes {projector.projection_dim}-wide embeddings; this {spec.architecture} model takes {spec.n_embd}",
            hint="use the mmproj file published with this model",
        )
    return spec


def _host_memory(spec: ModelSpec, estimate: RunEstimate | None, machine: Machine) -> tuple[HostMemory, ...]:
    return tuple(host_memory(spec, estimate, machine, mode) for mode in LOAD_MODES) if estimate else ()

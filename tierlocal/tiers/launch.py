"""A model across GPUs and nodes with vLLM or SGLang: the parallel layout a topology gets from
the published recipes, refused in one line when it cannot work, and each node's command.

Pure: the recipes arrive as plain data (recipes/frontier.toml ``[model.launch]``, read by the
catalog); nothing here reads a file or starts a process. Sizes are counts of GPUs and nodes.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import UsageError

__all__ = [
    "runnable_topology",
    "ENGINES",
    "LAYOUTS",
    "EngineFamily",
    "EngineRecipe",
    "LaunchRecipe",
    "Topology",
    "NodeCommand",
    "launch_recipe_from",
    "plan_topology",
    "node_command",
    "shell_line",
]

#: The engines a launch spec can start, and the layouts it can give them: ``tensor`` (tensor
#: parallel inside a node, pipeline stages across nodes for vLLM; one tensor group over every
#: GPU for SGLang) and ``expert`` (data-parallel attention with the experts spread over every GPU).
ENGINES = ("vllm", "sglang")
LAYOUTS = ("tensor", "expert")


@dataclass(frozen=True)
class EngineFamily:
    """A recipe's flags and environment for one family of GPUs (Blackwell, Hopper, AMD)."""

    name: str
    gpus: tuple[str, ...]
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineRecipe:
    """One engine's published launch facts for a model: version, images, flags by GPU family,
    and what multi-node and expert-parallel layouts add."""

    engine: str
    version: str | None = None
    image: str | None = None
    image_amd: str | None = None
    flags: tuple[str, ...] = ()
    families: tuple[EngineFamily, ...] = ()
    multi_node_flags: tuple[str, ...] = ()
    multi_node_env: dict[str, str] = field(default_factory=dict)
    all2all_rdma: str | None = None
    all2all_nvlink: str | None = None
    moe_backend_nvlink_domain: str | None = None
    nvlink_domain_gpus: tuple[str, ...] = ()
    expert_layout_unsupported: tuple[str, ...] = ()
    rdma_env: dict[str, str] = field(default_factory=dict)
    dist_init_port: int = 20000

    def family_for(self, gpu: str) -> EngineFamily | None:
        return next((family for family in self.families if gpu in family.gpus), None)


@dataclass(frozen=True)
class LaunchRecipe:
    """What launching a model needs to know: its weights' repo, the counts parallel sizes must
    divide (None: not published, not checked), the load timeout in seconds, the engines."""

    hf_repo: str | None
    engines: dict[str, EngineRecipe]
    routed_experts: int | None = None
    attention_heads: int | None = None
    ready_timeout_s: int = 3600
    source: str | None = None


def _engine_from(engine: str, raw: Mapping[str, object]) -> EngineRecipe:
    def strings(key: str) -> tuple[str, ...]:
        return tuple(str(item) for item in raw.get(key, ()))  # type: ignore[attr-defined]

    def env(value: object) -> dict[str, str]:
        return {str(k): str(v) for k, v in (value or {}).items()}  # type: ignore[attr-defined]

    families = raw.get("family", {})
    assert isinstance(families, Mapping)
    return EngineRecipe(
        engine=engine,
        version=raw.get("version"),  # type: ignore[arg-type]
        image=raw.get("image"),  # type: ignore[arg-type]
        image_amd=raw.get("image_amd"),  # type: ignore[arg-type]
        flags=strings("flags"),
        families=tuple(
            EngineFamily(name, tuple(table["gpus"]), tuple(table.get("flags", ())), env(table.get("env"))) for name, table in families.items()
        ),
        multi_node_flags=strings("multi_node_flags"),
        multi_node_env=env(raw.get("multi_node_env")),
        all2all_rdma=raw.get("all2all_rdma"),  # type: ignore[arg-type]
        all2all_nvlink=raw.get("all2all_nvlink"),  # type: ignore[arg-type]
        moe_backend_nvlink_domain=raw.get("moe_backend_nvlink_domain"),  # type: ignore[arg-type]
        nvlink_domain_gpus=strings("nvlink_domain_gpus"),
        expert_layout_unsupported=strings("expert_layout_unsupported"),
        rdma_env=env(raw.get("rdma_env")),
        dist_init_port=int(raw.get("dist_init_port", 20000)),  # type: ignore[call-overload]
    )


def launch_recipe_from(raw: Mapping[str, object] | None) -> LaunchRecipe:
    """A ``[model.launch]`` table as a :class:`LaunchRecipe`; without one, the engines' plain
    defaults (no published flags, nothing to check divisibility against).

    Raises:
        KeyError, TypeError, ValueError, AttributeError: the table is malformed (tiers.facts reports it).
    """
    raw = raw or {}
    engines = {engine: _engine_from(engine, raw.get(engine, {})) for engine in ENGINES}  # type: ignore[arg-type]
    return LaunchRecipe(
        hf_repo=raw.get("hf_repo"),  # type: ignore[arg-type]
        engines=engines,
        routed_experts=raw.get("routed_experts"),  # type: ignore[arg-type]
        attention_heads=raw.get("attention_heads"),  # type: ignore[arg-type]
        ready_timeout_s=int(raw.get("ready_timeout_s", 3600)),  # type: ignore[call-overload]
        source=raw.get("source"),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Topology:
    """Where an engine runs and how the model is split: ``tensor × pipeline × data`` is the GPU
    count; ``expert`` is the number of ranks the routed experts are spread over (1: every rank
    holds a slice of every expert, by tensor parallelism); ``attention_tensor`` the tensor
    ranks each attention layer's heads are split over."""

    engine: str
    layout: str
    gpu: str
    nodes: int
    gpus_per_node: int
    tensor: int
    pipeline: int
    data: int
    expert: int
    attention_tensor: int
    #: "nvlink" (one node, or nodes in one NVLink domain) or "rdma" (nodes joined by the network).
    interconnect: str
    family: str | None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_json(self) -> dict[str, object]:
        """The topology as plain JSON (counts)."""
        return {
            "engine": self.engine,
            "layout": self.layout,
            "gpu": self.gpu,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpus": self.gpus,
            "tensor_parallel": self.tensor,
            "pipeline_parallel": self.pipeline,
            "data_parallel": self.data,
            "expert_parallel": self.expert,
            "attention_tensor_parallel": self.attention_tensor,
            "interconnect": self.interconnect,
            "gpu_family": self.family,
        }


def _sizes(engine: str, layout: str, nodes: int, per_node: int) -> tuple[int, int, int, int, int]:
    """(tensor, pipeline, data, expert, attention tensor) for ``engine`` and ``layout``."""
    gpus = nodes * per_node
    if engine == "vllm":
        if layout == "expert":  # data_parallel_deployment.md: DP over every GPU, experts over every rank
            return 1, 1, gpus, gpus, 1
        return per_node, nodes, 1, 1, per_node  # parallelism_scaling.md: TP inside a node, PP across
    if layout == "expert":  # the cookbook's 32-GPU preset: --tp-size 32 --ep-size 32 --enable-dp-attention --dp-size 4
        data = nodes if nodes > 1 else per_node
        return gpus, 1, 1, gpus, gpus // data
    return gpus, 1, 1, gpus if nodes > 1 else 1, gpus  # the H200 2×8 cell: --tp-size 16 --ep-size 16


def _indivisible(recipe: LaunchRecipe, attention: int, expert: int) -> str | None:
    """Why these sizes cannot split the model (None: they can)."""
    if recipe.attention_heads is not None and recipe.attention_heads % attention:
        return f"{attention}-way tensor parallelism does not divide the model's {recipe.attention_heads} attention heads"
    if recipe.routed_experts is not None and recipe.routed_experts % expert:
        return f"{expert}-way expert parallelism does not divide the model's {recipe.routed_experts} routed experts"
    return None


def plan_topology(
    recipe: LaunchRecipe, engine: str, gpu: str, gpu_memory_bytes: int, nodes: int, gpus_per_node: int, layout: str, floor_bytes: int
) -> Topology:
    """The layout for ``nodes`` × ``gpus_per_node`` of ``gpu`` (memory in bytes each).

    Raises:
        UsageError: the topology cannot work — too little memory for ``floor_bytes``, a
            parallel size that does not divide the experts or heads, a GPU the recipe does not
            cover, or a layout the recipe marks unsupported there (one line, with what would).
    """
    engine_recipe = recipe.engines[engine]
    gpus = nodes * gpus_per_node
    if nodes < 1 or gpus_per_node < 1:
        raise UsageError(f"{nodes} node(s) of {gpus_per_node} GPU(s) is no cluster", hint="give at least one node of at least one GPU")
    if gpus * gpu_memory_bytes < floor_bytes:
        need = math.ceil(floor_bytes / (gpu_memory_bytes * gpus_per_node))
        raise UsageError(
            f"{gpus} × {gpu} hold {gpus * gpu_memory_bytes / 1e9:,.0f} GB, below the {floor_bytes / 1e9:,.0f} GB this model needs to serve",
            hint=f"{need} nodes of {gpus_per_node} × {gpu} clear it",
        )
    family = engine_recipe.family_for(gpu)
    if engine_recipe.families and family is None:
        known = sorted({name for f in engine_recipe.families for name in f.gpus})
        raise UsageError(f"the published {engine} recipe for this model covers no {gpu}", hint=f"it covers: {', '.join(known)}")
    if layout == "expert" and gpu in engine_recipe.expert_layout_unsupported:
        raise UsageError(f"the {engine} recipe marks the expert-parallel layout unsupported on {gpu}", hint="use the tensor layout there")
    tensor, pipeline, data, expert, attention = _sizes(engine, layout, nodes, gpus_per_node)
    assert tensor * pipeline * data == gpus
    if problem := _indivisible(recipe, attention, expert):
        larger = next(
            (n for n in range(nodes + 1, 4 * nodes + 9) if not _indivisible(recipe, *_sizes(engine, layout, n, gpus_per_node)[4:2:-1])), None
        )
        hint = f"{larger} nodes of {gpus_per_node} ({larger * gpus_per_node} GPUs) divide evenly" if larger else "use 8 GPUs per node"
        raise UsageError(f"on {nodes} × {gpus_per_node} {gpu}, {problem}", hint=hint)
    nvlink = nodes == 1 or gpu in engine_recipe.nvlink_domain_gpus
    return Topology(
        engine,
        layout,
        gpu,
        nodes,
        gpus_per_node,
        tensor,
        pipeline,
        data,
        expert,
        attention,
        "nvlink" if nvlink else "rdma",
        family.name if family else None,
    )


@dataclass(frozen=True)
class NodeCommand:
    """One node's engine command and the environment it needs. ``argv`` may hold shell words
    (``"${RANK}"``) that a launcher's script expands: render it with :func:`shell_line`."""

    argv: list[str]
    env: dict[str, str]


def _parallel_flags(top: Topology, recipe: EngineRecipe, role: str, rank: str, head: str) -> list[str]:
    """The parallel-size and rendezvous flags; ``rank``/``head`` are shell words for the node's
    rank and the head's address (the head's own command uses 0)."""
    multi = top.nodes > 1
    if top.engine == "sglang":
        flags = ["--tp-size", str(top.tensor)]
        if top.expert > 1:
            flags += ["--ep-size", str(top.expert)]
        if top.layout == "expert":
            flags += ["--enable-dp-attention", "--dp-size", str(top.tensor // top.attention_tensor), "--enable-dp-lm-head"]
        if multi:
            flags += [
                "--nnodes",
                str(top.nodes),
                "--node-rank",
                "0" if role == "head" else rank,
                "--dist-init-addr",
                f"{head}:{recipe.dist_init_port}",
            ]
        return flags
    if top.layout == "expert":
        flags = ["--enable-expert-parallel", "--data-parallel-size", str(top.data), "--data-parallel-size-local", str(top.gpus_per_node)]
        if multi:
            flags += ["--data-parallel-address", head]
            if role == "worker":
                rank_name = rank.strip("${}")
                flags += ["--data-parallel-start-rank", f"$(({rank_name}*{top.gpus_per_node}))", "--headless"]
        backend = recipe.all2all_nvlink if top.interconnect == "nvlink" else recipe.all2all_rdma
        if backend:
            flags += ["--all2all-backend", backend]
        if recipe.moe_backend_nvlink_domain and top.gpu in recipe.nvlink_domain_gpus:
            flags += ["--moe-backend", recipe.moe_backend_nvlink_domain]
        return flags
    flags = ["--tensor-parallel-size", str(top.tensor)]
    if multi:
        flags += [
            "--pipeline-parallel-size",
            str(top.pipeline),
            "--nnodes",
            str(top.nodes),
            "--node-rank",
            "0" if role == "head" else rank,
            "--master-addr",
            head,
        ]
        if role == "worker":
            flags.append("--headless")
    return flags


def _merged(*groups: Sequence[str]) -> list[str]:
    """Flag groups in order, a later group's value for a flag replacing an earlier one's (the
    recipes' rule: hardware and strategy overrides win over the base arguments)."""
    out: list[str] = []
    for group in groups:
        items = list(group)
        i = 0
        while i < len(items):
            flag = items[i]
            value = items[i + 1] if i + 1 < len(items) and not items[i + 1].startswith("--") else None
            if flag in out:
                at = out.index(flag)
                had_value = at + 1 < len(out) and not out[at + 1].startswith("--")
                del out[at : at + (2 if had_value else 1)]
            out += [flag] if value is None else [flag, value]
            i += 1 if value is None else 2
    return out


def node_command(
    top: Topology,
    recipe: LaunchRecipe,
    role: str,
    *,
    model_path: str,
    port: int,
    rank: str = "${RANK}",
    head: str = "${HEAD}",
    served_name: str | None = None,
) -> NodeCommand:
    """The engine command for the head node (``role="head"``) or any other (``"worker"``);
    ``served_name``: the model id clients (and the gateway) send, where it is not ``model_path``."""
    engine = recipe.engines[top.engine]
    family = engine.family_for(top.gpu)
    multi = top.nodes > 1
    env = {**(family.env if family else {}), **(engine.multi_node_env if multi and top.layout == "tensor" else {})}
    if top.interconnect == "rdma":
        env.update(engine.rdma_env)
    extra = engine.multi_node_flags if multi and top.layout == "tensor" and top.engine == "vllm" else ()
    flags = _merged(engine.flags, family.flags if family else (), extra)
    if served_name:
        flags += ["--served-model-name", served_name]
    if top.engine == "vllm":
        argv = ["vllm", "serve", model_path, *_parallel_flags(top, engine, role, rank, head), *flags, "--host", "0.0.0.0", "--port", str(port)]
    else:
        argv = [
            "sglang",
            "serve",
            "--model-path",
            model_path,
            *_parallel_flags(top, engine, role, rank, head),
            *flags,
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ]
    return NodeCommand(argv, env)


_SHELL_WORD = re.compile(r"^(\$\{[A-Z_][A-Z0-9_]*\}|\$\(\([A-Z_0-9 *+]+\)\))(:\d+)?$")


def shell_line(argv: Sequence[str]) -> str:
    """``argv`` as one shell line: every word quoted, except the launcher's own variables and
    arithmetic (``${RANK}``, ``$((RANK * 8))``, ``${HEAD}:20000``), which the shell expands."""
    return " ".join(word if _SHELL_WORD.match(word) else shlex.quote(word) for word in argv)


def runnable_topology(
    recipe: LaunchRecipe, engine: str, gpu: str, gpu_memory_bytes: int, nodes: int, gpus_per_node: int, layout: str, floor_bytes: int
) -> Topology:
    """:func:`plan_topology` on the fewest nodes from ``nodes`` up whose parallel sizes divide the
    model's experts and heads: the default cluster must be one the engine can run (3 × 8 H100
    hold Kimi K3, but 24-way expert parallelism does not divide its 896 experts; 4 × 8 do).

    Raises:
        UsageError: as :func:`plan_topology` says for ``nodes``, when no larger count up to
            4 × ``nodes`` + 8 divides either.
    """
    for count in range(nodes, 4 * nodes + 9):
        if not _indivisible(recipe, *_sizes(engine, layout, count, gpus_per_node)[4:2:-1]):
            return plan_topology(recipe, engine, gpu, gpu_memory_bytes, count, gpus_per_node, layout, floor_bytes)
    return plan_topology(recipe, engine, gpu, gpu_memory_bytes, nodes, gpus_per_node, layout, floor_bytes)

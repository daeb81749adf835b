"""``tierlocal plan MODEL --emit skypilot|lws``: the tier-1 plan's cluster as a launch spec on
stdout — YAML for the launcher, or the same as JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import click
import yaml

from ..errors import UsageError
from ..tiers.launch import Topology, launch_recipe_from, plan_topology, runnable_topology
from ..tiers.launch_specs import LaunchTarget, leaderworkerset, skypilot_task
from ..tiers.plan import TierPlan

__all__ = ["EMITS", "EmitOptions", "emit_spec"]

#: The launchers ``--emit`` writes for.
EMITS = ("skypilot", "lws")


@dataclass(frozen=True)
class EmitOptions:
    """``--emit`` and what shapes it: engine, layout, nodes (None: as the plan chose), GPUs per
    node, the volume's name (None: one named after the model and engine)."""

    emit: str
    engine: str
    layout: str
    nodes: int | None
    gpus_per_node: int
    volume: str | None


class _Dumper(yaml.SafeDumper):
    """Block style for scripts (``setup: |``), so a spec reads as one would write it."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def topology_for(plan: TierPlan, options: EmitOptions) -> Topology:
    """The cluster to write a spec for: the plan's cheapest one the engine can run, or ``options.nodes`` nodes of its GPU.

    Raises:
        UsageError: no GPU option clears the model's serving floor, or the topology cannot work.
    """
    if plan.chosen is None:
        raise UsageError(f"no cluster of the GPUs asked for serves {plan.facts.display_name}", hint="name a larger GPU with --gpu")
    per_node = options.gpus_per_node
    recipe = plan.facts.launch_recipe or launch_recipe_from(None)
    chosen, floor = plan.chosen, plan.serving_floor_bytes
    if options.nodes is not None:  # as asked, or refused with what would work
        return plan_topology(recipe, options.engine, chosen.gpu, chosen.memory_bytes, options.nodes, per_node, options.layout, floor)
    nodes = math.ceil(chosen.count / per_node)  # the fewest that serve it, then the fewest the engine can split the model over
    return runnable_topology(recipe, options.engine, chosen.gpu, chosen.memory_bytes, nodes, per_node, options.layout, floor)


def recipe_repo(plan: TierPlan) -> str:
    """The Hugging Face repo of the weights: the recipe's, else ``--model-path OWNER/REPO``.

    Raises:
        UsageError: neither names one.
    """
    recipe = plan.facts.launch_recipe or launch_recipe_from(None)
    path = plan.options.model_path
    repo = recipe.hf_repo or (path if "/" in path and not path.startswith(("<", "/", ".")) else None)
    if repo is None:
        raise UsageError(f"no Hugging Face repo is known for {plan.facts.display_name}'s weights", hint="give it with --model-path OWNER/REPO")
    return repo


def build_target(plan: TierPlan, options: EmitOptions) -> LaunchTarget:
    """What the spec launches: its name, the weights' repo and sizes, the port, the volume."""
    facts = plan.facts
    return LaunchTarget(
        name=f"{facts.name}-{options.engine}".lower().replace(".", "-").replace("_", "-"),
        hf_repo=recipe_repo(plan),
        weights_bytes=facts.shipped_bytes or plan.weights_with_scales_bytes,
        disk_bytes=plan.disk_bytes,
        port=plan.options.port,
        volume=options.volume or f"tierlocal-{facts.name.lower()}-weights",
    )


def build_spec(plan: TierPlan, options: EmitOptions, top: Topology, target: LaunchTarget) -> dict[str, object] | list[dict[str, object]]:
    """The spec as plain data: a SkyPilot task, or the Kubernetes objects in apply order."""
    recipe = plan.facts.launch_recipe or launch_recipe_from(None)
    if options.emit == "skypilot":
        return skypilot_task(top, recipe, target)
    return leaderworkerset(top, recipe, target)


def emit_spec(plan: TierPlan, options: EmitOptions, *, as_json: bool) -> None:
    """Write the spec on stdout: YAML (several documents for Kubernetes), or JSON (a
    Kubernetes ``List`` holding them)."""
    top, target = topology_for(plan, options), build_target(plan, options)
    spec = build_spec(plan, options, top, target)
    if as_json:
        document = spec if isinstance(spec, dict) else {"apiVersion": "v1", "kind": "List", "items": spec}
        click.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return
    header = (
        f"# {plan.facts.display_name} on {top.nodes} × {top.gpus_per_node} {top.gpu} with {options.engine}: tensor {top.tensor} × pipeline "
        f"{top.pipeline}"
        f" × data {top.data} = {top.gpus} GPUs, the experts "
        f"{'sliced by tensor parallelism' if top.expert == 1 else f'spread over {top.expert} ranks'};"
        f" written by tierlocal plan --emit {options.emit}\n"
    )
    usd_per_hour = top.gpus * plan.options.rate_usd_per_gpu_hour
    address = f"http://{target.name}:{target.port}/v1" if options.emit == "lws" else f"http://<head-node-ip>:{target.port}/v1"
    header += (
        f'# as the gateway\'s tier-1 target: {{ url = "{address}", model = "{target.hf_repo}", tier = 1, usd_per_hour = {usd_per_hour:g} }}'
        f" ({top.gpus} GPUs at ${plan.options.rate_usd_per_gpu_hour:g}/GPU-hour; --rate to change it)\n"
    )
    documents = [spec] if isinstance(spec, dict) else spec
    click.echo(header + yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000), nl=False)

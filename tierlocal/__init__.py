"""tierlocal: what fits on one GPU, and how to serve it.

The library API, in the order the data flows (source → header → spec → estimate → plan)::

    import tierlocal
    headers = tierlocal.read_headers("model.gguf")            # header only: path, URL, hf://
    spec = tierlocal.model_spec(headers)                        # architecture facts
    machine = tierlocal.machine_for(tierlocal.detect(), tierlocal.load_host_defaults())
    plan = tierlocal.plan_run(spec, tierlocal.RunRequest(ctx=8192), machine)
    plan.devices, plan.layers_offloaded, plan.fits

Each name is imported when first used, so ``import tierlocal.fit.estimate`` loads only the pure
core, and the CLI starts without the network and hardware libraries it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Public name → the module that defines it.
_API = {
    "read_headers": "tierlocal.fetch.sources",
    "parse_header": "tierlocal.gguf.parse",
    "summarize": "tierlocal.gguf.summary",
    "model_spec": "tierlocal.fit.model",
    "RunRequest": "tierlocal.fit.estimate",
    "Machine": "tierlocal.fit.estimate",
    "estimate_run": "tierlocal.fit.estimate",
    "plan_run": "tierlocal.fit.search",
    "max_context": "tierlocal.fit.search",
    "max_parallel": "tierlocal.fit.search",
    "check_source": "tierlocal.plan.source",
    "PlanInputs": "tierlocal.plan.inputs",
    "PlanAsk": "tierlocal.plan.inputs",
    "machine_for": "tierlocal.plan.machine",
    "verify_load": "tierlocal.plan.verify",
    "detect": "tierlocal.hardware.detect",
    "with_gpu_override": "tierlocal.hardware.override",
    "load_host_defaults": "tierlocal.catalog",
    "load_models": "tierlocal.catalog",
    "resolve_model_facts": "tierlocal.tiers.facts",
    "build_plan": "tierlocal.tiers.plan",
    "TierlocalError": "tierlocal.errors",
}

__all__ = [
    "__version__",
    "read_headers",
    "parse_header",
    "summarize",
    "model_spec",
    "RunRequest",
    "Machine",
    "estimate_run",
    "plan_run",
    "max_context",
    "max_parallel",
    "check_source",
    "PlanInputs",
    "PlanAsk",
    "machine_for",
    "verify_load",
    "detect",
    "with_gpu_override",
    "load_host_defaults",
    "load_models",
    "resolve_model_facts",
    "build_plan",
    "TierlocalError",
]

if TYPE_CHECKING:
    from .catalog import load_host_defaults, load_models
    from .errors import TierlocalError
    from .fetch.sources import read_headers
    from .fit.estimate import Machine, RunRequest, estimate_run
    from .fit.model import model_spec
    from .fit.search import max_context, max_parallel, plan_run
    from .gguf.parse import parse_header
    from .gguf.summary import summarize
    from .hardware.detect import detect
    from .hardware.override import with_gpu_override
    from .plan.inputs import PlanAsk, PlanInputs
    from .plan.machine import machine_for
    from .plan.source import check_source
    from .plan.verify import verify_load
    from .tiers.facts import resolve_model_facts
    from .tiers.plan import build_plan


def __getattr__(name: str) -> object:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tierlocal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

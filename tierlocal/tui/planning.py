"""What the What-fits table is planned for, and the planning itself (the catalog recommendation
``tierlocal check`` gives, :func:`tierlocal.recommendation.catalog_recommendation`). No terminal
here: ``tierlocal ui`` starts the first plan in a thread before Textual loads, so the two overlap."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import load_models
from ..hardware.types import Hardware
from ..plan.candidates import CatalogRecommendation
from ..recommendation import catalog_recommendation

__all__ = ["Planning", "plan_catalog", "machine_label"]


@dataclass(frozen=True)
class Planning:
    """What the table is planned for: the machine, tokens per slot, slots, the task, how
    quality weighs against speed, and the slowest decode accepted (tokens/s)."""

    hardware: Hardware
    ctx: int
    parallel: int
    purpose: str = "chat"
    prefer: str = "balanced"
    min_tokens_per_s: float = 5.0
    machine_label: str = "this machine"


def plan_catalog(planning: Planning) -> CatalogRecommendation:
    """Every catalog entry planned and ranked for ``planning`` (~0.2 s; the first call also
    reads the catalog: ~0.5 s).

    Raises:
        CatalogError: a catalog file is unreadable.
    """
    return catalog_recommendation(
        list(load_models()),
        planning.hardware,
        ctx=planning.ctx,
        parallel=planning.parallel,
        min_tokens_per_s=planning.min_tokens_per_s,
        purpose=planning.purpose,
        prefer=planning.prefer,
    )


def machine_label(gpus: list[str], ram: str | None) -> str:
    """The status line's name for a machine given as ``--gpu`` values and ``--ram``."""
    return " ".join([*(f"--gpu {gpu}" for gpu in gpus), *([f"--ram {ram}"] if ram else [])]) or "this machine"

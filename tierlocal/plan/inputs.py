"""What a plan is made from, put together once: where it runs (:class:`PlanInputs`: the machine
and the speed figures of its devices) and what is asked of one model (:class:`PlanAsk`: tokens
per slot, slots, engine options, users). ``check``, the catalog ranking, ``serve`` and a model
set's joint plan each build these once and hand them to
:func:`~tierlocal.plan.source.check_model`. Pure: plain data."""

from __future__ import annotations

from dataclasses import dataclass

from ..fit.device_speed import DeviceSpeed
from ..fit.estimate import Machine, RunRequest

__all__ = ["PlanAsk", "PlanInputs"]


@dataclass(frozen=True)
class PlanInputs:
    """Where a plan is made: the machine as planned (bytes, bandwidths) and the figures its
    devices' speed is priced with."""

    machine: Machine
    #: This CPU's calibration (or a published prior for CPUs like it); None: the host is priced
    #: by its memory bandwidth alone (another machine's CPU, described by ``--ram``, was never timed here).
    host_speed: DeviceSpeed | None = None
    #: The GPU's published or typical figures; None: no GPU, or one without figures.
    gpu_speed: DeviceSpeed | None = None
    #: Whether the host is this machine (no ``--ram``): what only this machine can say is shown.
    host_is_here: bool = True


@dataclass(frozen=True)
class PlanAsk:
    """What is asked of one model: ``ctx`` tokens per slot (None: the most that fit),
    ``parallel`` slots (a count, ``"max"``, ``"auto"`` or None), the engine options of
    ``request``, and the ``users`` to price (None: one)."""

    ctx: int | None
    parallel: int | str | None
    request: RunRequest
    users: int | None = None
    #: No ``--ctx`` given (``ctx`` is the default): each slot gets at most the trained context.
    up_to_training: bool = False
    #: One model to serve: an explicit ``ctx`` past the trained context is capped there too, as
    #: llama-server caps each slot, and the plan says so.
    cap_at_training: bool = False

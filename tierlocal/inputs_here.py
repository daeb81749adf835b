"""The inputs of a plan made here (:class:`~tierlocal.plan.inputs.PlanInputs`), put together in
one place: the machine as planned, this CPU's figures when the host is this machine, and the
GPU's figures by its name."""

from __future__ import annotations

from .cpu_figures import host_speed_here
from .fit.estimate import Machine
from .gpu_figures import machine_gpu_speed
from .plan.inputs import PlanInputs

__all__ = ["plan_inputs"]


def plan_inputs(machine: Machine, engine_version: str | None, *, host_is_here: bool = True) -> PlanInputs:
    """``machine`` priced for a plan: with this CPU's calibration for ``engine_version`` (or the
    prior of CPUs like it) only when ``host_is_here`` (no ``--ram``: another machine's CPU was
    never timed here), and with the GPU's figures by its name."""
    host_speed = host_speed_here(engine_version, machine) if host_is_here else None
    return PlanInputs(machine, host_speed, machine_gpu_speed(machine), host_is_here)

"""This machine's CPU figures for a plan: its calibration, when `tierlocal hw --calibrate` filed one
for the engine build found here, else the prior from published runs of CPUs of its instruction
set at its core count (:mod:`tierlocal.fit.cpu_prior`, recipes/cpu_speed.toml). Only for this
machine: a host described with --ram has no CPU tierlocal knows."""

from __future__ import annotations

import psutil

from .catalog import load_cpu_rows
from .fit.cpu_prior import cpu_isa_class, cpu_prior, cpu_rates
from .fit.device_speed import DeviceSpeed
from .fit.estimate import Machine
from .hardware.detect import cpu_vendor
from .measure.calibration_cache import calibration_key, load_calibration

__all__ = ["host_speed_here"]


def host_speed_here(engine_version: str | None, machine: Machine) -> DeviceSpeed | None:
    """The figures this CPU is priced with (None: no calibration, and no published runs of CPUs
    like it: the plan keeps the memory-bandwidth bound). ``machine`` is this one, as planned."""
    calibrated = load_calibration(calibration_key(engine_version)) if engine_version else None
    if calibrated is not None:
        return calibrated
    isa = cpu_isa_class(machine.cpu_arch, machine.cpu_features)
    rates = cpu_rates(load_cpu_rows(), cpu_vendor(), isa) if isa is not None else None
    if rates is None:
        return None
    threads = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1  # llama-server's default -t: the physical cores
    return cpu_prior(rates, threads, machine.host_bandwidth)

"""Did the load do what the plan said? The plan (RunEstimate) against the LoadReport: layers
offloaded, context and slots, and per-device memory within the estimator's stated error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..engines.loadlog import LoadReport
from ..fit.estimate import DeviceUsage, RunEstimate

__all__ = ["DeviceDelta", "Verification", "verify_load", "TOTAL_TOLERANCE", "TOTAL_TOLERANCE_BYTES"]

#: Per-device totals the estimator promises (bench/estimate_accuracy.py: within ±5%).
TOTAL_TOLERANCE = 0.05
#: Below this difference (bytes) a device total is never called a mismatch: llama.cpp rounds
#: buffers, and small devices make percentages jumpy.
TOTAL_TOLERANCE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class DeviceDelta:
    """Planned and actual bytes on one device (weights + KV/state + compute + output)."""

    name: str
    planned_bytes: int
    actual_bytes: int

    @property
    def error(self) -> float | None:
        return (self.planned_bytes - self.actual_bytes) / self.actual_bytes if self.actual_bytes else None

    @property
    def within_tolerance(self) -> bool:
        return abs(self.planned_bytes - self.actual_bytes) <= max(TOTAL_TOLERANCE * self.actual_bytes, TOTAL_TOLERANCE_BYTES)


@dataclass
class Verification:
    """The comparison; ``problems`` are mismatches, ``warnings`` include a spill to RAM."""

    layers_planned: int
    layers_actual: int
    n_ctx_planned: int
    n_ctx_actual: int | None
    slots_planned: int
    slots_actual: int | None
    devices: list[DeviceDelta] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        """The documented ``delta`` object: actual − planned layers and context, per-device
        bytes with the relative error, and the verdict."""
        return {
            "layers": self.layers_actual - self.layers_planned,
            "n_ctx": None if self.n_ctx_actual is None else self.n_ctx_actual - self.n_ctx_planned,
            "devices": [
                {
                    "name": d.name,
                    "planned_bytes": d.planned_bytes,
                    "actual_bytes": d.actual_bytes,
                    "error": None if d.error is None else round(d.error, 4),
                }
                for d in self.devices
            ],
            "verified": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
        }


def verify_load(plan: RunEstimate, report: LoadReport, *, speed_for_ngl: Callable[[int], float | None] | None = None) -> Verification:
    """Compare; ``speed_for_ngl`` estimates decode tokens/s for a given -ngl (for the warning
    when fewer layers than planned landed on the GPU)."""
    params = plan.params
    layers_actual = report.layers_offloaded or 0
    result = Verification(
        layers_planned=plan.layers_offloaded,
        layers_actual=layers_actual,
        n_ctx_planned=params.n_ctx_padded,
        n_ctx_actual=report.n_ctx,
        slots_planned=params.n_seq_max,
        slots_actual=report.n_slots,
    )
    _verify_layers(plan, report, result, speed_for_ngl)
    if report.n_ctx is not None and report.n_ctx != params.n_ctx_padded:
        result.problems.append(f"planned a context of {params.n_ctx_padded} tokens, llama.cpp made {report.n_ctx}")
    if report.n_slots is not None and report.n_slots != params.n_seq_max:
        result.problems.append(f"planned {params.n_seq_max} slots, llama-server made {report.n_slots}")
    _verify_gpu_buffers(plan, report, result)
    host_planned = next(device for device in plan.devices if device.backend == "cpu")
    result.devices.append(DeviceDelta("host", _buffer_bytes(host_planned), report.host_bytes().total))
    _verify_projector(plan, report, result)
    for delta in result.devices:
        if not delta.within_tolerance and delta.error is not None:
            message = (
                f"{delta.name}: planned {delta.planned_bytes / 2**20:.0f} MiB, llama.cpp allocated {delta.actual_bytes / 2**20:.0f} MiB "
                f"({delta.error:+.1%})"
            )
            # The host side is reported, not failed: the CPU backend's repacked weight copies
            # (CPU_REPACK) are not in the estimate yet.
            (result.warnings if delta.name == "host" else result.problems).append(message)
    return result


def _buffer_bytes(device: DeviceUsage) -> int:
    """What llama.cpp reports as a device's buffers: weights, KV, compute, output, projector (not the runtime's overhead)."""
    return device.weights_bytes + device.kv_bytes + device.compute_bytes + device.output_bytes + device.projector_bytes


def _verify_layers(plan: RunEstimate, report: LoadReport, result: Verification, speed_for_ngl: Callable[[int], float | None] | None) -> None:
    """The layers on the GPU as planned; fewer is a problem, and a warning of the slowdown."""
    layers_actual = report.layers_offloaded or 0
    if layers_actual == plan.layers_offloaded:
        return
    result.problems.append(f"planned {plan.layers_offloaded} layers on the GPU, llama.cpp offloaded {layers_actual}")
    if layers_actual < plan.layers_offloaded:
        spilled = plan.layers_offloaded - layers_actual
        planned_speed = plan.est_decode_tokens_per_s
        actual_speed = speed_for_ngl(layers_actual) if speed_for_ngl else None
        # Both are memory-bandwidth ceilings: their ratio is the slowdown, not either figure.
        expect = (
            f": by memory bandwidth alone ≤ ~{actual_speed:.1f} tok/s instead of ≤ ~{planned_speed:.1f}" if planned_speed and actual_speed else ""
        )
        result.warnings.append(f"{spilled} layers run from system RAM{expect}")


def _verify_gpu_buffers(plan: RunEstimate, report: LoadReport, result: Verification) -> None:
    """Buffers on every GPU that was planned to hold something, and their total against the plan's."""
    gpu_planned = [device for device in plan.devices if device.backend != "cpu"]
    gpu_actual = report.gpu_buffers()
    holding = [device for device in gpu_planned if device.weights_bytes + device.kv_bytes + device.compute_bytes > 0]
    if len(gpu_actual) < len(holding):
        # "offloaded 19/19 layers to GPU" is printed by a build with no GPU backend as well: the
        # buffers are what show the memory went there.
        found = ", ".join(sorted(gpu_actual)) or "none"
        result.problems.append(
            f"planned buffers on {len(holding)} GPU(s) ({', '.join(d.name for d in holding)}); the load log shows GPU buffers on {found}"
        )
    if gpu_planned and gpu_actual:
        # Every GPU together (a layer split over several is planned per device): the overhead
        # is the runtime's, not a llama.cpp buffer.
        planned = sum(_buffer_bytes(device) for device in gpu_planned)
        actual = sum(sizes.total for sizes in gpu_actual.values())
        result.devices.append(DeviceDelta(", ".join(sorted(gpu_actual)), planned, actual))


def _verify_projector(plan: RunEstimate, report: LoadReport, result: Verification) -> None:
    """The projector loaded, on the device planned (its bytes are in the device totals)."""
    projector = plan.projector
    if projector is None:
        return
    if report.projector_backend is None:
        result.problems.append("planned a multimodal projector; the load log shows none loaded")
        return
    on_host = report.projector_backend.startswith("CPU")
    if on_host == projector.on_gpu:
        planned_where = "the GPU" if projector.on_gpu else "the CPU"
        result.problems.append(f"planned the projector on {planned_where}; llama.cpp put it on {report.projector_backend}")

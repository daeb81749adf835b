"""The speeds of a plan from the devices' figures: one stream's (decode, prefill, first token) and
many users' at once (:mod:`tierlocal.fit.concurrency`). Pure."""

from __future__ import annotations

from ..fit.concurrency import USER_COUNTS, UsersSpeed, batch_costs, users_table
from ..fit.cpu_kernels import cpu_kernels
from ..fit.device_speed import DeviceSpeed
from ..fit.estimate import Machine, RunEstimate
from ..fit.host_memory import repack_rules
from ..fit.model import ModelSpec
from ..fit.speed import TTFT_PROMPTS, DecodeSpeed, SpeedEstimate, bound_speed, decode_speed, estimate_speed

__all__ = ["host_figures", "users_speeds", "calibrated_speed", "plan_speeds", "batching_note", "most_users_at"]


def host_figures(estimate: RunEstimate, machine: Machine, host: DeviceSpeed | None, gpu: DeviceSpeed | None) -> DeviceSpeed | None:
    """The host's figures: its calibration, else (where a GPU's figures carry the rest) its memory bandwidth (``bound``)."""
    if host is None:
        if gpu is None or not estimate.layers_offloaded:
            return None
        note = f"{machine.host_bandwidth / 1e9:,.0f} GB/s memory bandwidth (not calibrated)"
        host = bound_speed("host CPU", machine.host_bandwidth, note)
    return host


def users_speeds(
    spec: ModelSpec, estimate: RunEstimate, machine: Machine, host: DeviceSpeed | None, gpu: DeviceSpeed | None, counts: list[int], basis: str
) -> tuple[UsersSpeed, ...]:
    """Each of ``counts`` users at once on the planned slots; a host without figures at its memory bandwidth (decode only,
    ``bound``)."""
    if host is None:
        host, basis = bound_speed("host CPU", machine.host_bandwidth, "memory bandwidth (not calibrated)"), basis if gpu else "bound"
    kernels = cpu_kernels(machine.cpu_arch, frozenset(repack_rules(machine.cpu_arch, machine.cpu_features)))
    costs = batch_costs(spec, estimate.request, {"host": host, "gpu": gpu}, cpu=kernels, max_tensor_bytes=machine.max_tensor_bytes)
    return users_table(costs, estimate.params.n_seq_max, counts=counts, basis=basis) if costs is not None else ()


def most_users_at(spec: ModelSpec, estimate: RunEstimate, machine: Machine, host: DeviceSpeed | None, gpu: DeviceSpeed | None, floor: float) -> int:
    """The most users at once, up to the planned slots, each of whom still decodes at ``floor``
    tokens/s or faster (1 when even one user does not: the plan then says it misses). Each user's
    decode falls as users are added, so the count is found by bisection."""
    basis = "calibrated" if host else "bound"

    def keeps(users: int) -> bool:
        rows = users_speeds(spec, estimate, machine, host, gpu, [users], basis)
        return bool(rows) and rows[0].per_user_decode_tokens_per_s >= floor

    low, high = 1, estimate.params.n_seq_max
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if keeps(middle) else (low, middle - 1)
    return low


def calibrated_speed(
    spec: ModelSpec, estimate: RunEstimate, machine: Machine, host: DeviceSpeed | None, gpu: DeviceSpeed | None, *, first_tokens: bool = True
) -> SpeedEstimate | None:
    """The speed from the devices' figures (with the times to first token when ``first_tokens``); a host not calibrated is priced at
    its memory bandwidth (``bound``) where a GPU's figures carry the rest. None: no figures at all."""
    host = host_figures(estimate, machine, host, gpu)
    if host is None:
        return None
    return estimate_speed(spec, estimate, host, gpu, max_tensor_bytes=machine.max_tensor_bytes, prompts=TTFT_PROMPTS if first_tokens else ())


def plan_speeds(
    spec: ModelSpec, estimate: RunEstimate, machine: Machine, host: DeviceSpeed | None, gpu: DeviceSpeed | None, *, detail: bool, users: int | None
) -> tuple[DecodeSpeed, tuple[UsersSpeed, ...]]:
    """One stream's speed (times to first token with ``detail``) and the users table: :data:`USER_COUNTS` with ``detail``, and
    ``users`` when asked."""
    fitted = calibrated_speed(spec, estimate, machine, host, gpu, first_tokens=detail)
    counts = sorted({*(USER_COUNTS if detail else ()), *((users,) if users else ())})
    table = users_speeds(spec, estimate, machine, host, gpu, counts, fitted.basis if fitted else "bound") if counts else ()
    return decode_speed(estimate, machine, fitted), table


def batching_note(estimate: RunEstimate) -> str | None:
    """With ``-np N`` and no ``--kv-unified`` one batch holds only the requests of consecutive slots
    (``split_equal`` in src/llama-batch.cpp), so users at once share fewer steps than the table prices."""
    params = estimate.params
    if params.kv_unified or params.n_seq_max < 2:
        return None
    return (
        f"with -np {params.n_seq_max} and no --kv-unified, llama-server batches only requests in consecutive slots, so users at once "
        "may each get as little as one user's step: plan with --users N (it adds -kvu) for the figures above"
    )

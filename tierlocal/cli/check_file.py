"""``tierlocal check SOURCE`` for one GGUF file (path, URL or hf:// file): its plan here, with
``--parallel max --min-speed`` cut to the users who keep that speed, and what `tierlocal bench`
measured of it."""

from __future__ import annotations

from dataclasses import replace

from .. import constants
from ..catalog import load_host_defaults
from ..errors import UsageError
from ..fit.concurrency import UsersSpeed
from ..fit.estimate import RunRequest
from ..fit.model import model_spec
from ..fit.users_measured import anchored, with_measured
from ..hardware.types import Hardware
from ..inputs_here import plan_inputs
from ..measure.calibration_cache import unused_calibration
from ..plan.inputs import PlanAsk
from ..plan.machine import machine_for
from ..plan.source import SourceCheck, check_source, parse_ctx, parse_parallel
from ..plan.speeds import most_users_at
from ..recommendation import engine_version
from ..serve.bench import bench_device, bench_key, bench_path, measured_speed
from ..serve.bench_users import measured_users

__all__ = ["check_one_source"]


def check_one_source(
    source: str, hardware: Hardware, ctx: str | None, parallel: str, request: RunRequest, users: int | None, floor: float | None = None
) -> SourceCheck:
    """``check SOURCE``: its plan here; with ``floor`` (``--parallel max --min-speed``) the most
    slots memory holds cut to the most users who each keep that speed."""
    from ..fetch.sources import read_headers  # the hub's client loads only when a file is read (~0.15 s)

    if "/" not in source and not source.endswith(".gguf"):
        hint = "see recipes/models.toml, or give a path, URL or hf://OWNER/REPO/FILE.gguf"
        raise UsageError(f"{source!r} is neither a catalog model nor a GGUF path", hint=hint)
    version = engine_version()
    where = plan_inputs(machine_for(hardware, load_host_defaults()), version, host_is_here=not hardware.ram_overridden)
    headers = read_headers(source)
    if floor is not None:
        request = replace(request, kv_unified=True)  # the slots are sized for users at once: one batch for all of them
    asked = ctx is None

    def plan(slots: int | str | None, users: int | None) -> SourceCheck:
        tokens = parse_ctx(ctx) if ctx is not None else constants.DEFAULT_CTX
        return check_source(source, headers, where, PlanAsk(tokens, slots, request, users, up_to_training=asked, cap_at_training=True))

    result = plan(parse_parallel(parallel), users)
    if floor is not None and result.estimate is not None and result.estimate.fits:
        held = result.estimate.params.n_seq_max
        kept = most_users_at(model_spec(headers), result.estimate, where.machine, where.host_speed, where.gpu_speed, floor)
        if kept < held:
            note = f"{held} slots fit in memory; {kept} keep each user at {floor:g} tok/s or faster (--min-speed), so the plan has {kept}"
            result = replace(plan(kept, users or kept), slots_note=note)
    unused = unused_calibration(version) if not hardware.ram_overridden else None
    key = _bench_key(source, result, version)
    measured, users_record = (measured_speed(key), measured_users(key)) if key else (None, None)
    table = with_measured(result.users, users_record) if users_record else _anchored(result, measured)
    return replace(result, measured=measured, calibration_note=unused, users=table)


def _anchored(result: SourceCheck, measured: dict[str, object] | None) -> tuple[UsersSpeed, ...]:
    """The users table scaled to a single-stream `tierlocal bench` of this file, engine and device (as it is without one)."""
    fitted = result.speed.estimate if result.speed else None
    decode, prefill = (measured or {}).get("decode_tokens_per_s"), (measured or {}).get("prefill_tokens_per_s")
    if fitted is None or not fitted.decode_tokens_per_s or not fitted.prefill_tokens_per_s:
        return result.users
    if not isinstance(decode, int | float) or not isinstance(prefill, int | float) or decode <= 0 or prefill <= 0:
        return result.users
    return anchored(result.users, decode / fitted.decode_tokens_per_s, fitted.prefill_tokens_per_s / prefill)


def _bench_key(source: str, result: SourceCheck, version: str | None) -> dict[str, object] | None:
    """What `tierlocal bench` files a measurement of this model file, the llama-server found here
    and the planned device under (None: no plan, no record yet, or no binary to name the build)."""
    if result.estimate is None or not version or not bench_path().is_file():
        return None
    return bench_key(source, version, bench_device(result.to_json()))

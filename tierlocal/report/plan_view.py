"""The dashboard's "machine and plan" figures, taken from what ``tierlocal status --json``
already says (one source of truth, no second computation): per device, the planned parts of
its memory beside what the load log reported. Pure.

The plan names its devices as they were planned ("RTX 3090 #0", "host (CPU, RAM)"); the load
report names llama.cpp's buffers ("CUDA0", "host"). They pair in order: the planned GPUs with
the reported accelerators as llama.cpp lists them, the host with the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from .svg import PARTS, DeviceBar

__all__ = ["device_bars"]

_KEYS = {name: f"{name}_bytes" for name, _ in PARTS}


def _parts(device: Mapping[str, object], names: tuple[str, ...]) -> dict[str, int]:
    return {name: int(device.get(_KEYS[name], 0) or 0) for name in names}  # type: ignore[call-overload]


def device_bars(status: Mapping[str, object]) -> list[DeviceBar]:
    """A bar per planned device from a ``status --json`` object: its planned weights, KV cache,
    compute, output and overhead against its size, and — paired as the module says — the bytes
    the load reported (llama.cpp reports no overhead: that part stays 0 there)."""
    plan = status.get("plan")
    actual = status.get("actual")
    planned = list(plan.get("devices", [])) if isinstance(plan, Mapping) else []
    reported = list(actual.get("devices", [])) if isinstance(actual, Mapping) else []
    reported_gpus = [d for d in reported if isinstance(d, Mapping) and d.get("name") != "host"]
    reported_host = next((d for d in reported if isinstance(d, Mapping) and d.get("name") == "host"), None)
    names = tuple(name for name, _ in PARTS)
    bars = []
    gpu_index = 0
    for device in planned:
        if not isinstance(device, Mapping):
            continue
        if device.get("backend") == "cpu":
            match = reported_host
        else:
            match = reported_gpus[gpu_index] if gpu_index < len(reported_gpus) else None
            gpu_index += 1
        bars.append(
            DeviceBar(
                name=str(device.get("name")),
                total_bytes=int(device.get("free_bytes") or device.get("total_bytes") or 0),
                planned=_parts(device, names),
                actual=None if match is None else _parts(match, names[:-1]),
            )
        )
    return bars


#: The columns of a serve's users table on the machine page.
USERS_COLUMNS = ("users", "each user, tok/s", "all users, tok/s", "first token p50", "p95", "waiting for a slot", "basis")


def users_rows(plan: Mapping[str, object]) -> list[list[str]]:
    """A plan's users table (``check --json``'s ``users``) as escaped cells, one row per user count."""
    rows = plan.get("users")
    cells = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping) or not isinstance(row.get("per_user_decode_tokens_per_s"), int | float):
            continue
        p50, p95 = row.get("first_token_p50_s"), row.get("first_token_p95_s")
        cells.append(
            [
                escape(str(row.get("users"))),
                f"{row['per_user_decode_tokens_per_s']:,.1f}",
                f"{row.get('aggregate_decode_tokens_per_s') or 0:,.1f}",
                "–" if not isinstance(p50, int | float) else f"{p50:,.2f} s",
                "–" if not isinstance(p95, int | float) else f"{p95:,.2f} s",
                escape(str(row.get("queued") or "–")),
                escape(str(row.get("basis"))),
            ]
        )
    return cells

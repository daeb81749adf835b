"""This CPU's calibrations on disk: ``$TIERLOCAL_HOME/calibration.json``, one entry per CPU
model, core count and engine build (what `tierlocal hw --calibrate` measured; read by every
plan that prices the host). Apart from the probe runs in :mod:`.calibrate` so that reading a
calibration does not load the GGUF writer and numpy."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .. import constants
from ..fit.device_speed import DeviceSpeed

__all__ = ["MAX_ENTRIES", "calibration_key", "load_calibration", "save_calibration", "unused_calibration"]

#: Most calibrations kept in the cache file.
MAX_ENTRIES = 32


def calibration_key(engine_version: str) -> dict[str, object]:
    """What a calibration is filed under: the CPU model, its cores, the engine build."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace")[: 1 << 20].splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count() or 1, "engine_version": engine_version}


def _cache_path() -> Path:
    return constants.home_dir() / "calibration.json"


def _entries(path: Path) -> list[dict[str, object]]:
    try:
        if path.stat().st_size > 4 << 20:
            return []
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [entry for entry in data if isinstance(entry, dict)][-MAX_ENTRIES:] if isinstance(data, list) else []


def save_calibration(key: dict[str, object], speed: DeviceSpeed, raw: list[dict[str, object]], *, memory_bytes_per_s: float | None) -> Path:
    """File ``speed`` under ``key`` (replacing an older one for the same key)."""
    path = _cache_path()
    entries = [entry for entry in _entries(path) if entry.get("key") != key]
    entries.append(
        {
            "key": key,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "speed": speed.to_json(),
            "memory_read_bytes_per_s": memory_bytes_per_s,
            "probes": raw,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries[-MAX_ENTRIES:], indent=1))
    temporary.replace(path)
    return path


def load_calibration(key: dict[str, object]) -> DeviceSpeed | None:
    """The cached calibration for ``key`` (None: none, or a damaged one)."""
    for entry in reversed(_entries(_cache_path())):
        if entry.get("key") == key and isinstance(entry.get("speed"), dict):
            try:
                return DeviceSpeed.from_json(entry["speed"])  # type: ignore[arg-type]
            except ValueError:
                return None
    return None


def unused_calibration(engine_version: str | None) -> str | None:
    """Why this CPU's calibration goes unused, when there is one that the engine found here does
    not match — a calibration is filed under the engine build that timed it (None: there is none
    for this CPU, or the engine found here has its own)."""
    key = calibration_key(engine_version or "")
    if engine_version is not None and load_calibration(key) is not None:
        return None
    mine = [entry for entry in _entries(_cache_path()) if _cpu_part(entry.get("key")) == _cpu_part(key)]
    if not mine:
        return None
    latest = mine[-1]
    filed = latest["key"]
    assert isinstance(filed, dict)  # _cpu_part matched it
    when = str(latest.get("time", ""))[:10]
    build = f"llama-server {filed.get('engine_version')}"
    if engine_version is None:
        return (
            f"this CPU was calibrated on {when} with {build}, and no llama-server was found here to match it: its figures go unused "
            "until one is (set TIERLOCAL_LLAMA_SERVER to it, or `tierlocal engine build`)"
        )
    return (
        f"this CPU was calibrated on {when} with {build}, not with the llama-server found here ({engine_version}): "
        "`tierlocal hw --calibrate` times it with this one"
    )


def _cpu_part(key: object) -> dict[str, object] | None:
    """A calibration key without its engine build (None: not a key)."""
    return {name: value for name, value in key.items() if name != "engine_version"} if isinstance(key, dict) else None

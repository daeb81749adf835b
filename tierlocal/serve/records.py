"""The JSON-lines files tierlocal keeps under ``$TIERLOCAL_HOME`` (``loads.jsonl``: verified
loads; ``bench.jsonl``: measured speeds): one JSON object per line, appended, and read back with
one set of bounds — the newest :data:`MAX_RECORDS` lines, a line over :data:`MAX_LINE_BYTES`
skipped as damaged, as is a line that is not a JSON object."""

from __future__ import annotations

import json
import time
from pathlib import Path

__all__ = ["MAX_LINE_BYTES", "MAX_RECORDS", "append_record", "read_records"]

#: Most recent records read (the files only grow; older lines are ignored).
MAX_RECORDS = 1000
#: Longest line read (bytes): a verified load's record holds its plan, a few KiB.
MAX_LINE_BYTES = 1 << 20


def read_records(path: Path) -> list[dict[str, object]]:
    """The newest records of ``path``, oldest first ([] when it cannot be read)."""
    try:
        lines = path.read_bytes().splitlines()[-MAX_RECORDS:]
    except OSError:
        return []
    records = []
    for line in lines:
        if len(line) > MAX_LINE_BYTES:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def append_record(path: Path, record: dict[str, object]) -> None:
    """Append ``record`` to ``path`` with the time it was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **record}) + "\n")

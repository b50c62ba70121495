"""Where a notebook job's executed copy is: ``notebook.json`` in the job's spool folder.

The job process writes it when it starts (it alone knows the default path, which holds
the job id); the Jupyter server (REST, so the sidebar can open the copy) and
``dlsched history`` read it. It is the owner's file in the owner's folder, like the
job's log, and holds JSON only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD = "notebook.json"
#: a record larger than this is not one this code wrote
_MAX = 64 * 1024


def write_record(folder: Path, record: dict[str, Any]) -> None:
    from ..vocab import private

    private.write_file(folder / RECORD, json.dumps(record).encode())


def read_record(folder: Path) -> dict[str, Any] | None:
    """``{"input", "output", "parameters", "kernel"}``, or None (not started, not ours)."""
    try:
        fd = os.open(folder / RECORD, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX + 1)
    try:
        record = json.loads(data) if len(data) <= _MAX else None
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("output"), str):
        return None
    return {k: record.get(k) for k in ("input", "output", "parameters", "kernel")}

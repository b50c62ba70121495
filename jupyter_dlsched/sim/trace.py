"""Job traces: the Philly cluster trace and a plain CSV format, loaded as ``TraceJob`` lists.

Submit times are seconds from the first job kept, so every replay starts at 0.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import DlschedError

PHILLY_ATTRIBUTION = (
    "Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0; "
    "processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact)"
)


class TraceError(DlschedError, ValueError):
    """A trace file or filter is unusable; the message says where and why."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: when it arrived, how many GPUs it held and for how long it ran.

    >>> TraceJob("j1", submit=0.0, gpus=2, duration=60.0).gpu_time
    120.0
    """

    id: str
    submit: float
    gpus: int
    duration: float
    owner: str = ""
    priority: int = 50

    @property
    def gpu_time(self) -> float:
        return self.gpus * self.duration


def load_trace(path: str | Path, **filters: object) -> list[TraceJob]:
    """Load ``path`` as a Philly trace if its header says so, else as plain CSV."""
    with open(path, newline="") as f:
        header = f.readline()
    if "timestamp" in header and "cluster" in header:
        return load_philly(path, **filters)  # type: ignore[arg-type]
    if filters:
        return _filter(load_csv(path), **filters)  # type: ignore[arg-type]
    return load_csv(path)


def load_philly(
    path: str | Path,
    cluster: str | Iterable[str] | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    max_gpus: int | None = None,
    sample: float | int | None = None,
    seed: int = 0,
) -> list[TraceJob]:
    """Jobs of the Philly trace (rows in any order), filtered and sorted by submit time.

    * ``cluster``: one virtual cluster id (``"ed69ec"``) or several;
    * ``start`` / ``end``: keep jobs submitted in ``[start, end)``
      (``"2017-10-01"`` or ``"2017-10-01 12:00:00"``);
    * ``max_gpus``: drop jobs asking for more GPUs;
    * ``sample``: keep a fraction (``0.1``) or a count (``500``) of the jobs,
      chosen with a ``random.Random(seed)``, so the same seed keeps the same jobs.

    The owner of each job is its virtual cluster (a team sharing a quota in Philly).
    Job ids are ``philly-<row>``, the data row number in the file.
    """
    clusters = {cluster} if isinstance(cluster, str) else set(cluster) if cluster else None
    lo = _when(start, "start")
    hi = _when(end, "end")
    rows: list[tuple[datetime, int, int, float, str]] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"timestamp", "duration", "num_gpus", "cluster"}
        if not need.issubset(reader.fieldnames or ()):
            raise TraceError(f"{path}: a Philly trace needs the columns {', '.join(sorted(need))}")
        for row_no, row in enumerate(reader, start=1):
            if clusters is not None and row["cluster"] not in clusters:
                continue
            try:
                when = datetime.fromisoformat(row["timestamp"])
                gpus = int(float(row["num_gpus"]))
                duration = float(row["duration"])
            except ValueError as exc:
                raise TraceError(f"{path}, data row {row_no}: {exc}") from None
            if (lo is not None and when < lo) or (hi is not None and when >= hi):
                continue
            if gpus < 1 or (max_gpus is not None and gpus > max_gpus):
                continue
            rows.append((when, row_no, gpus, duration, row["cluster"]))
    if sample is not None:
        rows = _sample(rows, sample, seed)
    rows.sort()
    if not rows:
        return []
    t0 = rows[0][0]
    return [
        TraceJob(f"philly-{n}", (when - t0).total_seconds(), gpus, duration, owner)
        for when, n, gpus, duration, owner in rows
    ]


def load_csv(path: str | Path) -> list[TraceJob]:
    """Jobs from ``submit_time,num_gpus,duration[,owner,priority]`` rows (seconds).

    A header row is optional; with one, columns may come in any order.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    ...     _ = f.write("0,1,10\\n5,2,20,ana,100\\n")
    >>> [(j.submit, j.gpus, j.duration, j.owner, j.priority) for j in load_csv(f.name)]
    [(0.0, 1, 10.0, '', 50), (5.0, 2, 20.0, 'ana', 100)]
    >>> os.unlink(f.name)
    """
    columns = ["submit_time", "num_gpus", "duration", "owner", "priority"]
    jobs: list[tuple[float, int, TraceJob]] = []
    with open(path, newline="") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if line_no == 1 and not _is_number(row[0]):
                columns = [c.strip() for c in row]
                missing = {"submit_time", "num_gpus", "duration"} - set(columns)
                if missing:
                    raise TraceError(f"{path}: header lacks {', '.join(sorted(missing))}")
                continue
            field = dict(zip(columns, (c.strip() for c in row), strict=False))
            try:
                submit = float(field["submit_time"])
                gpus = int(float(field["num_gpus"]))
                duration = float(field["duration"])
                priority = int(field.get("priority") or 50)
            except (KeyError, ValueError) as exc:
                raise TraceError(
                    f"{path}, line {line_no}: expected submit_time,num_gpus,duration"
                    f"[,owner,priority] as numbers ({exc})"
                ) from None
            if gpus < 1 or duration < 0:
                raise TraceError(f"{path}, line {line_no}: num_gpus must be >= 1 and duration >= 0")
            job = TraceJob(
                f"job-{line_no}", submit, gpus, duration, field.get("owner", ""), priority
            )
            jobs.append((submit, line_no, job))
    jobs.sort(key=lambda item: (item[0], item[1]))
    if not jobs:
        return []
    t0 = jobs[0][0]
    return [
        TraceJob(j.id, j.submit - t0, j.gpus, j.duration, j.owner, j.priority) for _, _, j in jobs
    ]


def _filter(
    jobs: list[TraceJob],
    max_gpus: int | None = None,
    sample: float | int | None = None,
    seed: int = 0,
) -> list[TraceJob]:
    if max_gpus is not None:
        jobs = [j for j in jobs if j.gpus <= max_gpus]
    if sample is not None:
        jobs = sorted(_sample(jobs, sample, seed), key=lambda j: (j.submit, j.id))
    return jobs


def _sample(rows: list, sample: float | int, seed: int) -> list:
    if isinstance(sample, float) and 0 < sample <= 1:
        count = round(len(rows) * sample)
    elif isinstance(sample, int) and sample >= 1:
        count = min(sample, len(rows))
    else:
        raise TraceError(f"sample={sample!r}: expected a fraction in (0, 1] or a count >= 1")
    return random.Random(seed).sample(rows, count)


def _when(value: str | datetime | None, name: str) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise TraceError(f"{name}={value!r}: expected a date like 2017-10-01 12:00:00") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

"""Job traces: the Philly cluster trace and a plain CSV format, loaded as ``TraceJob`` lists.

Submit times are seconds from the first job kept, so every replay starts at 0.
Every loader checks each row before the replay sees it: a number that is not
finite, a negative time or GPU count stops loading with a ``TraceError`` that
names the file and the line, because one ``nan`` would otherwise stall the
replay's clock.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from ..vocab.errors import DlschedError

PHILLY_ATTRIBUTION = (
    "Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0; "
    "processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact)"
)
CSV_COLUMNS = "submit_time,num_gpus,duration[,owner,priority]"
# columns a plain CSV may add when it has a header
CSV_EXTRA_COLUMNS = ("name", "gpu_milli")
_GPU_WORDS = "a share of one GPU (0 < gpus < 1) or a whole number of GPUs >= 1"
PHILLY_COLUMNS = ("cluster", "duration", "num_gpus", "timestamp")


class TraceError(DlschedError, ValueError):
    """A trace file or filter is unusable; the message says where and why."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: when it arrived, how many GPUs it held and for how long it ran.

    Times are seconds: ``submit`` and ``duration`` finite and >= 0. ``gpus`` is
    a whole number >= 1 (dedicated GPUs) or a share of one GPU in (0, 1),
    placed next to other shares as the live scheduler places ``gpus=0.5``.
    ``name`` is the job's name (learning policies group finished jobs by owner
    and name).

    >>> TraceJob("j1", submit=0.0, gpus=2, duration=60.0).gpu_time
    120.0
    >>> TraceJob("j3", submit=0.0, gpus=0.25, duration=60.0).gpu_time
    15.0
    >>> TraceJob("j2", submit=0.0, gpus=1, duration=float("nan"))
    Traceback (most recent call last):
    ...
    jupyter_dlsched.sim.trace.TraceError: job 'j2': duration=nan is invalid: expected seconds >= 0
    """

    id: str
    submit: float
    gpus: float
    duration: float
    owner: str = ""
    priority: int = 50
    name: str = ""
    # an elastic job's range of whole GPUs (min, max); ``duration`` is its run time on
    # ``gpus`` GPUs, and a speedup model says how fast it runs on others (``sim.elastic``)
    elastic: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        # a nan or inf here would stall the replay's clock, so no job may carry one
        for name in ("submit", "duration"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise TraceError(
                    f"job {self.id!r}: {name}={value!r} is invalid: expected seconds >= 0"
                )
        gpus = self.gpus
        if not (isinstance(gpus, int | float) and math.isfinite(gpus) and gpus > 0) or (
            gpus > 1 and not float(gpus).is_integer()
        ):
            raise TraceError(f"job {self.id!r}: gpus={gpus!r} is invalid: expected {_GPU_WORDS}")

    @property
    def gpu_time(self) -> float:
        return self.gpus * self.duration


class Trace(list[TraceJob]):
    """The jobs a loader kept, sorted by submit time, and the jobs it had to drop.

    ``format`` is ``"philly"`` or ``"csv"``. ``dropped`` maps why jobs were
    dropped (``"asking for more than 8 GPUs"``) to how many; jobs left out by
    a choice of cluster, time window or sample are not counted as dropped.
    A ``Trace`` compares equal to a plain list of the same jobs.
    """

    def __init__(
        self,
        jobs: Iterable[TraceJob] = (),
        format: str = "csv",
        dropped: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(jobs)
        self.format = format
        self.dropped = dict(dropped or {})

    def dropped_lines(self) -> list[str]:
        """One sentence per reason, e.g. ``"dropped 12 jobs asking for more than 8 GPUs"``."""
        return [
            f"dropped {n} job{'' if n == 1 else 's'} {why}" for why, n in self.dropped.items() if n
        ]


def load_trace(
    path: str | Path,
    cluster: str | Iterable[str] | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    max_gpus: int | None = None,
    sample: float | int | None = None,
    seed: int = 0,
) -> Trace:
    """Load ``path`` as a Philly trace if its header says so, else as plain CSV.

    The filters are those of ``load_philly``; ``cluster``, ``start`` and ``end``
    need a Philly trace (a plain CSV has neither clusters nor dates) and say so.
    """
    # read once: a pipe or a process substitution (/dev/stdin, <(...)) cannot be read twice
    text = _read(path)
    header = text.split("\n", 1)[0]
    if "timestamp" in header and "cluster" in header:
        return _load_philly(path, text, cluster, start, end, max_gpus, sample, seed)
    for name, value, needs in (
        ("cluster", cluster, "a cluster column"),
        ("start", start, "timestamps"),
        ("end", end, "timestamps"),
    ):
        if value is not None:
            raise TraceError(
                f"{path} is a plain CSV trace ({CSV_COLUMNS}, times in seconds); filtering by "
                f"{name} needs a Philly trace, which has {needs}"
            )
    return _filter(_load_csv(path, text), max_gpus, sample, seed)


def load_philly(
    path: str | Path,
    cluster: str | Iterable[str] | None = None,
    start: str | datetime | None = None,
    end: str | datetime | None = None,
    max_gpus: int | None = None,
    sample: float | int | None = None,
    seed: int = 0,
) -> Trace:
    """Jobs of the Philly trace (rows in any order), filtered and sorted by submit time.

    * ``cluster``: one virtual cluster id (``"ed69ec"``) or several;
    * ``start`` / ``end``: keep jobs submitted in ``[start, end)``
      (``"2017-10-01"`` or ``"2017-10-01 12:00:00"``);
    * ``max_gpus``: drop jobs asking for more GPUs (counted in ``Trace.dropped``);
    * ``sample``: keep a fraction (``0.1``) or a count (``500``) of the jobs,
      chosen with a ``random.Random(seed)``, so the same seed keeps the same jobs.

    The owner of each job is its virtual cluster (a team sharing a quota in Philly).
    Job ids are ``philly-<row>``, the data row number in the file. Jobs asking
    for no GPUs are dropped (and counted); a duration or GPU count that is not
    a finite number >= 0 is a ``TraceError`` naming the line.
    """
    return _load_philly(path, _read(path), cluster, start, end, max_gpus, sample, seed)


def _load_philly(
    path: str | Path,
    text: str,
    cluster: str | Iterable[str] | None,
    start: str | datetime | None,
    end: str | datetime | None,
    max_gpus: int | None,
    sample: float | int | None,
    seed: int,
) -> Trace:
    clusters = {cluster} if isinstance(cluster, str) else set(cluster) if cluster else None
    lo = _when(start, "start")
    hi = _when(end, "end")
    if lo is not None and hi is not None and lo >= hi:
        raise TraceError(f"start={start!s} is not before end={end!s}: no job could be kept")
    rows: list[tuple[datetime, int, float, float, str]] = []
    no_gpus = too_big = 0
    with _parsing(path, text) as f:
        reader = csv.DictReader(f)
        if not set(PHILLY_COLUMNS).issubset(reader.fieldnames or ()):
            raise TraceError(
                f"{path}: a Philly trace needs the columns {', '.join(PHILLY_COLUMNS)}"
            )
        for row_no, row in enumerate(reader, start=1):
            if clusters is not None and row["cluster"] not in clusters:
                continue
            try:
                when = _timestamp(row["timestamp"])
                gpus = _gpus(row["num_gpus"], minimum=0)
                duration = _seconds(row["duration"], "duration")
            except ValueError as exc:
                raise TraceError(f"{path}, line {reader.line_num}: {exc}") from None
            if (lo is not None and when < lo) or (hi is not None and when >= hi):
                continue
            if gpus <= 0:
                no_gpus += 1
                continue
            if max_gpus is not None and gpus > max_gpus:
                too_big += 1
                continue
            rows.append((when, row_no, gpus, duration, row["cluster"]))
    dropped = {"asking for no GPUs": no_gpus}
    if max_gpus is not None:
        dropped[f"asking for more than {_gpus_words(max_gpus)}"] = too_big
    if sample is not None:
        rows = _sample(rows, sample, seed)
    rows.sort()
    dropped = {why: n for why, n in dropped.items() if n}
    if not rows:
        return Trace([], "philly", dropped)
    t0 = rows[0][0]
    return Trace(
        (
            TraceJob(f"philly-{n}", (when - t0).total_seconds(), gpus, duration, owner)
            for when, n, gpus, duration, owner in rows
        ),
        "philly",
        dropped,
    )


def load_csv(path: str | Path) -> Trace:
    """Jobs from ``submit_time,num_gpus,duration[,owner,priority]`` rows (seconds).

    A header row is optional; with one, columns may come in any order and two
    more may be given: ``name`` (the job's name) and ``gpu_milli`` (the share
    of each GPU the job used, in thousandths, as in Alibaba's GPU traces:
    ``num_gpus=1,gpu_milli=500`` is half a GPU). Blank lines and lines starting
    with ``#`` are skipped. Times must be finite and >= 0 and ``num_gpus`` a
    share of one GPU in (0, 1) or a whole number >= 1; anything else (``2.7``
    GPUs) is a ``TraceError`` naming the line, never rounded silently.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    ...     _ = f.write("0,1,10\\n5,2,20,ana,100\\n")
    >>> [(j.submit, j.gpus, j.duration, j.owner, j.priority) for j in load_csv(f.name)]
    [(0.0, 1, 10.0, '', 50), (5.0, 2, 20.0, 'ana', 100)]
    >>> os.unlink(f.name)
    """
    return _load_csv(path, _read(path))


def _load_csv(path: str | Path, text: str) -> Trace:
    columns = ["submit_time", "num_gpus", "duration", "owner", "priority"]
    rows: list[tuple[float, int, float, float, str, int, str]] = []
    header_read = False
    with _parsing(path, text) as f:
        reader = csv.reader(f)
        for record_no, row in enumerate(reader, start=1):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            line = reader.line_num
            if not rows and not header_read and not _is_number(row[0]):
                named = [c.strip() for c in row]
                missing = {"submit_time", "num_gpus", "duration"} - set(named)
                if missing:
                    raise TraceError(
                        f"{path}, line {line}: expected rows {CSV_COLUMNS} or a header naming "
                        f"those columns; this line is neither (no {', '.join(sorted(missing))})"
                    )
                columns, header_read = named, True
                continue
            field = dict(zip(columns, (c.strip() for c in row), strict=False))
            try:
                submit = _seconds(field.get("submit_time"), "submit_time")
                gpus = _gpus(field.get("num_gpus"), minimum=1)
                if field.get("gpu_milli"):
                    gpus = _milli(field["gpu_milli"], gpus)
                duration = _seconds(field.get("duration"), "duration")
                priority = _priority(field.get("priority"))
            except ValueError as exc:
                raise TraceError(
                    f"{path}, line {line}: {exc}; rows are {CSV_COLUMNS}, times in seconds"
                ) from None
            rows.append(
                (
                    submit,
                    record_no,
                    gpus,
                    duration,
                    field.get("owner", ""),
                    priority,
                    field.get("name", ""),
                )
            )
    rows.sort(key=lambda r: (r[0], r[1]))
    t0 = rows[0][0] if rows else 0.0
    return Trace(
        (TraceJob(f"job-{n}", s - t0, g, d, owner, p, name) for s, n, g, d, owner, p, name in rows),
        "csv",
    )


def _filter(
    jobs: Trace,
    max_gpus: int | None = None,
    sample: float | int | None = None,
    seed: int = 0,
) -> Trace:
    kept: list[TraceJob] = list(jobs)
    dropped = dict(jobs.dropped)
    if max_gpus is not None:
        kept = [j for j in jobs if j.gpus <= max_gpus]
        if len(kept) < len(jobs):
            dropped[f"asking for more than {_gpus_words(max_gpus)}"] = len(jobs) - len(kept)
    if sample is not None:
        kept = sorted(_sample(kept, sample, seed), key=lambda j: (j.submit, j.id))
    return Trace(kept, jobs.format, dropped)


def _sample(rows: list, sample: float | int, seed: int) -> list:
    if isinstance(sample, float) and 0 < sample <= 1:
        count = round(len(rows) * sample)
    elif isinstance(sample, int) and sample >= 1:
        count = min(sample, len(rows))
    else:
        raise TraceError(f"sample={sample!r}: expected a fraction in (0, 1] or a count >= 1")
    return random.Random(seed).sample(rows, count)


def _read(path: str | Path) -> str:
    """The whole text of ``path``, read once; what goes wrong while reading is a ``TraceError``."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return f.read()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file; give the path of a trace file") from None
    except IsADirectoryError:
        raise TraceError(
            f"{path} is a folder; give a trace file (Philly CSV or {CSV_COLUMNS} rows)"
        ) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path}: not a UTF-8 text file (byte {exc.start}); a trace is a CSV file"
        ) from None


@contextmanager
def _parsing(path: str | Path, text: str) -> Iterator[IO[str]]:
    """``text`` (read from ``path``) as a stream; a malformed CSV is a ``TraceError``."""
    try:
        yield io.StringIO(text, newline="")
    except csv.Error as exc:
        raise TraceError(f"{path}: not a readable CSV file ({exc})") from None


def _number(text: str | None, column: str) -> float:
    if text is None or not text.strip():
        raise ValueError(f"{column} is missing")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{column}={text!r} is not a number") from None


def _seconds(text: str | None, column: str) -> float:
    value = _number(text, column)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{column}={text!r} is invalid: expected seconds, a finite number >= 0")
    return value


def _gpus(text: str | None, minimum: int) -> float:
    """A GPU count: a share of one GPU in (0, 1) or a whole number (0 only if ``minimum`` is 0)."""
    value = _number(text, "num_gpus")
    if not math.isfinite(value) or value < 0 or (value == 0 and minimum > 0):
        raise ValueError(f"num_gpus={text!r} is invalid: expected {_GPU_WORDS}")
    if value > 1 and not value.is_integer():
        # parts of several GPUs are not modelled; rounding would change the load unseen
        raise ValueError(
            f"num_gpus={text!r} is invalid: expected {_GPU_WORDS}; a job cannot hold part of "
            f"several GPUs here: write {math.ceil(value)} if it held {math.ceil(value)} GPUs"
        )
    return int(value) if value.is_integer() else value


def _milli(text: str, gpus: float) -> float:
    """``gpus`` adjusted by a ``gpu_milli`` share (thousandths of each GPU used)."""
    value = _number(text, "gpu_milli")
    if not math.isfinite(value) or not 0 < value <= 1000:
        raise ValueError(
            f"gpu_milli={text!r} is invalid: expected thousandths of a GPU, in (0, 1000]"
        )
    if value == 1000:
        return gpus
    if gpus != 1:
        raise ValueError(
            f"gpu_milli={text!r} with num_gpus={gpus:g}: a share of a GPU is modelled for "
            "one GPU only (num_gpus=1)"
        )
    return value / 1000


def _priority(text: str | None) -> int:
    if text is None or not text.strip():
        return 50
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"priority={text!r} is invalid: expected a whole number") from None


def _timestamp(text: str | None) -> datetime:
    if text is None or not text.strip():
        raise ValueError("timestamp is missing")
    try:
        return _naive(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(
            f"timestamp={text!r} is invalid: expected a date like 2017-10-01 12:00:00"
        ) from None


def _when(value: str | datetime | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return _naive(value if isinstance(value, datetime) else datetime.fromisoformat(value))
    except ValueError:
        raise TraceError(f"{name}={value!r}: expected a date like 2017-10-01 12:00:00") from None


def _naive(when: datetime) -> datetime:
    # Philly's timestamps carry no zone; one written with a zone is compared in UTC,
    # since naive and zoned datetimes cannot be compared or subtracted
    if when.tzinfo is None:
        return when
    try:
        return when.astimezone(timezone.utc).replace(tzinfo=None)
    except OverflowError:
        raise ValueError(f"{when} is out of range in UTC") from None


def _gpus_words(n: float) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

"""The ledger's schema: job states and their state machine, and ``JobInfo`` (the tables
are built by ``migrations.py``).

Pure definitions; ``store/`` does the reading and writing.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass, field, fields
from typing import Any

from .resources import Placement, Request

ACTIVE = ("queued", "running", "preempted")
WAITING = ("queued", "preempted")
#: A job that succeeded while its process still exits keeps its lease, and its grant,
#: until its supervisor releases them (``Lease.finish(..., hold=True)``, ``Lease.release``);
#: the SQL condition of such a job, which the ``jobs_held`` index answers.
HELD_GRANT = "state='succeeded' AND lease_expires IS NOT NULL"
#: The jobs whose grant is taken: running ones and held successes. What the pool's views
#: count as busy, as the decisions do.
HOLDING = f"(state='running' OR ({HELD_GRANT}))"
TERMINAL = ("succeeded", "failed", "cancelled", "timeout", "lost")
STATES = ACTIVE + TERMINAL
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled", "failed"}),
    # running -> queued is a retry after a failure or a lost lease
    "running": frozenset(
        {"succeeded", "failed", "cancelled", "timeout", "lost", "preempted", "queued"}
    ),
    "preempted": frozenset({"running", "cancelled", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "timeout": frozenset(),
    "lost": frozenset(),
}


@dataclass(frozen=True)
class RunEnd:
    """How one run of a job ended, as the runner that watched it saw it.

    ``outcome`` is ``succeeded``, ``failed``, ``lost``, ``timeout``, ``cancelled`` or
    ``preempted``; ``retry=False`` for a failure no retry can fix (a backend that cannot
    run the request at all, a job that runs in a kernel thread once).
    """

    outcome: str
    reason: str = ""
    exit_code: int | None = None
    term_signal: int | None = None
    retry: bool = True


def held_gpus(job: JobInfo) -> float:
    """The GPUs ``job`` holds in its current run: an elastic job's size, else its request."""
    if job.max_gpus is not None and job.placement is not None:
        return float(len(job.placement.gpus))
    return job.gpus


def end_of_run(job: JobInfo, end: RunEnd, now: float) -> tuple[str, str, dict[str, Any]]:
    """The one rule every runner follows: the state a run's end moves its job to, the
    reason shown, and the columns to write. A failed or lost run is retried (queued
    again) while the job has retries left; a preempted one is requeued and counted.
    """
    if end.outcome not in TRANSITIONS["running"] or end.outcome == "queued":
        raise ValueError(f"a run cannot end as {end.outcome!r}")
    to, why = end.outcome, end.reason
    columns: dict[str, Any] = {
        "exit_code": end.exit_code,
        "term_signal": end.term_signal,
        "lease_expires": None,
        "cpu_now": None,
        "rss_now": None,
        "attained": job.attained + max(0.0, now - (job.started or now)) * held_gpus(job),
        "run_time": (job.run_time or 0.0) + max(0.0, now - (job.started or now)),
    }
    if to == "cancelled":
        why = why or "cancelled by user"
    elif to == "preempted" and job.resize_to:
        # an elastic job stopped for a resize: the next decision starts it on its new GPUs
        size = len(Placement.from_json(json.loads(job.resize_to)).gpus)
        why = f"resizing to {size} GPU{'s' if size != 1 else ''}"
        columns.update(placement=None, supervisor_pid=None, job_pid=None, preempt_requested=0)
    elif to == "preempted":
        why = "requeued after preemption"
        columns.update(
            placement=None,
            supervisor_pid=None,
            job_pid=None,
            preempt_requested=0,
            preemptions=job.preemptions + 1,
        )
    if to in ("failed", "lost") and end.retry and job.attempts <= job.retries:
        to, why = "queued", f"retry {job.attempts}/{job.retries} after: {why}"
        columns.update(placement=None, supervisor_pid=None, job_pid=None)
    if to not in ("queued", "preempted"):
        columns["finished"] = now
    return to, why, columns


_ID = re.compile(r"^[a-z0-9]{4,16}$")
_SOURCE_ID = re.compile(r"^[0-9a-f]{24}$")
_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def source_id(uid: int, source: str) -> str:
    """The id of one user's staging of one source (its row in ``stagings``)."""
    return hashlib.sha256(f"{uid}\0{source}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class JobInfo:
    """One row of the ledger: what a job asked for, where it is, what happened.

    >>> info = dls.jobs()[0]  # doctest: +SKIP
    >>> info.state, info.devices  # doctest: +SKIP
    ('running', [0])
    """

    seq: int
    id: str
    name: str
    kind: str
    owner: str
    uid: int
    origin: str
    state: str
    reason: str
    priority: int
    gpus: float
    gpu_mem: int | None
    cpus: float
    mem: int
    deadline: float | None
    time_limit: float | None
    retries: int
    attempts: int
    preemptible: bool
    preemptions: int
    distributed: bool
    after: tuple[str, ...]
    backend: str
    submitted: float
    started: float | None
    finished: float | None
    placement: Placement | None
    host: str | None
    supervisor_pid: int | None
    job_pid: int | None
    lease_expires: float | None
    exit_code: int | None
    term_signal: int | None
    cancel_requested: bool
    preempt_requested: bool
    progress: dict[str, Any] | None
    attained: float
    waiting: str | None
    # a waiting job's place in its backend's line, 1 first; None before the pool placed it
    # (the ledger keeps a rank, numbered when read: store/job_reads.py)
    position: int | None
    env: dict[str, str]
    inline: bool
    # usage over all attempts; None where it was not measured (simulated GPUs, Ray, SLURM)
    cpu_time: float | None = None
    peak_rss: int | None = None
    peak_gpu_mem: int | None = None
    # seconds it ran, over every attempt (its runs that ended); None before it first ran
    run_time: float | None = None
    # a running job's use now (None once it ended): percent of one core over the last few
    # seconds, and bytes resident in all of its processes
    cpu_now: float | None = None
    rss_now: int | None = None
    # inputs staged while the job waits: name -> source (a path or URL)
    stage_in: dict[str, str] = field(default_factory=dict)
    # the finished job this one runs again (`dlsched requeue`, `dls.requeue`), else None
    requeue_of: str | None = None
    # an elastic job's most GPUs (``gpus`` is its minimum); None for a rigid job
    max_gpus: int | None = None
    # the size an elastic job waits in line at (``"1:2:4"``) when above its minimum, else None
    asked_gpus: int | None = None
    # the placement (JSON) an elastic job being resized starts again on, until it has
    resize_to: str | None = None
    # epoch seconds before which the job does not start (`--begin`), else None
    begin: float | None = None
    # while it waits: when it should start (epoch seconds), expected and a cautious bound
    # that 80 % of jobs start by (jupyter_dlsched.forecast.replay); None when not estimated
    expected_start: float | None = None
    start_p80: float | None = None
    # bytes it carried in (pickle, context and big buffers' files) and bytes of the result
    # it left (``result.pkl`` and its buffers' files); None where not known
    input_bytes: int | None = None
    result_bytes: int | None = None

    @property
    def gpu_hours(self) -> float:
        """GPU time held, in hours: GPUs granted × time running, over every attempt."""
        return self.attained / 3600.0

    @property
    def request(self) -> Request:
        return Request(self.gpus, self.gpu_mem, self.cpus, self.mem)

    @property
    def gpus_held(self) -> float:
        """The GPUs it holds in this run: an elastic job's size now, else what it asked for."""
        return held_gpus(self)

    @property
    def request_text(self) -> str:
        """``"2 GPU · 8 CPU"``; an elastic job's GPUs as now (waiting: the size it waits
        at) and its range: ``"2 GPUs (1–4)"``."""
        text = self.request.describe()
        if self.max_gpus is None:
            return text
        low = int(self.gpus)
        size = len(self.placement.gpus) if self.placement else (self.asked_gpus or low)
        words = f"{size} GPU{'s' if size != 1 else ''} ({low}–{self.max_gpus})"
        return text.replace(f"{low} GPU", words, 1)

    @property
    def devices(self) -> list[int]:
        return list(self.placement.gpus) if self.placement else []

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        """The JSON form used by the REST API, the CLI's ``--json`` and the widgets."""
        return {
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "origin": self.origin,
            "kind": self.kind,
            "state": self.state,
            "reason": self.reason,
            "priority": self.priority,
            "request": {
                "gpus": self.gpus,
                "gpu_mem": self.gpu_mem,
                "cpus": self.cpus,
                "mem": self.mem,
                "text": self.request_text,
                "max_gpus": self.max_gpus,
                "asked_gpus": self.asked_gpus,
            },
            "devices": self.devices,
            "gpu_mem_granted": list(self.placement.gpu_mem) if self.placement else [],
            "submitted": self.submitted,
            "started": self.started,
            "finished": self.finished,
            "deadline": self.deadline,
            "time_limit": self.time_limit,
            "attempts": self.attempts,
            "retries": self.retries,
            "preemptible": self.preemptible,
            "preemptions": self.preemptions,
            "after": list(self.after),
            "progress": self.progress,
            "exit_code": self.exit_code,
            "position": self.position,
            "waiting": self.waiting,
            "backend": self.backend,
            "inline": self.inline,
            "stage_in": self.stage_in,
            "cpu_now": self.cpu_now,
            "rss_now": self.rss_now,
            "requeue_of": self.requeue_of,
            "begin": self.begin,
            "expected_start": self.expected_start,
            "start_p80": self.start_p80,
            "usage": {
                "run_time": self.run_time,
                "gpu_hours": self.gpu_hours,
                "cpu_time": self.cpu_time,
                "peak_rss": self.peak_rss,
                "peak_gpu_mem": self.peak_gpu_mem,
                "input_bytes": self.input_bytes,
                "result_bytes": self.result_bytes,
            },
        }


_JOB_COLUMNS = [f.name for f in fields(JobInfo)]
_BOOL_COLUMNS = {"preemptible", "distributed", "cancel_requested", "preempt_requested", "inline"}


def _row_to_info(row: sqlite3.Row, place: int | None) -> JobInfo:
    """The ``JobInfo`` of a ``jobs`` row; ``place``: its place in line, numbered by the
    reader (the row's ``position`` is a rank, ``store/job_reads.py``)."""
    values: dict[str, Any] = {"position": place}
    for name in _JOB_COLUMNS:
        if name == "position":
            continue
        value = row[name]
        if name in _BOOL_COLUMNS:
            value = bool(value)
        elif name == "after":
            value = tuple(json.loads(value))
        elif name == "placement":
            value = Placement.from_json(json.loads(value)) if value else None
        elif name == "progress":
            value = json.loads(value) if value else None
        elif name in ("env", "stage_in"):
            value = json.loads(value) if value else {}
        values[name] = value
    return JobInfo(**values)


#: The ``jobs`` columns a job's JSON is made of, in ``JobInfo``'s order: what a list read
#: selects (``JOB_SELECT``) and ``row_to_json`` turns into a reply's row.
JOB_SELECT = ", ".join(_JOB_COLUMNS)


def _json_dict(text: str | None) -> Any:
    """A JSON object column's value (``env``, ``stage_in``), ``{}`` when empty; most rows'
    ``'{}'`` spared the parser."""
    return {} if not text or text == "{}" else json.loads(text)


def row_to_json(row: tuple[Any, ...], place: int | None) -> dict[str, Any]:
    """``info_to_json(_row_to_info(row, place))`` of a row read as ``SELECT {JOB_SELECT}``
    (a plain tuple), without the ``JobInfo`` between: what a page of a list costs the agent
    is mostly this, once a row."""
    data = dict(zip(_JOB_COLUMNS, row, strict=True))
    data["position"] = place
    for name in _BOOL_COLUMNS:
        data[name] = bool(data[name])
    after = data["after"]
    data["after"] = [] if after == "[]" else list(json.loads(after))
    placement = data["placement"]
    if placement:
        data["placement"] = Placement.from_json(json.loads(placement)).to_json()
    else:
        data["placement"] = None
    progress = data["progress"]
    data["progress"] = json.loads(progress) if progress else None
    data["env"] = _json_dict(data["env"])
    data["stage_in"] = _json_dict(data["stage_in"])
    return data


def info_to_json(info: JobInfo) -> dict[str, Any]:
    """A ledger row as JSON values (what the pool agent sends its clients)."""
    data = {f.name: getattr(info, f.name) for f in fields(info)}
    data["placement"] = info.placement.to_json() if info.placement is not None else None
    data["after"] = list(info.after)
    return data


def info_from_json(data: dict[str, Any]) -> JobInfo:
    """The ``JobInfo`` a JSON row from the pool agent describes."""
    values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(JobInfo) if f.name in data}
    placement = values.get("placement")
    values["placement"] = Placement.from_json(placement) if placement is not None else None
    values["after"] = tuple(values.get("after") or ())
    values["env"] = dict(values.get("env") or {})
    values["stage_in"] = dict(values.get("stage_in") or {})
    return JobInfo(**values)

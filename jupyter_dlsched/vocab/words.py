"""The words UI.md gives jobs, shared by every front end (CLI, widgets, magics, sidebar).

One phrase per idea, so a user who learned one view reads the others:

>>> priority_words(100), priority_words(60)
('high', 'priority 60')
>>> state_words(job)  # doctest: +SKIP
'queued · #3 in line · waiting for 2 GPUs'
>>> notebook_words("/home/anna/work/sweep.ipynb")
'sweep.ipynb'

The JupyterLab sidebar (TypeScript) follows the same rules; keep them in step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from .schema import WAITING, JobInfo
from .spec import PRIORITY_NAMES
from .units import format_duration, format_size

#: the named priority levels, by value: ``{0: "low", 50: "normal", 100: "high", 1000: "urgent"}``
PRIORITY_WORDS = {value: name for name, value in PRIORITY_NAMES.items()}

#: An estimate whose P80 wait is more than this many times its expected wait is no promise:
#: in replays of bursty Philly slices the jobs with such a spread started by their P80
#: far less often than the rest and missed their expected start by most of their wait.
UNCERTAIN_SPREAD = 3.0
#: ... unless the P80 wait is this short (seconds): "starts in <1 min" needs no caveat.
UNCERTAIN_FROM = 60.0

#: ``origin`` values that say what submitted a job but are no notebook or program name
_NO_PLACE = ("", "notebook", "python", "-")


def priority_words(priority: int) -> str:
    """``"low"``, ``"normal"``, ``"high"``, ``"urgent"`` for the named levels, else ``"priority N"``."""
    return PRIORITY_WORDS.get(priority, f"priority {priority}")


def ran_for(job: JobInfo, now: float) -> float | None:
    if job.started is None:
        return None
    return (job.finished or now) - job.started


def waited_for(job: JobInfo, now: float) -> float:
    end = job.started or job.finished or now
    return max(0.0, end - job.submitted)


def wait_words(job: JobInfo, now: float | None = None) -> str:
    """Why a queued job waits, place in line and start estimate first:
    ``"#3 in line · starts in ~40 min · waiting for 2 GPUs"``.

    ``""`` when the job is not waiting or nothing is known yet.
    """
    if job.state not in WAITING:
        return ""
    parts = []
    if job.position:
        parts.append(f"#{job.position} in line")
    starts = start_words(job, now)
    if starts:
        parts.append(starts)
    if job.waiting:
        parts.append(job.waiting)
    return " · ".join(parts)


def start_words(job: JobInfo, now: float | None = None) -> str:
    """When a waiting job should start, as a person would say it: ``"starts in ~40 min"``,
    with the P80 bound when it is well after: ``"starts in ~40 min (by ~1 h)"``.

    ``""`` when the job has no estimate (nothing to learn run times from yet, or too deep
    in a long queue): no number rather than a made-up one. When the estimate is too
    spread to promise (``uncertain``) it says so, with how long the queue ahead may take:
    ``"start uncertain: the queue ahead may take ~2 days"``.

    >>> start_phrase(2400.0, 4000.0, now=0.0), start_phrase(2400.0, 4000.0, now=2390.0)
    ('starts in ~40 min (by ~1 h)', 'start uncertain: the queue ahead may take ~25 min')
    """
    if job.state not in WAITING or (job.expected_start is None and job.start_p80 is None):
        return ""
    return start_phrase(job.expected_start, job.start_p80, time.time() if now is None else now)


def start_phrase(expected: float | None, p80: float | None, now: float) -> str:
    """``"starts in ~40 min (by ~1 h)"`` for an expected start and its P80 bound (epoch s),
    or ``"start uncertain: the queue ahead may take ~2 days"`` when they are too far apart,
    or when there is no expected start, only the moment the work ahead of the job would be
    done (a job too deep in line to forecast: ``forecast.replay.AHEAD_LIMIT``).

    >>> start_phrase(None, 4 * 86400.0, now=0.0)
    'start uncertain: the queue ahead may take ~4 days'
    """
    if expected is None:
        return (
            "" if p80 is None else f"start uncertain: the queue ahead may take {about(p80 - now)}"
        )
    ahead = expected - now
    if p80 is not None and uncertain(expected, p80, now):
        return f"start uncertain: the queue ahead may take {about(p80 - now)}"
    words = f"starts in {about(ahead)}"
    if p80 is not None:
        bound = p80 - now
        if bound >= 60 and about(bound) != about(ahead):
            words += f" (by {about(bound)})"
    return words


def uncertain(expected: float, p80: float, now: float) -> bool:
    """Whether an estimate is too spread to give as a number: its P80 wait is at least
    ``UNCERTAIN_FROM`` and more than ``UNCERTAIN_SPREAD`` times its expected wait.

    >>> uncertain(3600.0, 7200.0, now=0.0), uncertain(600.0, 7200.0, now=0.0)
    (False, True)
    """
    bound = p80 - now
    return bound >= UNCERTAIN_FROM and bound > UNCERTAIN_SPREAD * max(0.0, expected - now)


def about(seconds: float) -> str:
    """A span rounded as a person says it: ``<1 min``, ``~7 min``, ``~40 min``, ``~3 h``, ``~2 days``.

    >>> [about(s) for s in (20, 400, 2400, 5400, 10800, 200000)]
    ['<1 min', '~7 min', '~40 min', '~1.5 h', '~3 h', '~2 days']
    """
    minutes = seconds / 60
    if minutes < 1:
        return "<1 min"
    if minutes < 10:
        return f"~{round(minutes)} min"
    if minutes < 55:
        return f"~{5 * round(minutes / 5)} min"
    hours = minutes / 60
    if hours < 2.75:
        half = round(hours * 2) / 2
        return f"~{half:g} h"
    if hours < 36:
        return f"~{round(hours)} h"
    return f"~{round(hours / 24)} days"


def state_words(job: JobInfo, now: float | None = None) -> str:
    """Plain words for a state: ``"queued · #3 in line · waiting for 2 GPUs"``."""
    now = time.time() if now is None else now
    if job.state == "queued":
        return " · ".join(part for part in ("queued", wait_words(job, now)) if part)
    if job.state == "running":
        return f"running · {format_duration(ran_for(job, now))}"
    if job.state == "succeeded":
        return f"done · {format_duration(ran_for(job, now))}"
    if job.state in ("failed", "lost", "timeout"):
        return f"failed: {job.reason or job.state}"
    if job.state == "preempted":
        return "preempted · requeued"
    return job.state


def progress_share(job: JobInfo) -> float | None:
    """Progress in [0, 1] from ``dls.progress``, or None when there is no total."""
    p = job.progress
    if not p or not p.get("total"):
        return None
    return max(0.0, min(1.0, float(p.get("done", 0)) / float(p["total"])))


def last_metric(job: JobInfo) -> str:
    """The last metric reported with ``dls.progress``: ``"loss 0.31"``; for a GPU kernel,
    its idle stretch: ``"idle 12 min"``."""
    metrics = (job.progress or {}).get("metrics") or {}
    if not metrics:
        return ""
    if job.kind == "kernel" and isinstance(metrics.get("idle_min"), int | float):
        return kernel_idle_words(float(metrics["idle_min"]))
    key, value = list(metrics.items())[-1]
    if isinstance(value, float):
        value = f"{value:.4g}"
    return f"{key} {value}"


def kernel_idle_words(minutes: float) -> str:
    """A GPU kernel's idle stretch: ``"idle 12 min"``, ``"idle <1 min"``."""
    return "idle <1 min" if minutes < 1 else f"idle {minutes:.0f} min"


def progress_words(job: JobInfo) -> str:
    """``"70% loss 0.31"``, ``"step 12 loss 0.31"`` or ``""``; a GPU kernel's lease reads
    ``"3 cells · idle 12 min · 0.40 GPU-h idle"`` (its progress counts cells, docs/kernels.md).
    """
    p = job.progress
    if not p:
        return ""
    if job.kind == "kernel":
        cells = int(p.get("done") or 0)
        idle_hours = (p.get("metrics") or {}).get("idle_gpu_h") or 0
        held = f" · {idle_hours:.2f} GPU-h idle" if idle_hours >= 0.01 else ""
        idle = last_metric(job)
        return f"{cells} cell{'' if cells == 1 else 's'}{' · ' + idle if idle else ''}{held}"
    share = progress_share(job)
    head = f"{share * 100:.0f}%" if share is not None else f"step {p.get('done') or 0:g}"
    return f"{head} {last_metric(job)}".strip()


def notebook_words(origin: str) -> str:
    """The short name of where a job came from: a notebook's file name, not its full path.

    The full ``origin`` belongs in a tooltip (``title``) next to it.
    """
    if origin in _NO_PLACE:
        return ""
    return origin.rstrip("/").rsplit("/", 1)[-1]


def owner_words(job: JobInfo) -> str:
    """``"anna · sweep.ipynb"``, or ``"anna"`` when nothing names the notebook or program."""
    place = notebook_words(job.origin)
    return f"{job.owner} · {place}" if place else job.owner


def renumber(jobs: Iterable[JobInfo]) -> list[JobInfo]:
    """The jobs with queue positions closed up: ``#1, #3`` becomes ``#1, #2``.

    Jobs read together are numbered 1..n already (the ledger keeps ranks and numbers
    them as it is read); rows gathered from different reads may leave a gap where a job
    left the line between them. Pass every waiting job of the pool (filter afterwards),
    so the numbers are places in the whole line.
    """
    jobs = list(jobs)
    placed = sorted(
        (j for j in jobs if j.state in WAITING and j.position), key=lambda j: (j.position, j.seq)
    )
    fixed = {j.id: n for n, j in enumerate(placed, start=1) if j.position != n}
    return [dataclasses.replace(j, position=fixed[j.id]) if j.id in fixed else j for j in jobs]


def over_payload_limit(user: str, held: int, cap: int, adding: int) -> str:
    """Why a submission is refused at a user's payload limit (``max_payload_bytes``): the
    service's words at submit and the client's before it writes anything."""
    return (
        f"{user}'s queued payloads take {format_size(held)}; the limit per user "
        f"is {format_size(cap)}; this request adds {format_size(adding)} (wait for "
        "jobs to end, or pass large data by path rather than as an argument)"
    )

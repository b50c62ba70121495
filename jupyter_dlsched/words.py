"""The words UI.md gives each state, shared by every front end (CLI, widgets, magics).

>>> state_words(job)  # doctest: +SKIP
'queued · #3 in line · waiting for 2 GPUs'
"""

from __future__ import annotations

import time

from .store import JobInfo
from .units import format_duration


def ran_for(job: JobInfo, now: float) -> float | None:
    if job.started is None:
        return None
    return (job.finished or now) - job.started


def waited_for(job: JobInfo, now: float) -> float:
    end = job.started or job.finished or now
    return max(0.0, end - job.submitted)


def state_words(job: JobInfo, now: float | None = None) -> str:
    """Plain words for a state: ``"queued · #3 in line · waiting for 2 GPUs"``."""
    now = time.time() if now is None else now
    if job.state == "queued":
        parts = ["queued"]
        if job.position:
            parts.append(f"#{job.position} in line")
        if job.waiting:
            parts.append(job.waiting)
        return " · ".join(parts)
    if job.state == "running":
        return f"running · {format_duration(ran_for(job, now))}"
    if job.state == "succeeded":
        return f"done · {format_duration(ran_for(job, now))}"
    if job.state in ("failed", "lost", "timeout"):
        return f"failed: {job.reason or job.state}"
    if job.state == "preempted":
        return "preempted · requeued"
    return job.state

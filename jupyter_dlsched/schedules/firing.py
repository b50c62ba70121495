"""Firing schedules: each tick that came makes a new run, unless the last one still goes.

Called at the start of every tick of a process that decides on the ledger (the pool
agent's loop, which ticks at least once a second; a ``Scheduler`` without an agent).
A tick is claimed with a conditional update first (``store.timetable.claim_schedule_tick``), so
two processes that tick at once make one run, not two. A schedule that fell behind (no
agent was running) makes one run, not one for every tick it missed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..vocab.errors import DlschedError
from ..vocab.every import parse_every

if TYPE_CHECKING:
    from ..store import Store
    from ..vocab.schedule_info import ScheduleInfo

log = logging.getLogger(__name__)
#: a run still in one of these states makes the schedule skip its tick
_STILL_GOING = ("queued", "running", "preempted")


def fire_due(
    store: Store,
    now: float | None = None,
    allow: Callable[[ScheduleInfo, float], bool] | None = None,
) -> list[str]:
    """Make the runs of the schedules whose tick has come; the new jobs' ids. ``allow``
    (a shared pool's per-user rate of runs) may turn a tick into a skip."""
    now = time.time() if now is None else now
    made: list[str] = []
    for schedule in store.timetable.due_schedules(now):
        try:
            following = parse_every(schedule.every).next_after(now)
        except DlschedError:
            following = now + 86400.0  # a row this code cannot read: try again tomorrow
        claimed, last_state = store.timetable.claim_schedule_tick(schedule.id, now, following)
        if not claimed:
            continue  # another process handled this tick
        if last_state in _STILL_GOING or (allow is not None and not allow(schedule, now)):
            store.timetable.record_schedule_skip(schedule.id)
            continue
        try:
            run = store.requeue(schedule.template, now=now)
        except DlschedError as error:
            log.warning(
                "schedule %s removed: its job %s cannot run again: %s",
                schedule.id,
                schedule.template,
                error,
            )
            store.timetable.remove_schedule(schedule.id, now=now)
            continue
        store.timetable.record_schedule_run(schedule.id, run.id)
        made.append(run.id)
    return made

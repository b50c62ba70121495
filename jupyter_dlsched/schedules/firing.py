"""Firing schedules: each tick that came makes a new run, unless the last one still goes.

Called at the start of every tick of a process that decides on the ledger (the pool
agent's loop, which ticks at least once a second; a ``Scheduler`` without an agent).
A tick is claimed with a conditional update first, so two processes that tick at once
make one run, not two. A schedule that fell behind (no agent was running) makes one
run, not one for every tick it missed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..errors import DlschedError
from . import ledger
from .every import parse_every

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger(__name__)
#: a run still in one of these states makes the schedule skip its tick
_STILL_GOING = ("queued", "running", "preempted")


def fire_due(store: Store, now: float | None = None) -> list[str]:
    """Make the runs of the schedules whose tick has come; the new jobs' ids."""
    now = time.time() if now is None else now
    due = ledger.due(store.db, now)
    made: list[str] = []
    for schedule_id, every_text, template, last_job in due:
        try:
            following = parse_every(every_text).next_after(now)
        except DlschedError:
            following = now + 86400.0  # a row this code cannot read: try again tomorrow
        with store.transaction() as db:
            if not ledger.claim(db, schedule_id, now, following):
                continue  # another process handled this tick
            going = ledger.job_state(db, last_job) in _STILL_GOING
        if going:
            with store.transaction() as db:
                ledger.fired(db, schedule_id, following, None)
            continue
        try:
            run = store.requeue(template, now=now)
        except DlschedError as error:
            log.warning(
                "schedule %s removed: its job %s cannot run again: %s", schedule_id, template, error
            )
            with store.transaction() as db:
                ledger.remove(db, schedule_id, now)
            continue
        with store.transaction() as db:
            ledger.fired(db, schedule_id, following, run.id)
        made.append(run.id)
    return made

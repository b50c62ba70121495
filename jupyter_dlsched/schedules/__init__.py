"""Schedules: ``--every SCHEDULE`` submits a new run of a job on each tick.

``vocab/every.py`` reads a schedule (a duration or a cron expression) and finds its next
tick (pure); ``vocab/schedule_info.py`` is ``ScheduleInfo``, a schedule as callers see it;
the ``schedules``
table and all of its SQL are the ledger's (``store/schedules.py``: a schedule is added
with the job it copies, in the same transaction); ``firing.py`` is what the pool agent's
loop does each turn: for every schedule whose tick came, a new run — a copy of the first
job, as ``requeue`` makes it — unless the previous run is still waiting or running (that
tick is skipped); ``requests.py`` lists and removes them, with the pool's permissions.
"""

"""Schedules (``schedules``, schema version 9): one row a schedule, added with the job it
copies, listed, removed, and each tick claimed and recorded as a run made or skipped.

A schedule copies its *template*, the job submitted with ``--every`` (its first run):
what it runs, what it needs, its owner. The template's payload blobs are counted as in
use while the schedule lives (``blob_refs``), so a schedule that runs once a week still
has its payload after the ended runs' are collected. When a tick is due and what a tick
makes is ``schedules/``'s to decide; this part only keeps the rows.
"""

from __future__ import annotations

import secrets
import sqlite3
import string
import time
from collections.abc import Sequence
from typing import Any

from ..vocab.schedule_info import ScheduleInfo
from .ledger import Ledger
from .payloads import Payloads

_ALPHABET = string.ascii_lowercase + string.digits
_SELECT = (
    "SELECT s.id, s.owner, s.uid, s.every, s.template, COALESCE(j.name, ''), s.created, "
    "s.next_run, s.last_job, l.state, s.runs, s.skipped FROM schedules s "
    "LEFT JOIN jobs j ON j.id = s.template LEFT JOIN jobs l ON l.id = s.last_job"
)


def _info(row: Sequence[Any]) -> ScheduleInfo:
    return ScheduleInfo(*row)


class Timetable:
    """The ``schedules`` table, ``store.timetable``: a schedule's row, added in its first
    job's submit (``add``), read, removed, and its ticks claimed and recorded. What a
    schedule keeps of its template's payload is counted by ``payloads``."""

    def __init__(self, ledger: Ledger, payloads: Payloads) -> None:
        self.ledger = ledger
        self.payloads = payloads

    def add(
        self,
        db: sqlite3.Connection,
        template: str,
        every: str,
        next_run: float,
        owner: str,
        uid: int,
        now: float,
    ) -> str:
        """A schedule of the job ``template``, inserted in the same open transaction (the
        submit's); the new schedule's id."""
        schedule_id = "s" + "".join(secrets.choice(_ALPHABET) for _ in range(7))
        db.execute(
            "INSERT INTO schedules(id, uid, owner, every, template, created, next_run, last_job) "
            "VALUES(?,?,?,?,?,?,?,?)",
            (schedule_id, uid, owner, every, template, now, next_run, template),
        )
        self.payloads.pin_template(db, template, +1, now)
        return schedule_id

    def schedules(self, uid: int | None = None) -> list[ScheduleInfo]:
        """Every schedule (``uid``: only that user's), the next to run first.

        >>> store.schedules()  # doctest: +SKIP
        [ScheduleInfo(id='s1x2y3z4', every='1h', template='ab12cd', ...)]
        """
        where, args = ("WHERE s.uid=?", (uid,)) if uid is not None else ("", ())
        rows = self.ledger.db.execute(
            f"{_SELECT} {where} ORDER BY s.next_run, s.id", args
        ).fetchall()
        return [_info(r) for r in rows]

    def schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """One schedule, or None when there is no such one."""
        row = self.ledger.db.execute(f"{_SELECT} WHERE s.id=?", (schedule_id,)).fetchone()
        return _info(row) if row is not None else None

    def schedule_count(self, uid: int | None = None) -> int:
        """How many schedules there are (``uid``: of that user)."""
        where, args = ("WHERE uid=?", (uid,)) if uid is not None else ("", ())
        return int(
            self.ledger.db.execute(f"SELECT COUNT(*) FROM schedules {where}", args).fetchone()[0]
        )

    def remove_schedule(
        self, schedule_id: str, *, uid: int | None = None, now: float | None = None
    ) -> ScheduleInfo | None:
        """Remove a schedule (its runs stay as they are) when ``uid`` is None or its owner's;
        the schedule as it was, removed or not (None: no such one), read in the same
        transaction, so whoever asks can say why it stayed."""
        now = time.time() if now is None else now
        with self.ledger.transaction() as db:
            row = db.execute(f"{_SELECT} WHERE s.id=?", (schedule_id,)).fetchone()
            if row is None:
                return None
            found = _info(row)
            if uid is None or found.uid == uid:
                self.payloads.pin_template(db, found.template, -1, now)
                db.execute("DELETE FROM schedules WHERE id=?", (schedule_id,))
        return found

    def due_schedules(self, now: float) -> list[ScheduleInfo]:
        """The schedules whose next tick is at ``now`` or before, the longest due first."""
        rows = self.ledger.db.execute(
            f"{_SELECT} WHERE s.next_run <= ? ORDER BY s.next_run, s.id", (now,)
        ).fetchall()
        return [_info(r) for r in rows]

    def claim_schedule_tick(
        self, schedule_id: str, now: float, following: float
    ) -> tuple[bool, str | None]:
        """Take the tick that came by moving ``next_run`` on to ``following``, only if it is
        still due at ``now``: ``(claimed, state of the schedule's last run)``; not claimed
        when another process took this tick (or the schedule is gone)."""
        with self.ledger.transaction() as db:
            claimed = db.execute(
                "UPDATE schedules SET next_run=? WHERE id=? AND next_run <= ?",
                (following, schedule_id, now),
            ).rowcount
            if claimed != 1:
                return False, None
            row = db.execute(
                "SELECT l.state FROM schedules s LEFT JOIN jobs l ON l.id = s.last_job "
                "WHERE s.id=?",
                (schedule_id,),
            ).fetchone()
        return True, row[0] if row else None

    def record_schedule_run(self, schedule_id: str, job_id: str) -> None:
        """A claimed tick made the run ``job_id``: it is the schedule's last run now."""
        with self.ledger.transaction() as db:
            db.execute(
                "UPDATE schedules SET last_job=?, runs = runs + 1 WHERE id=?",
                (job_id, schedule_id),
            )

    def record_schedule_skip(self, schedule_id: str) -> None:
        """A claimed tick made no run (the last one still goes)."""
        with self.ledger.transaction() as db:
            db.execute("UPDATE schedules SET skipped = skipped + 1 WHERE id=?", (schedule_id,))

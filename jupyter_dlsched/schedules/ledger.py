"""The ``schedules`` table (schema version 9): one row a schedule, all of its SQL here.

A schedule copies its *template*, the job submitted with ``--every`` (its first run):
what it runs, what it needs, its owner. The template's payload blobs are counted as in
use while the schedule lives (``blob_refs``), so a schedule that runs once a week still
has its payload after the ended runs' are collected.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule: ``dlsched schedules`` lists these."""

    id: str
    owner: str
    uid: int
    every: str
    template: str
    name: str
    created: float
    next_run: float
    last_job: str | None
    last_state: str | None
    runs: int
    skipped: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


_SELECT = (
    "SELECT s.id, s.owner, s.uid, s.every, s.template, COALESCE(j.name, ''), s.created, "
    "s.next_run, s.last_job, l.state, s.runs, s.skipped FROM schedules s "
    "LEFT JOIN jobs j ON j.id = s.template LEFT JOIN jobs l ON l.id = s.last_job"
)


def _info(row: Sequence[Any]) -> ScheduleInfo:
    return ScheduleInfo(*row)


def add(
    db: sqlite3.Connection,
    template: str,
    every: str,
    next_run: float,
    owner: str,
    uid: int,
    now: float,
) -> str:
    """A schedule of the job ``template`` (just inserted, in the caller's transaction)."""
    schedule_id = "s" + "".join(secrets.choice(_ALPHABET) for _ in range(7))
    db.execute(
        "INSERT INTO schedules(id, uid, owner, every, template, created, next_run, last_job) "
        "VALUES(?,?,?,?,?,?,?,?)",
        (schedule_id, uid, owner, every, template, now, next_run, template),
    )
    _pin(db, template, +1, now)
    return schedule_id


def _pin(db: sqlite3.Connection, template: str, delta: int, now: float) -> None:
    """Count the template's blobs in use (+1) or not any more (-1) by this schedule."""
    row = db.execute("SELECT files FROM jobs WHERE id=?", (template,)).fetchone()
    hashes = sorted(set(json.loads((row[0] if row else None) or "{}").values()))
    for digest in hashes:
        db.execute(
            "UPDATE blob_refs SET refs = refs + ?, "
            "unused_since = CASE WHEN refs + ? <= 0 THEN ? ELSE NULL END WHERE hash=?",
            (delta, delta, now, digest),
        )


def pin_all(db: sqlite3.Connection) -> None:
    """``Store.collect_leftovers`` counts blobs again from the jobs: add the schedules'."""
    db.execute(
        "INSERT INTO blob_refs(hash, refs, size, uid) SELECT f.value, COUNT(*), 0, MIN(j.uid) "
        "FROM schedules s JOIN jobs j ON j.id = s.template, json_each(j.files) f "
        "WHERE 1 GROUP BY f.value "
        "ON CONFLICT(hash) DO UPDATE SET refs = refs + excluded.refs, unused_since = NULL"
    )


def listed(db: sqlite3.Connection, uid: int | None = None) -> list[ScheduleInfo]:
    """Every schedule (``uid``: only that user's), the next to run first."""
    where, args = ("WHERE s.uid=?", (uid,)) if uid is not None else ("", ())
    rows = db.execute(f"{_SELECT} {where} ORDER BY s.next_run, s.id", args).fetchall()
    return [_info(r) for r in rows]


def get(db: sqlite3.Connection, schedule_id: str) -> ScheduleInfo | None:
    row = db.execute(f"{_SELECT} WHERE s.id=?", (schedule_id,)).fetchone()
    return _info(row) if row is not None else None


def remove(db: sqlite3.Connection, schedule_id: str, now: float) -> bool:
    """Remove a schedule (its runs stay as they are); False when there is no such one."""
    row = db.execute("SELECT template FROM schedules WHERE id=?", (schedule_id,)).fetchone()
    if row is None:
        return False
    _pin(db, row[0], -1, now)
    db.execute("DELETE FROM schedules WHERE id=?", (schedule_id,))
    return True


def due(db: sqlite3.Connection, now: float) -> list[tuple[str, str, str, str | None]]:
    """``(id, every, template, last_job)`` of the schedules whose tick has come."""
    return db.execute(
        "SELECT id, every, template, last_job FROM schedules WHERE next_run <= ? ORDER BY next_run",
        (now,),
    ).fetchall()


def claim(db: sqlite3.Connection, schedule_id: str, now: float, following: float) -> bool:
    """Take the tick that came (move ``next_run`` on); False when another process did."""
    cur = db.execute(
        "UPDATE schedules SET next_run=? WHERE id=? AND next_run <= ?",
        (following, schedule_id, now),
    )
    return cur.rowcount == 1


def job_state(db: sqlite3.Connection, job_id: str | None) -> str | None:
    if job_id is None:
        return None
    row = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
    return row[0] if row else None


def fired(db: sqlite3.Connection, schedule_id: str, next_run: float, job_id: str | None) -> None:
    """A claimed tick handled: the run it made (``job_id``) or, with None, skipped."""
    if job_id is None:
        db.execute("UPDATE schedules SET skipped = skipped + 1 WHERE id=?", (schedule_id,))
    else:
        db.execute(
            "UPDATE schedules SET last_job=?, runs = runs + 1 WHERE id=?", (job_id, schedule_id)
        )


def count(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM schedules").fetchone()[0])


def next_runs(db: sqlite3.Connection) -> dict[str, float]:
    """Each schedule's next run by the id of its last job (the sidebar shows it there)."""
    rows = db.execute("SELECT last_job, next_run FROM schedules WHERE last_job IS NOT NULL")
    return {r[0]: r[1] for r in rows}

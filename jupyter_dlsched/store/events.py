"""The ledger's events: one row per change a decision or a client depends on (a submit, a
state change, a priority change, a staged input bound), read in order by every follower.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from .ledger import Ledger


class EventLog:
    """The ``events`` table, ``store.event_log``: every part that changes a job records the
    change here, inside its own transaction (``record``)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @staticmethod
    def record(
        db: sqlite3.Connection,
        job_id: str,
        from_state: str | None,
        to_state: str,
        reason: str,
        now: float | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        db.execute(
            "INSERT INTO events(job_id, time, from_state, to_state, reason, data) "
            "VALUES(?,?,?,?,?,?)",
            (
                job_id,
                time.time() if now is None else now,
                from_state,
                to_state,
                reason,
                json.dumps(data) if data else None,
            ),
        )

    @staticmethod
    def record_submits(db: sqlite3.Connection, job_ids: list[str], now: float) -> None:
        """The ``submitted`` event of each of these new jobs (one statement for a ``map``)."""
        db.executemany(
            "INSERT INTO events(job_id, time, from_state, to_state, reason) "
            "VALUES(?,?,NULL,'queued','submitted')",
            [(job_id, now) for job_id in job_ids],
        )

    def events(
        self, job_id: str | None = None, since: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The audit trail, oldest first (the first ``limit`` events after ``since``)."""
        sql = "SELECT * FROM events WHERE seq > ?"
        args: list[Any] = [since]
        if job_id is not None:
            sql += " AND job_id=?"
            args.append(job_id)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self.ledger.db.execute(sql, args)
        return [{**dict(r), "data": json.loads(r["data"]) if r["data"] else None} for r in rows]

    def last_event_seq(self, db: sqlite3.Connection | None = None) -> int:
        """The newest event's number (0 for none): it changes with every state change.

        With ``db``, it is read inside that open transaction."""
        db = self.ledger.db if db is None else db
        rows = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchall()
        return int(rows[0][0])

    def state_changes_since(self, seq: int, limit: int = -1) -> list[sqlite3.Row]:
        """``(seq, job_id, to_state)`` of every event after ``seq`` (the first ``limit``;
        -1: all), oldest first."""
        return self.ledger.db.execute(
            "SELECT seq, job_id, to_state FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit),
        ).fetchall()

    @staticmethod
    def jobs_with_events_since(db: sqlite3.Connection, seq: int) -> list[str]:
        """Ids of the jobs with an event after ``seq`` (what changed since a decision)."""
        # not DISTINCT in SQL: SQLite would answer that by scanning the whole job_id index
        rows = db.execute("SELECT job_id FROM events WHERE seq > ?", (seq,))
        return list(dict.fromkeys(r[0] for r in rows if r[0] is not None))

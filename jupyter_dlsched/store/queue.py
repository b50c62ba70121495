"""The tick's queries (``engine/tick.py``): its inputs, the active jobs' lean snapshot, expired
leases, ranks in line, preemption requests, and allocated jobs nobody launched.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence

from ..vocab.resources import Placement
from ..vocab.schema import HELD_GRANT, HOLDING
from .events import EventLog
from .ledger import _SNAPSHOT_COLUMNS, Ledger


class Queue:
    """The tick's side of the ``jobs`` table, ``store.queue``: what a decision reads, and
    the columns of a job's place in line it writes (``position``, ``waiting``, the start
    estimates, a preemption or resize asked for, a held grant lapsed). Its ``tick_inputs``
    reads the newest event and the settings in the same query: one read per tick is the
    point."""

    def __init__(self, ledger: Ledger, event_log: EventLog) -> None:
        self.ledger = ledger
        self.event_log = event_log

    def tick_inputs(self, backend: str, now: float) -> tuple[int, int, tuple[int, int], str | None]:
        """``(any waiting, any lease expired, (newest event, grants held past an end),
        settings)`` on ``backend``: what a tick reads, in one query, to know whether
        deciding again is worth the write lock. A held grant's release is no event (the
        job's state does not change), but it changes the count."""
        waiting, expired, last_event, held, settings_json = self.ledger.db.execute(
            # a running elastic job counts as waiting: idle GPUs may be its to grow into
            "SELECT EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state IN ('queued','preempted'))"
            " OR EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state='running'"
            " AND max_gpus IS NOT NULL),"
            " EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state='running' AND lease_expires < ?)"
            f" OR EXISTS(SELECT 1 FROM jobs WHERE backend=? AND {HELD_GRANT} AND lease_expires < ?),"
            " (SELECT COALESCE(MAX(seq), 0) FROM events),"
            f" (SELECT COUNT(*) FROM jobs WHERE backend=? AND {HELD_GRANT}),"
            " (SELECT value FROM meta WHERE key='settings')",
            (backend, backend, backend, now, backend, now, backend),
        ).fetchall()[0]
        return waiting, expired, (last_event, held), settings_json

    def running_job_pids(self, backend: str) -> list[int | None]:
        """The job process of each job on ``backend`` that holds its grant (``None`` until
        it started): running, or succeeded with its process still exiting."""
        return [
            r[0]
            for r in self.ledger.db.execute(
                f"SELECT job_pid FROM jobs WHERE {HOLDING} AND backend=?", (backend,)
            ).fetchall()
        ]

    def holding_attempts(self) -> list[tuple[str, int]]:
        """``(id, attempt)`` of every job on this machine holding its grant: running, or a
        success whose process still exits (its cgroup is still in use)."""
        rows = self.ledger.db.execute(
            f"SELECT id, attempts FROM jobs WHERE backend='local' AND {HOLDING}"
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    @staticmethod
    def expired_leases(db: sqlite3.Connection, backend: str, now: float) -> list[str]:
        """Running jobs on ``backend`` whose lease ran out before ``now``."""
        return [
            r[0]
            for r in db.execute(
                "SELECT id FROM jobs WHERE state='running' AND backend=? AND lease_expires < ?",
                (backend, now),
            )
        ]

    @staticmethod
    def snapshot(db: sqlite3.Connection, backend: str) -> list[sqlite3.Row]:
        """The waiting jobs on ``backend`` and those holding a grant (running, or a success
        whose process still exits: ``HELD_GRANT``), in submit order, with the columns a
        policy decides on (``_SNAPSHOT_COLUMNS``): one lean read per tick."""
        return db.execute(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM jobs WHERE backend=? "
            f"AND (state IN ('queued','preempted') OR {HOLDING}) ORDER BY seq",
            (backend,),
        ).fetchall()

    @staticmethod
    def snapshot_running(db: sqlite3.Connection, backend: str) -> list[sqlite3.Row]:
        """The jobs of ``snapshot`` that hold a grant."""
        return db.execute(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM jobs WHERE backend=? AND {HOLDING} ORDER BY seq",
            (backend,),
        ).fetchall()

    @staticmethod
    def held_grants(db: sqlite3.Connection, backend: str) -> int:
        """How many successes on ``backend`` still hold their grant (``HELD_GRANT``)."""
        return int(
            db.execute(
                f"SELECT COUNT(*) FROM jobs WHERE backend=? AND {HELD_GRANT}", (backend,)
            ).fetchone()[0]
        )

    @staticmethod
    def lapsed_holds(db: sqlite3.Connection, backend: str, now: float) -> int:
        """Release the grants held past a success whose lease ran out before ``now`` (its
        supervisor stopped renewing it); how many."""
        return db.execute(
            f"UPDATE jobs SET lease_expires=NULL WHERE backend=? AND {HELD_GRANT} "
            "AND lease_expires < ?",
            (backend, now),
        ).rowcount

    @staticmethod
    def snapshot_of(db: sqlite3.Connection, backend: str, ids: Sequence[str]) -> list[sqlite3.Row]:
        """The active jobs among ``ids``, with the columns of ``snapshot``."""
        rows: list[sqlite3.Row] = []
        for i in range(0, len(ids), 500):
            part = list(ids[i : i + 500])
            rows += db.execute(
                f"SELECT {_SNAPSHOT_COLUMNS} FROM jobs WHERE backend=? "
                f"AND state IN ('queued','preempted','running') "
                f"AND id IN ({','.join('?' * len(part))})",
                (backend, *part),
            ).fetchall()
        return rows

    @staticmethod
    def set_queue_positions(
        db: sqlite3.Connection, changes: Iterable[tuple[float | None, str | None, str]]
    ) -> None:
        """Record ``(rank in line, waiting reason, job id)`` of waiting jobs whose rank or
        reason changed (a job that has started meanwhile keeps none). The rank is kept in
        ``position``; the place people see is numbered from it when read (``job_reads``)."""
        db.executemany(
            "UPDATE jobs SET position=?, waiting=? WHERE id=? AND state IN ('queued','preempted')",
            changes,
        )

    def set_waiting_reason(self, job_id: str, words: str) -> None:
        """Say why a job still waits, if it still does (a remote queue's own reason)."""
        with self.ledger.transaction() as db:
            self.set_waiting_words(db, [(words, job_id)])

    @staticmethod
    def set_waiting_words(db: sqlite3.Connection, changes: Iterable[tuple[str, str]]) -> None:
        """Record ``(why it waits, job id)`` of jobs that still wait, inside ``db``'s open
        transaction (a staging's progress, a remote queue's reason)."""
        db.executemany(
            "UPDATE jobs SET waiting=? WHERE id=? AND state IN ('queued','preempted')", changes
        )

    @staticmethod
    def set_start_estimates(
        db: sqlite3.Connection, changes: Iterable[tuple[float | None, float | None, str]]
    ) -> None:
        """Record ``(expected start, P80 start, job id)`` of waiting jobs (``start_times``)."""
        db.executemany(
            "UPDATE jobs SET expected_start=?, start_p80=? WHERE id=? "
            "AND state IN ('queued','preempted')",
            changes,
        )

    @staticmethod
    def request_preemption(db: sqlite3.Connection, job_id: str) -> None:
        """Ask the supervisor of a running, preemptible job to stop it for a preemption."""
        db.execute(
            "UPDATE jobs SET preempt_requested=1 WHERE id=? AND state='running' AND preemptible=1",
            (job_id,),
        )

    def request_resize(
        self, db: sqlite3.Connection, job_id: str, placement: Placement, reason: str, now: float
    ) -> None:
        """Ask a running elastic job to stop (checkpoint) so it starts again on ``placement``;
        the resize is an event in the job's history."""
        changed = db.execute(
            "UPDATE jobs SET preempt_requested=1, resize_to=? WHERE id=? AND state='running' "
            "AND max_gpus IS NOT NULL AND preempt_requested=0 AND cancel_requested=0",
            (json.dumps(placement.to_json()), job_id),
        ).rowcount
        if changed:
            self.event_log.record(
                db,
                job_id,
                "running",
                "running",
                reason,
                now=now,
                data={"resize": placement.to_json()},
            )

    def unlaunched(self, uid: int | None, backend: str) -> list[sqlite3.Row]:
        """``(id, started, inline)`` of this user's (``None``: every user's) allocated jobs on
        ``backend`` that no supervisor has claimed and nobody cancelled: the ones waiting to
        be launched."""
        if uid is None:
            return self.ledger.db.execute(
                "SELECT id, started, inline FROM jobs WHERE state='running' "
                "AND supervisor_pid IS NULL AND backend=? AND cancel_requested=0",
                (backend,),
            ).fetchall()
        return self.ledger.db.execute(
            "SELECT id, started, inline FROM jobs WHERE state='running' AND supervisor_pid IS NULL "
            "AND uid=? AND backend=? AND cancel_requested=0",
            (uid, backend),
        ).fetchall()

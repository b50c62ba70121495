"""Reading jobs: one row, a listing, what finished (for the policies that learn), counts
and states; no writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from ..vocab.errors import JobNotFound
from ..vocab.schema import (
    _ID,
    _JOB_COLUMNS,
    HOLDING,
    JOB_SELECT,
    STATES,
    WAITING,
    JobInfo,
    _row_to_info,
    row_to_json,
)
from .ledger import Ledger

#: The jobs in a line: the words of the ``jobs_line`` index's ``WHERE``, so SQLite uses it.
#: A waiting job's ``position`` is its rank in its backend's line (``engine/line_ranks.py``):
#: numbers that increase along the line, with gaps where jobs left it; its place is 1 + the
#: jobs ranked ahead of it, counted or numbered here, as it is read.
_IN_LINE = "position IS NOT NULL AND state IN ('queued','preempted')"
#: Listed jobs in line up to which each one's place is counted (each a range of the index
#: up to it); past it, the whole line is read once and numbered.
_COUNTED = 8
#: Where a ``SELECT {JOB_SELECT}`` row holds what its place in line is worked out from.
_SEQ, _STATE, _POSITION, _BACKEND = (
    _JOB_COLUMNS.index(name) for name in ("seq", "state", "position", "backend")
)
#: What a row's place in line is worked out from: ``(seq, state, position, backend)``.
_LineKey = tuple[int, str, int | None, str]


class JobReads:
    """Reading the ``jobs`` table, ``store.reads``: one row, a listing, what finished,
    counts and states. It writes nothing; the rows are written by ``lifecycle`` (and
    ``runs`` and ``queue``, the columns they own)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def get(self, job_id: str) -> JobInfo:
        if not isinstance(job_id, str) or not _ID.match(job_id):
            raise JobNotFound(job_id)
        rows = self.ledger.db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchall()
        if not rows:
            raise JobNotFound(job_id)
        return _row_to_info(rows[0], self._places(_keys(rows)).get(rows[0]["seq"]))

    def owners(self, job_ids: Iterable[str]) -> dict[str, int]:
        """The owner uid of each of these jobs that exists (what a shared pool's replies are
        redacted by)."""
        ids = list(job_ids)
        out: dict[str, int] = {}
        for at in range(0, len(ids), 500):
            chunk = ids[at : at + 500]
            marks = ",".join("?" * len(chunk))
            for job_id, uid in self.ledger.db.execute(
                f"SELECT id, uid FROM jobs WHERE id IN ({marks})", chunk
            ):
                out[job_id] = uid
        return out

    def jobs(
        self,
        states: Iterable[str] | None = None,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        ids: Sequence[str] | None = None,
        newest_first: bool = False,
        holding: bool = False,
    ) -> list[JobInfo]:
        """Jobs in submit order (or newest first), filtered by state, owner or ids; with
        ``holding``, only those that hold a grant now (``schema.HOLDING``: running, or a
        success whose process still exits)."""
        where, args = _list_query(states, owner, limit, offset, ids, newest_first, holding)
        rows = self.ledger.db.execute("SELECT * FROM jobs" + where, args).fetchall()
        places = self._places(_keys(rows))
        return [_row_to_info(r, places.get(r["seq"])) for r in rows]

    def job_rows(
        self,
        states: Iterable[str] | None = None,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        ids: Sequence[str] | None = None,
        newest_first: bool = False,
        holding: bool = False,
    ) -> list[dict[str, Any]]:
        """What ``jobs`` lists, each as its JSON (``info_to_json``) made straight from the
        row: the agent's list replies, which need no ``JobInfo``."""
        where, args = _list_query(states, owner, limit, offset, ids, newest_first, holding)
        cursor = self.ledger.db.cursor()
        cursor.row_factory = None  # plain tuples, in JOB_SELECT's order
        rows = cursor.execute(f"SELECT {JOB_SELECT} FROM jobs" + where, args).fetchall()
        places = self._places([(r[_SEQ], r[_STATE], r[_POSITION], r[_BACKEND]) for r in rows])
        return [row_to_json(r, places.get(r[_SEQ])) for r in rows]

    def _places(self, keys: Sequence[_LineKey]) -> dict[int, int]:
        """The place in line of each of these rows that is in one, by ``seq``: counted for a
        few; else, for each of their backends, the jobs ahead of the first of them counted
        and the line from it to the last of them numbered (one read of the index each)."""
        ranked = [k for k in keys if k[2] is not None and k[1] in WAITING]
        if len(ranked) <= _COUNTED:
            return {
                seq: 1
                + self.ledger.db.execute(
                    f"SELECT COUNT(*) FROM jobs WHERE backend=? AND {_IN_LINE} "
                    "AND (position, seq) < (?, ?)",
                    (backend, position, seq),
                ).fetchone()[0]
                for seq, _, position, backend in ranked
            }
        places: dict[int, int] = {}
        for backend in {k[3] for k in ranked}:
            mine = sorted((k[2], k[0]) for k in ranked if k[3] == backend)
            (first, first_seq), (last, last_seq) = mine[0], mine[-1]
            ahead = self.ledger.db.execute(
                f"SELECT COUNT(*) FROM jobs WHERE backend=? AND {_IN_LINE} "
                "AND (position, seq) < (?, ?)",
                (backend, first, first_seq),
            ).fetchone()[0]
            line = self.ledger.db.execute(
                f"SELECT seq FROM jobs INDEXED BY jobs_line WHERE backend=? AND {_IN_LINE} "
                "AND (position, seq) >= (?, ?) AND (position, seq) <= (?, ?) "
                "ORDER BY position, seq",
                (backend, first, first_seq, last, last_seq),
            )
            places.update((seq, n) for n, (seq,) in enumerate(line, start=ahead + 1))
        return places

    def finished_jobs(
        self,
        since: float = 0.0,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[JobInfo]:
        """Jobs that ended at or after ``since``, the most recently ended first (``history``)."""
        where, args = _finished_query(since, owner, limit, offset)
        return [
            _row_to_info(r, None)
            for r in self.ledger.db.execute("SELECT * FROM jobs" + where, args)
        ]

    def finished_rows(
        self,
        since: float = 0.0,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """What ``finished_jobs`` lists, each as its JSON made straight from the row."""
        where, args = _finished_query(since, owner, limit, offset)
        cursor = self.ledger.db.cursor()
        cursor.row_factory = None
        return [
            row_to_json(r, None)
            for r in cursor.execute(f"SELECT {JOB_SELECT} FROM jobs" + where, args)
        ]

    @staticmethod
    def finished_sizes(
        db: sqlite3.Connection, backend: str, limit: int
    ) -> list[tuple[str, str, float, float, float]]:
        """``(owner, name, attained GPU-seconds, finished, GPUs)`` of the last ``limit`` jobs
        that ran to their end on ``backend``, oldest first: what a learning policy learns
        from (run times by GPU count among it)."""
        rows = db.execute(
            "SELECT owner, name, attained, finished, gpus FROM jobs WHERE backend=? "
            "AND state IN ('succeeded','failed','timeout') AND finished IS NOT NULL "
            "ORDER BY seq DESC LIMIT ?",
            (backend, int(limit)),
        ).fetchall()
        return [
            (r[0], r[1], float(r[2] or 0.0), float(r[3]), float(r[4] or 0.0))
            for r in reversed(rows)
        ]

    @staticmethod
    def finished_run_times(
        db: sqlite3.Connection, backend: str, limit: int
    ) -> list[tuple[str, str, float, float]]:
        """``(owner, name, gpus, seconds run)`` of the last ``limit`` jobs that ran to their end on
        ``backend``, oldest first (seconds: GPU-service over GPUs, else the last run's length)."""
        rows = db.execute(
            "SELECT owner, name, gpus, attained, started, finished FROM jobs WHERE backend=? "
            "AND state IN ('succeeded','failed','timeout') AND finished IS NOT NULL "
            "AND started IS NOT NULL ORDER BY seq DESC LIMIT ?",
            (backend, int(limit)),
        ).fetchall()
        out = []
        for owner, name, gpus, attained, started, finished in reversed(rows):
            ran = (attained or 0.0) / gpus if gpus and attained else finished - started
            out.append((owner, name, float(gpus or 0.0), float(ran)))
        return out

    def count_kind(self, kind: str) -> dict[str, int]:
        """Unfinished jobs of one kind (``kernel``: GPU kernels' leases), by state."""
        rows = self.ledger.db.execute(
            "SELECT state, COUNT(*) FROM jobs WHERE kind=? "
            "AND state IN ('queued','running','preempted') GROUP BY state",
            (kind,),
        )
        return {state: n for state, n in rows}

    def count_jobs(self) -> dict[str, int]:
        """Number of jobs in each state."""
        counts = {state: 0 for state in STATES}
        for state, n in self.ledger.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"):
            counts[state] = n
        return counts

    def wait_times(self) -> list[float]:
        """Seconds from submission to its (last) start, of every job that started."""
        rows = self.ledger.db.execute(
            "SELECT started - submitted FROM jobs WHERE started IS NOT NULL"
        ).fetchall()
        return [float(r[0]) for r in rows]

    def attained_by_owner(self) -> dict[str, float]:
        """GPU-seconds of every user's finished runs (``attained``), by owner."""
        rows = self.ledger.db.execute("SELECT owner, SUM(attained) FROM jobs GROUP BY owner")
        return {str(owner): float(total or 0.0) for owner, total in rows}

    def count_active(self, backend: str) -> int:
        """Jobs on ``backend`` waiting or running."""
        row = self.ledger.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE backend=? AND state IN ('queued','preempted','running')",
            (backend,),
        ).fetchone()
        return int(row[0])

    def count_waiting(self, uid: int) -> int:
        """Jobs of user ``uid`` waiting to start (``queued`` or ``preempted``)."""
        row = self.ledger.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE uid=? AND state IN ('queued','preempted')", (uid,)
        ).fetchone()
        return int(row[0])

    def states(self, ids: Sequence[str], db: sqlite3.Connection | None = None) -> dict[str, str]:
        """The state of each of these jobs that exists (inside ``db``'s transaction if given)."""
        db = self.ledger.db if db is None else db
        ids = list(ids)
        states: dict[str, str] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = db.execute(
                f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk
            )
            states.update({r[0]: r[1] for r in rows})
        return states

    @staticmethod
    def state_and_supervisor(db: sqlite3.Connection, job_id: str) -> sqlite3.Row | None:
        """``(state, supervisor_pid)`` of a job: whether it runs and who supervises it."""
        row: sqlite3.Row | None = db.execute(
            "SELECT state, supervisor_pid FROM jobs WHERE id=?", (job_id,)
        ).fetchone()
        return row

    @staticmethod
    def state_and_priority(db: sqlite3.Connection, job_id: str) -> sqlite3.Row | None:
        """``(state, priority)`` of a job, ``None`` if there is no such job."""
        row: sqlite3.Row | None = db.execute(
            "SELECT state, priority FROM jobs WHERE id=?", (job_id,)
        ).fetchone()
        return row

    @staticmethod
    def submitted_at(db: sqlite3.Connection, job_id: str) -> float:
        """When an existing job was submitted."""
        return float(db.execute("SELECT submitted FROM jobs WHERE id=?", (job_id,)).fetchone()[0])


def _keys(rows: Sequence[sqlite3.Row]) -> list[_LineKey]:
    return [(r["seq"], r["state"], r["position"], r["backend"]) for r in rows]


def _list_query(
    states: Iterable[str] | None,
    owner: str | None,
    limit: int | None,
    offset: int,
    ids: Sequence[str] | None,
    newest_first: bool,
    holding: bool,
) -> tuple[str, list[Any]]:
    """The ``WHERE ... ORDER BY ... LIMIT`` of a ``jobs`` listing, and its arguments."""
    clauses: list[str] = [HOLDING] if holding else []
    args: list[Any] = []
    if states is not None:
        states = list(states)
        clauses.append(f"state IN ({','.join('?' * len(states))})")
        args += states
    if owner is not None:
        clauses.append("owner=?")
        args.append(owner)
    if ids is not None:
        clauses.append(f"id IN ({','.join('?' * len(ids))})")
        args += list(ids)
    sql = " WHERE " + " AND ".join(clauses) if clauses else ""
    sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ? OFFSET ?"
        args += [int(limit), int(offset)]
    return sql, args


def _finished_query(
    since: float, owner: str | None, limit: int | None, offset: int
) -> tuple[str, list[Any]]:
    """The ``WHERE ... ORDER BY ... LIMIT`` of a ``finished`` listing, and its arguments."""
    sql = " WHERE finished IS NOT NULL AND finished >= ?"
    args: list[Any] = [since]
    if owner is not None:
        sql += " AND owner=?"
        args.append(owner)
    sql += " ORDER BY finished DESC, seq DESC"
    if limit is not None or offset:
        sql += " LIMIT ? OFFSET ?"
        args += [-1 if limit is None else int(limit), int(offset)]
    return sql, args

"""Staged inputs and the data cache (``staging/``): stagings requested, claimed, renewed,
finished or failed, and the cache's entries and counters.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..vocab.schema import _SOURCE_ID
from .events import EventLog
from .ledger import Ledger
from .queue import Queue


class DataCache:
    """Staged inputs and the data cache, ``store.cache``: the ``job_inputs``, ``stagings``
    and ``cache_entries`` tables. A job's inputs are added with it (``add_inputs``, in the
    submit's transaction), bound to a cache entry once staged; a staging that fails fails
    its waiting jobs through ``Store.fail_staging``, which holds the part that moves a
    job's state."""

    def __init__(self, ledger: Ledger, event_log: EventLog, queue: Queue) -> None:
        self.ledger = ledger
        self.event_log = event_log
        self.queue = queue

    _REFERENCED = (
        "EXISTS(SELECT 1 FROM job_inputs ji JOIN jobs j ON j.id = ji.job_id "
        "WHERE ji.key = c.key AND j.state IN ('queued','running','preempted'))"
    )

    @staticmethod
    def add_inputs(
        db: sqlite3.Connection, rows: Sequence[tuple[str, str, str, str, float]]
    ) -> None:
        """Record new jobs' ``(job id, name, source, source id, added)`` inputs, inside the
        submit's transaction."""
        db.executemany(
            "INSERT INTO job_inputs(job_id, name, source, source_id, added) VALUES(?,?,?,?,?)",
            rows,
        )

    @staticmethod
    def copy_inputs(db: sqlite3.Connection, job_id: str, new_id: str, now: float) -> None:
        """A requeue's new job ``new_id`` needs what ``job_id`` needed (staged anew)."""
        db.execute(
            "INSERT INTO job_inputs(job_id, name, source, source_id, added) "
            "SELECT ?, name, source, source_id, ? FROM job_inputs WHERE job_id=?",
            (new_id, now, job_id),
        )

    def waiting_inputs(
        self, db: sqlite3.Connection, source: str | None = None
    ) -> list[sqlite3.Row]:
        """Inputs of waiting jobs not yet bound to a cache entry, with their staging's progress.

        With ``source`` (a source id): only jobs that wait for that source, all their inputs.
        """
        sql = (
            "SELECT ji.job_id, ji.name, ji.source, ji.source_id, j.uid, s.lease_expires, "
            "s.stager_pid, s.done_bytes, s.total_bytes, s.rate, s.note "
            "FROM job_inputs ji JOIN jobs j ON j.id = ji.job_id "
            "LEFT JOIN stagings s ON s.source_id = ji.source_id "
            "WHERE ji.key IS NULL AND j.state IN ('queued','preempted')"
        )
        args: list[Any] = []
        if source is not None:
            sql += (
                " AND ji.job_id IN (SELECT job_id FROM job_inputs WHERE source_id=? "
                "AND key IS NULL)"
            )
            args.append(source)
        return db.execute(sql + " ORDER BY j.seq", args).fetchall()

    def request_staging(
        self, db: sqlite3.Connection, source_id: str, source: str, uid: int, claim_by: float
    ) -> bool:
        """Arm the staging of a source nobody works on (none yet, finished, or its stager's
        lease ran out); a stager must claim it before ``claim_by``. True if armed now."""
        row = db.execute(
            "SELECT lease_expires FROM stagings WHERE source_id=?", (source_id,)
        ).fetchone()
        if row is not None and row[0] is not None and row[0] >= time.time():
            return False
        db.execute(
            "INSERT INTO stagings(source_id, source, uid, attempt, lease_expires) "
            "VALUES(?,?,?,1,?) ON CONFLICT(source_id) DO UPDATE SET attempt=attempt+1, "
            "stager_pid=NULL, host=NULL, lease_expires=excluded.lease_expires, started=NULL, "
            "done_bytes=0, total_bytes=NULL, rate=NULL, note=NULL",
            (source_id, source, uid, claim_by),
        )
        return True

    def staging(self, source_id: str) -> sqlite3.Row | None:
        if not isinstance(source_id, str) or not _SOURCE_ID.match(source_id):
            return None
        rows = self.ledger.db.execute("SELECT * FROM stagings WHERE source_id=?", (source_id,))
        return rows.fetchone()

    def claim_staging(self, source_id: str, attempt: int, lease_ttl: float) -> float | None:
        """Take an armed staging for this process (one claimant wins); returns the claim time."""
        now = time.time()
        with self.ledger.transaction() as db:
            claimed = db.execute(
                "UPDATE stagings SET stager_pid=?, host=?, lease_expires=?, started=? "
                "WHERE source_id=? AND attempt=? AND stager_pid IS NULL AND lease_expires >= ?",
                (os.getpid(), socket.gethostname(), now + lease_ttl, now, source_id, attempt, now),
            ).rowcount
        return now if claimed else None

    def renew_staging(
        self,
        source_id: str,
        lease_ttl: float,
        *,
        done: int,
        total: int | None,
        rate: float | None,
        note: str | None,
        words: Callable[[list[sqlite3.Row]], str],
    ) -> bool:
        """Record progress and extend the lease; False when the claim was taken back.

        The waiting jobs' reasons are rewritten here (``words`` of their inputs'
        progress), so every view shows the progress without waiting for a tick.
        """
        with self.ledger.transaction() as db:
            kept = db.execute(
                "UPDATE stagings SET lease_expires=?, done_bytes=?, total_bytes=?, rate=?, note=? "
                "WHERE source_id=? AND stager_pid=?",
                (time.time() + lease_ttl, done, total, rate, note, source_id, os.getpid()),
            ).rowcount
            if kept:
                by_job: dict[str, list[sqlite3.Row]] = {}
                for row in self.waiting_inputs(db, source_id):
                    by_job.setdefault(row["job_id"], []).append(row)
                self.queue.set_waiting_words(
                    db, [(words(rows), job_id) for job_id, rows in by_job.items()]
                )
        return bool(kept)

    def finish_staging(
        self,
        source_id: str,
        key: str,
        *,
        since: float,
        entry: dict[str, Any] | None,
        reason: Callable[[str], str],
        owner: int | None = None,
    ) -> list[str] | None:
        """Bind the inputs of waiting jobs submitted before ``since`` to cache entry ``key``.

        ``entry`` is a fresh copy to record (a miss); ``None`` means ``key`` was found in
        the cache (a hit); ``owner``: the user a fresh copy belongs to (a shared pool's
        entries are each their owner's). Returns the jobs bound, or ``None`` when this process lost its
        claim or the entry it found was evicted meanwhile (stage again).
        """
        now = time.time()
        with self.ledger.transaction() as db:
            if not self._holds_staging(db, source_id):
                return None
            if entry is not None:
                db.execute(
                    "INSERT OR REPLACE INTO cache_entries(key, source, path, bytes, files, "
                    "checksum, created, last_used, hits, uid) VALUES(?,?,?,?,?,?,?,?,0,?)",
                    (
                        key,
                        entry["source"],
                        entry["path"],
                        entry["bytes"],
                        entry["files"],
                        entry["checksum"],
                        now,
                        now,
                        owner,
                    ),
                )
            elif db.execute("SELECT 1 FROM cache_entries WHERE key=?", (key,)).fetchone() is None:
                return None
            rows = db.execute(
                "SELECT ji.job_id, ji.name, j.state FROM job_inputs ji "
                "JOIN jobs j ON j.id = ji.job_id WHERE ji.source_id=? AND ji.key IS NULL "
                "AND ji.added <= ? AND j.state IN ('queued','preempted')",
                (source_id, since),
            ).fetchall()
            db.executemany(
                "UPDATE job_inputs SET key=? WHERE job_id=? AND name=?",
                [(key, r["job_id"], r["name"]) for r in rows],
            )
            hits = len(rows) - (1 if entry is not None and rows else 0)
            db.execute(
                "UPDATE cache_entries SET hits=hits+?, last_used=? WHERE key=?", (hits, now, key)
            )
            self.ledger.count(db, hits=hits, misses=1 if entry is not None else 0)
            for r in rows:
                self.event_log.record(
                    db, r["job_id"], r["state"], r["state"], reason(r["name"]), now=now
                )
            db.execute(
                "UPDATE stagings SET stager_pid=NULL, lease_expires=NULL, note=NULL "
                "WHERE source_id=?",
                (source_id,),
            )
        return [r["job_id"] for r in rows]

    def give_up_staging(
        self, db: sqlite3.Connection, source_id: str, *, since: float
    ) -> list[tuple[str, str]] | None:
        """End this process's staging of a source that failed, inside ``db``'s open
        transaction: ``(job id, input name)`` of the waiting jobs (submitted before
        ``since``) that needed it, each job once, for the caller to fail
        (``Store.fail_staging``); None when this process no longer holds the staging."""
        if not self._holds_staging(db, source_id):
            return None
        rows = db.execute(
            "SELECT DISTINCT ji.job_id, ji.name FROM job_inputs ji "
            "JOIN jobs j ON j.id = ji.job_id WHERE ji.source_id=? AND ji.key IS NULL "
            "AND ji.added <= ? AND j.state IN ('queued','preempted')",
            (source_id, since),
        ).fetchall()
        db.execute(
            "UPDATE stagings SET stager_pid=NULL, lease_expires=NULL WHERE source_id=?",
            (source_id,),
        )
        first: dict[str, str] = {}
        for job_id, name in rows:
            first.setdefault(job_id, name)
        return list(first.items())

    def release_staging(self, source_id: str) -> None:
        """Give a claimed staging back unfinished (it is armed again by the next tick)."""
        with self.ledger.transaction() as db:
            db.execute(
                "UPDATE stagings SET stager_pid=NULL, lease_expires=NULL "
                "WHERE source_id=? AND stager_pid=?",
                (source_id, os.getpid()),
            )

    @staticmethod
    def _holds_staging(db: sqlite3.Connection, source_id: str) -> bool:
        row = db.execute(
            "SELECT stager_pid FROM stagings WHERE source_id=?", (source_id,)
        ).fetchone()
        return row is not None and row[0] == os.getpid()

    def touch_cache(self, db: sqlite3.Connection, job_ids: Sequence[str], now: float) -> None:
        """Mark the cache entries of jobs that start now as used (least recently used order)."""
        for i in range(0, len(job_ids), 500):
            chunk = list(job_ids[i : i + 500])
            db.execute(
                "UPDATE cache_entries SET last_used=? WHERE key IN (SELECT key FROM job_inputs "
                f"WHERE job_id IN ({','.join('?' * len(chunk))}) AND key IS NOT NULL)",
                [now, *chunk],
            )

    def cache_entry(self, key: str) -> sqlite3.Row | None:
        return self.ledger.db.execute("SELECT * FROM cache_entries WHERE key=?", (key,)).fetchone()

    def cache_entries(self) -> list[dict[str, Any]]:
        """Every cache entry, least recently used first, with ``in_use`` (unfinished jobs)."""
        rows = self.ledger.db.execute(
            f"SELECT c.*, {self._REFERENCED} AS in_use FROM cache_entries c ORDER BY last_used"
        )
        return [{**dict(r), "in_use": bool(r["in_use"])} for r in rows]

    def drop_cache_entry(self, key: str) -> bool:
        """Forget an entry no unfinished job uses (False if one does, or it is gone)."""
        with self.ledger.transaction() as db:
            dropped = db.execute(
                f"DELETE FROM cache_entries AS c WHERE key=? AND NOT {self._REFERENCED}", (key,)
            ).rowcount
            if dropped:
                self.ledger.count(db, evictions=1)
        return bool(dropped)

    def cache_counters(self) -> dict[str, int]:
        """Hits, misses and evictions since the ledger was created."""
        counters = self.ledger.get_meta("cache_counters", {}) or {}
        return {k: int(counters.get(k, 0)) for k in ("hits", "misses", "evictions")}

    def active_stagings(self) -> list[sqlite3.Row]:
        """Stagings a stager works on now (or is about to), with their progress."""
        return self.ledger.db.execute(
            "SELECT * FROM stagings WHERE lease_expires IS NOT NULL ORDER BY started"
        ).fetchall()

    def job_data_paths(self, job_id: str) -> dict[str, str]:
        """``name -> local path`` of a job's staged inputs."""
        rows = self.ledger.db.execute(
            "SELECT ji.name, c.path FROM job_inputs ji JOIN cache_entries c ON c.key = ji.key "
            "WHERE ji.job_id=?",
            (job_id,),
        )
        return {r[0]: r[1] for r in rows}

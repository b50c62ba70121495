"""What a job runs, kept while anyone may need it: references from unfinished jobs' files
to their blobs, a payload kept ``DLSCHED_PAYLOAD_KEEP`` after its job ended (for
``requeue``) and counted against its owner's quota, then deleted; leftovers collected.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from .buffers import FILE_PREFIX, remove_files, sweep
from .ledger import Ledger, _keep_or_default, payload_keep
from .results import parse_name, result_name, settle


class Payloads:
    """The ``blobs`` and ``blob_refs`` tables, ``store.payloads``: what jobs run, stored
    (``store_blobs``), counted while in use, kept after their job ended, then deleted.

    It reads which blobs a job or a schedule names from their rows (``jobs.files``,
    ``schedules.template``) in the same statement that counts them: one query is the
    point there, and it writes only its own tables.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @staticmethod
    def store_blobs(
        db: sqlite3.Connection,
        blobs: dict[str, bytes],
        counts: dict[str, int],
        outside: dict[str, int],
        uid: int,
    ) -> None:
        """Insert new jobs' files (``blobs``: content by digest) and count each blob and
        each buffer file (``outside``: ``file:<path>`` -> size) ``counts`` times more in
        use, as user ``uid``'s, inside the submit's transaction."""
        db.executemany("INSERT OR IGNORE INTO blobs(hash, data) VALUES(?, ?)", list(blobs.items()))
        # each blob counts the files of unfinished jobs that name it (``drop_files``)
        db.executemany(
            "INSERT INTO blob_refs(hash, refs, size, uid) VALUES(?, ?, ?, ?) "
            "ON CONFLICT(hash) DO UPDATE SET refs = refs + excluded.refs, "
            "unused_since = NULL",
            [(digest, counts[digest], len(data), uid) for digest, data in blobs.items()]
            + [(key, counts[key], size, uid) for key, size in outside.items()],
        )

    @staticmethod
    def keep_for_requeue(db: sqlite3.Connection, files: str | None) -> bool:
        """Count the blobs an ended job's ``files`` name in use again, by the new job of a
        requeue; False (nothing counted) when any of them is no longer kept."""
        hashes = sorted(set(json.loads(files or "{}").values()))
        marks = ",".join("?" * len(hashes))
        kept = db.execute(  # a blob's or a buffer file's count: kept while it is
            f"SELECT COUNT(*) FROM blob_refs WHERE hash IN ({marks})", hashes
        ).fetchone()[0]
        if kept != len(hashes):
            return False
        db.executemany(  # the new job names them: kept for as long as it may run
            "UPDATE blob_refs SET refs = refs + 1, unused_since = NULL WHERE hash=?",
            [(h,) for h in hashes],
        )
        return True

    @staticmethod
    def pin_template(db: sqlite3.Connection, template: str, delta: int, now: float) -> None:
        """Count a schedule's template's blobs in use (+1) or not any more (-1) by one
        schedule (``schedules.py``)."""
        row = db.execute("SELECT files FROM jobs WHERE id=?", (template,)).fetchone()
        hashes = sorted(set(json.loads((row[0] if row else None) or "{}").values()))
        for digest in hashes:
            db.execute(
                "UPDATE blob_refs SET refs = refs + ?, "
                "unused_since = CASE WHEN refs + ? <= 0 THEN ? ELSE NULL END WHERE hash=?",
                (delta, delta, now, digest),
            )

    @staticmethod
    def _pin_all_templates(db: sqlite3.Connection) -> None:
        """``collect_leftovers`` counts blobs again from the jobs: add the schedules'."""
        db.execute(
            "INSERT INTO blob_refs(hash, refs, size, uid) SELECT f.value, COUNT(*), 0, "
            "MIN(j.uid) FROM schedules s JOIN jobs j ON j.id = s.template, "
            "json_each(j.files) f WHERE 1 GROUP BY f.value "
            "ON CONFLICT(hash) DO UPDATE SET refs = refs + excluded.refs, unused_since = NULL"
        )

    def read_file(self, job_id: str, name: str) -> bytes | None:
        """A file stored with the job at submission (``payload.pkl``, ``context.json``, ...);
        ``None`` once the job has ended (its payload is deleted then)."""
        rows = self.ledger.db.execute(
            "SELECT b.data FROM jobs j JOIN blobs b ON b.hash = json_extract(j.files, ?) "
            "WHERE j.id=?",
            (f'$."{name}"', job_id),
        ).fetchall()
        return bytes(rows[0][0]) if rows else None

    @staticmethod
    def drop_files(db: sqlite3.Connection, files: str, now: float | None = None) -> None:
        """A job has ended: the blobs only it still named are kept ``payload_keep()`` seconds
        more, for a ``requeue``, then deleted (here, when a later job ends; or when an agent
        starts)."""
        now = time.time() if now is None else now
        hashes = list(json.loads(files or "{}").values())
        if hashes:
            db.executemany(
                "UPDATE blob_refs SET refs = refs - 1 WHERE hash=?", [(h,) for h in hashes]
            )
            marks = ",".join("?" * len(hashes))
            db.execute(
                f"UPDATE blob_refs SET unused_since = ? WHERE refs <= 0 AND hash IN ({marks})",
                [now, *hashes],
            )
        Payloads._purge_payloads(db, now - _keep_or_default())

    @staticmethod
    def _purge_payloads(db: sqlite3.Connection, before: float) -> tuple[int, int]:
        """Delete the blobs no unfinished job has named since ``before`` or earlier;
        ``(blobs, bytes)`` freed."""
        gone = db.execute(
            "SELECT hash, size FROM blob_refs WHERE refs <= 0 AND unused_since <= ?", (before,)
        ).fetchall()
        if not gone:
            return 0, 0
        hashes = [r[0] for r in gone]
        for at in range(0, len(hashes), 500):
            chunk = hashes[at : at + 500]
            marks = ",".join("?" * len(chunk))
            db.execute(f"DELETE FROM blobs WHERE hash IN ({marks})", chunk)
            db.execute(f"DELETE FROM blob_refs WHERE hash IN ({marks})", chunk)
        remove_files(h for h in hashes if h.startswith(FILE_PREFIX))
        return len(gone), sum(int(r[1]) for r in gone)

    def collect_leftovers(self) -> tuple[int, int]:
        """Count again which unfinished jobs name each blob; keep what jobs that ended less
        than ``payload_keep()`` ago named, and delete the rest (a ledger written by older
        code kept every payload); ``(blobs, bytes)`` freed.

        One pass over the jobs: the pool agent does it when it starts.
        """
        now = started = time.time()
        keep = payload_keep()
        with self.ledger.transaction() as db:
            db.execute("DELETE FROM blob_refs")
            db.execute(
                "INSERT INTO blob_refs(hash, refs, size, uid) SELECT f.value, COUNT(*), 0, "
                "MIN(j.uid) FROM jobs j, json_each(j.files) f "
                "WHERE j.state IN ('queued','running','preempted') GROUP BY f.value"
            )
            self._pin_all_templates(db)  # a schedule's job is run again: its payload is in use
            db.execute(
                "INSERT OR IGNORE INTO blob_refs(hash, refs, size, uid, unused_since) "
                "SELECT f.value, 0, 0, MIN(j.uid), MAX(j.finished) FROM jobs j, "
                "json_each(j.files) f WHERE j.finished IS NOT NULL AND j.finished > ? "
                "AND j.state NOT IN ('queued','running','preempted') GROUP BY f.value",
                (now - keep,),
            )
            db.execute(
                "UPDATE blob_refs SET size = COALESCE("
                "(SELECT length(data) FROM blobs b WHERE b.hash = blob_refs.hash), 0)"
            )
            files = self._buffer_file_sizes(db)
            db.execute(
                "DELETE FROM blob_refs WHERE hash NOT IN (SELECT hash FROM blobs) "
                "AND hash NOT LIKE 'file:%'"
            )
            leftover = "FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs)"
            freed = db.execute(f"SELECT COUNT(*), COALESCE(SUM(length(data)), 0) {leftover}")
            count, size = freed.fetchone()
            db.execute(f"DELETE {leftover}")
            purged, purged_bytes = self._purge_payloads(db, now - keep)
        swept, swept_bytes = sweep(self.ledger.home, files, started, self._kept_result)
        return int(count) + purged + swept, int(size) + purged_bytes + swept_bytes

    def _kept_result(self, folder: Path, name: str, ours: bool) -> bool:
        """Whether the sweep leaves a result's buffer file alone (``results.py``): one of a
        running job's attempt (it may still be written or settled); one of a result kept
        (the job succeeded on that attempt) is settled into the job's spool folder now, by
        the folder's own user (a shared pool's service opens no file of a user's, and
        leaves it to the user's reads). Any other (the job was killed while writing it, or
        ran again since) goes."""
        parsed = parse_name(name)
        if parsed is None:
            return False
        job_id, attempt, _ = parsed
        row = self.ledger.db.execute(
            "SELECT state, attempts FROM jobs WHERE id=?", (job_id,)
        ).fetchone()
        if row is None or row[1] != attempt or row[0] not in ("running", "succeeded"):
            return False
        if row[0] == "succeeded" and ours:
            settle(self.ledger.spool_root / job_id, folder, result_name(job_id, attempt))
        return True

    @staticmethod
    def _buffer_file_sizes(db: sqlite3.Connection) -> set[str]:
        """The buffer files the jobs name, each counted at its size on disk (one gone since,
        a reboot's ``/dev/shm``, is forgotten); their paths."""
        kept = set()
        for (key,) in db.execute("SELECT hash FROM blob_refs WHERE hash LIKE 'file:%'").fetchall():
            try:
                size = os.stat(key[len(FILE_PREFIX) :]).st_size
            except OSError:
                db.execute("DELETE FROM blob_refs WHERE hash=?", (key,))
                continue
            db.execute("UPDATE blob_refs SET size=? WHERE hash=?", (size, key))
            kept.add(key[len(FILE_PREFIX) :])
        return kept

    def payload_bytes(self, uid: int) -> int:
        """Bytes of the payloads (each blob once) that user ``uid``'s jobs hold, unfinished
        ones' and those ended ones' kept for a requeue: each blob is its storer's
        (``insert_jobs`` addresses content per user)."""
        row = self.ledger.db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blob_refs WHERE uid=?", (uid,)
        ).fetchone()
        return int(row[0])

    def kept_payload_bytes(self, uid: int) -> int:
        """Bytes of the payloads user ``uid``'s ended jobs keep for a requeue (what a
        submission that needs the room frees first)."""
        row = self.ledger.db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blob_refs WHERE uid=? AND refs <= 0", (uid,)
        ).fetchone()
        return int(row[0])

    def release_kept_payloads(self, uid: int) -> int:
        """Delete the payloads user ``uid``'s ended jobs keep for a requeue; bytes freed
        (a submission that needs room under the user's quota takes it from these first)."""
        with self.ledger.transaction() as db:
            return self._purge_owner(db, uid)

    @staticmethod
    def _purge_owner(db: sqlite3.Connection, uid: int) -> int:
        gone = db.execute(
            "SELECT hash, size FROM blob_refs WHERE uid=? AND refs <= 0", (uid,)
        ).fetchall()
        for h, _ in gone:
            db.execute("DELETE FROM blobs WHERE hash=?", (h,))
            db.execute("DELETE FROM blob_refs WHERE hash=?", (h,))
        remove_files(h for h, _ in gone if h.startswith(FILE_PREFIX))
        return sum(int(r[1]) for r in gone)

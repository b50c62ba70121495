"""What a job runs, kept while anyone may need it: references from unfinished jobs' files
to their blobs, a payload kept ``DLSCHED_PAYLOAD_KEEP`` after its job ended (for
``requeue``) and counted against its owner's quota, then deleted; leftovers collected.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time

from .buffers import FILE_PREFIX, remove_files, sweep
from .ledger import _keep_or_default, payload_keep
from .schedules import Schedules


class Payloads(Schedules):
    """The ledger's payloads part of ``Store`` (see this module's docstring)."""

    @staticmethod
    def _drop_files(db: sqlite3.Connection, files: str, now: float | None = None) -> None:
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
        with self.transaction() as db:
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
        swept, swept_bytes = sweep(self.home, files, started)
        return int(count) + purged + swept, int(size) + purged_bytes + swept_bytes

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
        row = self.db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blob_refs WHERE uid=?", (uid,)
        ).fetchone()
        return int(row[0])

    def kept_payload_bytes(self, uid: int) -> int:
        """Bytes of the payloads user ``uid``'s ended jobs keep for a requeue (what a
        submission that needs the room frees first)."""
        row = self.db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blob_refs WHERE uid=? AND refs <= 0", (uid,)
        ).fetchone()
        return int(row[0])

    def release_kept_payloads(self, uid: int) -> int:
        """Delete the payloads user ``uid``'s ended jobs keep for a requeue; bytes freed
        (a submission that needs room under the user's quota takes it from these first)."""
        with self.transaction() as db:
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

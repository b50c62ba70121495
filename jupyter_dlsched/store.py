"""The ledger: one SQLite database (WAL) plus a spool folder, shared by every participant.

Every state change is one short ``BEGIN IMMEDIATE`` transaction through the
state machine in ``schema.TRANSITIONS``; each is recorded in ``events``. What
a job runs is stored with its row (content-addressed ``blobs``); logs and
results live in ``spool/<job-id>/``. The folder is private to the user: see
``private`` for what is checked before anything in it is trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import private
from .errors import IllegalTransition, JobNotFound, LedgerUnavailable
from .private import default_home
from .resources import Placement
from .schedules import ledger as schedules
from .schedules.every import parse_every
from .schema import (  # noqa: F401  (the ledger's vocabulary, re-exported)
    _ID,
    _ID_ALPHABET,
    _JOB_COLUMNS,
    _SOURCE_ID,
    ACTIVE,
    MIGRATIONS,
    SCHEMA_VERSION,
    STATES,
    TERMINAL,
    TRANSITIONS,
    WAITING,
    JobInfo,
    RunEnd,
    _row_to_info,
    end_of_run,
    source_id,
)
from .spec import JobSpec
from .units import format_duration, parse_duration

#: What a tick reads of each active job: the policy's inputs, and the columns it compares
#: before rewriting a job's place in the queue.
_SNAPSHOT_COLUMNS = (
    "id, seq, name, state, submitted, started, priority, owner, deadline, time_limit, preemptible, "
    "attained, preemptions, gpus, gpu_mem, cpus, mem, after, attempts, position, waiting, "
    "placement, job_pid, preempt_requested, cancel_requested, max_gpus, resize_to, begin,"
    " expected_start, start_p80"
)

RESERVE_NAME = "disk-reserve"
#: Kept allocated in the state folder and freed when the disk fills up, so the ledger can
#: still record why jobs failed (and start jobs that need no disk) until space comes back.
RESERVE_BYTES = 4 * 2**20
#: A second, smaller reserve that only a cancel may spend: once the first is used up, the
#: cancel of the job that fills the disk must still go through.
LAST_RESERVE_NAME = "disk-reserve-cancel"
LAST_RESERVE_BYTES = 2**20


class Reserve:
    """A file of ``RESERVE_BYTES`` that stands in for the space the ledger needs when full.

    Without it, a job that fills the disk with output leaves no room for the
    ledger to record that the job failed, or for anything else to start. The
    check before each write is one ``statvfs``. Beside it, ``last`` (a file of
    ``LAST_RESERVE_BYTES``) is spent only by cancels (``release_last``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last = path.with_name(LAST_RESERVE_NAME)

    def refill(self) -> None:
        """Allocate the reserves again when missing and the disk has ample room."""
        for path, size in ((self.path, RESERVE_BYTES), (self.last, LAST_RESERVE_BYTES)):
            if path.exists() or _free_bytes(path.parent) < 3 * RESERVE_BYTES:
                continue
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except OSError:
                continue
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
            else:
                os.close(fd)

    def release_if_low(self) -> None:
        if disk_full(self.path.parent):
            self.release()

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def release_last(self) -> None:
        """Free the cancels' reserve when the disk is full (the first reserve is spent)."""
        if disk_full(self.path.parent):
            self.release()
            self.last.unlink(missing_ok=True)


def _free_bytes(folder: Path) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


#: ``DLSCHED_PAYLOAD_KEEP``: how long an ended job's payload is kept for a requeue.
PAYLOAD_KEEP_ENV = "DLSCHED_PAYLOAD_KEEP"
DEFAULT_PAYLOAD_KEEP = 86400.0


def payload_keep() -> float:
    """Seconds an ended job's payload is kept (``DLSCHED_PAYLOAD_KEEP``, a duration such as
    ``"1h"``; default a day); ``SpecError`` for a value that is not one."""
    value = os.environ.get(PAYLOAD_KEEP_ENV, "").strip()
    if not value:
        return DEFAULT_PAYLOAD_KEEP
    return max(0.0, float(parse_duration(value, PAYLOAD_KEEP_ENV)))


def _keep_or_default() -> float:
    """``payload_keep()``, where a bad value cannot be refused (a job's end is being
    recorded; the agent refused it at its start already)."""
    try:
        return payload_keep()
    except ValueError:
        return DEFAULT_PAYLOAD_KEEP


def disk_full(folder: Path) -> bool:
    """Whether the disk holding ``folder`` is full (less than a quarter of the reserve free)."""
    return _free_bytes(folder) < RESERVE_BYTES // 4


def _free_words(folder: Path) -> str:
    from .units import format_size

    return f"{format_size(_free_bytes(folder))} free in {folder}"


def _out_of_space(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "disk is full" in str(error)


class Store:
    """The SQLite ledger and spool folder under ``home``.

    Connections are per thread; each state change is its own transaction.

    >>> store = Store("/tmp/dlsched-doc")  # doctest: +SKIP
    >>> store.jobs(states=["queued"])  # doctest: +SKIP
    []
    """

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home).expanduser() if home is not None else default_home()
        private.secure_folder(self.home)
        self.spool_root = private.private_subfolder(self.home / "spool")
        self.path = self.home / "ledger.sqlite"
        for suffix in ("", "-wal", "-shm"):
            # SQLite gives its -wal and -shm files the ledger's own mode (0600)
            path = self.path.with_name(self.path.name + suffix)
            if suffix == "" or os.path.lexists(path):
                private.create_private(path)
        self._local = threading.local()
        self.reserve = Reserve(self.home / RESERVE_NAME)
        self.reserve.refill()
        self._migrate()

    # -- connections and transactions -------------------------------------------------

    @property
    def db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            self._local.pid = os.getpid()
        return conn

    @contextmanager
    def transaction(self, *, cancel: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: one writer at a time across processes.

        A full disk is met with the reserve (see ``Reserve``) and, once that is
        spent, with ``LedgerUnavailable`` saying so, never a raw SQLite error.
        ``cancel``: a cancel, the small write that stops what fills the disk, which may
        spend the last reserve too.
        """
        self.reserve.release_if_low()
        if cancel:
            self.reserve.release_last()
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")
        except sqlite3.OperationalError as error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if _out_of_space(error):
                self.reserve.release()
                raise LedgerUnavailable(
                    f"the job ledger {self.path} could not be written: the disk is full "
                    f"({_free_words(self.home)}). Free some space; nothing was changed"
                ) from error
            raise

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def data_version(self) -> int:
        """Changes whenever another connection commits (cheap to poll)."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    def _migrate(self) -> None:
        if self._schema_version() == len(MIGRATIONS):
            return  # the common case: a read, no write lock
        with self.transaction() as db:
            has_meta = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
            ).fetchone()
            version = 0
            if has_meta:
                row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                version = int(row[0]) if row else 0
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"ledger {self.path} has schema version {version}; this jupyter-dlsched "
                    f"knows up to {len(MIGRATIONS)}: upgrade jupyter-dlsched"
                )
            for target in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[target].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)",
                    (str(target + 1),),
                )

    def _schema_version(self) -> int:
        try:
            rows = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchall()
        except sqlite3.OperationalError:
            return 0
        return int(rows[0][0]) if rows else 0

    # -- meta -------------------------------------------------------------------------

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, json.dumps(value))
            )

    # -- jobs -------------------------------------------------------------------------

    def spool(self, job_id: str) -> Path:
        """The job's folder for payload, log and result (``JobNotFound`` for a bad id)."""
        if not isinstance(job_id, str) or not _ID.match(job_id):
            raise JobNotFound(job_id)
        return self.spool_root / job_id

    def make_spool(self, job_id: str, owner: int | None = None) -> Path:
        """Create the job's folder (0700, ours, not a link) before a run writes into it.

        ``owner``: a shared pool's service makes the folder the job owner's own.
        """
        return private.private_subfolder(self.spool(job_id), owner)

    def read_spool_file(self, job_id: str, name: str) -> bytes | None:
        """A file the job's run left (``result.pkl``, ``error.json``), checked before trusting it:
        a regular file of ours, not a link, that no other user can write."""
        return private.read_file(self.spool(job_id) / name)

    def new_id(self) -> str:
        """Eight characters from a 32-letter alphabet without look-alikes (40 random bits)."""
        return "".join(_ID_ALPHABET[b % 32] for b in os.urandom(8))

    def insert_job(
        self,
        spec: JobSpec,
        files: dict[str, bytes],
        *,
        owner: str,
        uid: int,
        backend: str = "local",
        job_id: str | None = None,
        now: float | None = None,
        inline: bool = False,
    ) -> JobInfo:
        """Store a validated job as ``queued`` with its files (payload, context) in one step."""
        job_id = job_id or self.new_id()
        self.insert_jobs(
            [(job_id, spec, files)], owner=owner, uid=uid, backend=backend, now=now, inline=inline
        )
        return self.get(job_id)

    def insert_jobs(
        self,
        jobs: Sequence[tuple[str, JobSpec, dict[str, bytes]]],
        *,
        owner: str,
        uid: int,
        backend: str = "local",
        now: float | None = None,
        inline: bool = False,
    ) -> None:
        """Store many ``(job_id, spec, files)`` in one transaction (``map`` of 10k items).

        Files live in the ledger, content-addressed in ``blobs`` (a ``map``
        stores its function and context once), not in the spool folder: creating
        three files per job cost more than everything else a submission does.
        """
        for job_id, _, _ in jobs:
            self.spool(job_id)  # validates the id
        clock = now is None
        now = time.time() if now is None else now
        blobs: dict[str, bytes] = {}
        counts: dict[str, int] = {}
        names: list[str] = []
        # addressed by content within one user's blobs: what a user stores is theirs alone
        # (their quota), and nobody else's job can keep it alive
        salt = f"{uid}:".encode()
        for _, _, files in jobs:
            refs = {}
            for name, data in files.items():
                digest = hashlib.sha256(salt + data).hexdigest()
                blobs[digest] = data
                counts[digest] = counts.get(digest, 0) + 1
                refs[name] = digest
            names.append(json.dumps(refs))
        with self.transaction() as db:
            if clock:
                # submit order and submit times agree (the clock read before the write lock,
                # or stepped back): a deep queue's lanes rely on it (tick.QueueIndex)
                latest = db.execute("SELECT submitted FROM jobs ORDER BY seq DESC LIMIT 1")
                row = latest.fetchone()
                if row is not None and row[0] is not None and row[0] > now:
                    now = float(row[0])
            deps = sorted({dep for _, spec, _ in jobs for dep in spec.after})
            known = {
                r[0]
                for i in range(0, len(deps), 500)
                for r in db.execute(
                    f"SELECT id FROM jobs WHERE id IN ({','.join('?' * len(deps[i : i + 500]))})",
                    deps[i : i + 500],
                ).fetchall()
            }
            missing = [d for d in deps if d not in known]
            if missing:
                from .errors import SpecError

                raise SpecError("after", missing[0], "the id of a job in this ledger")
            db.executemany(
                "INSERT OR IGNORE INTO blobs(hash, data) VALUES(?, ?)", list(blobs.items())
            )
            # each blob counts the files of unfinished jobs that name it (``_drop_files``)
            db.executemany(
                "INSERT INTO blob_refs(hash, refs, size, uid) VALUES(?, ?, ?, ?) "
                "ON CONFLICT(hash) DO UPDATE SET refs = refs + excluded.refs, "
                "unused_since = NULL",
                [(digest, counts[digest], len(data), uid) for digest, data in blobs.items()],
            )
            db.executemany(
                """INSERT INTO jobs(id, name, kind, owner, uid, origin, state, priority,
                   gpus, gpu_mem, cpus, mem, deadline, time_limit, retries, preemptible,
                   distributed, after, backend, submitted, env, inline, files, stage_in,
                   max_gpus, begin)
                   VALUES(?,?,?,?,?,?,'queued',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                [
                    (
                        job_id,
                        spec.name,
                        spec.kind,
                        owner,
                        uid,
                        spec.origin,
                        spec.priority,
                        spec.request.gpus,
                        spec.request.gpu_mem,
                        spec.request.cpus,
                        spec.request.mem,
                        spec.deadline,
                        spec.time_limit,
                        spec.retries,
                        int(spec.preemptible),
                        int(spec.distributed),
                        json.dumps(list(spec.after)),
                        backend,
                        now,
                        json.dumps(spec.env),
                        int(inline),
                        refs,
                        json.dumps(spec.stage_in),
                        spec.max_gpus,
                        spec.begin,
                    )
                    for (job_id, spec, _), refs in zip(jobs, names, strict=True)
                ],
            )
            for job_id, spec, _ in jobs:
                if spec.every is not None:
                    schedules.add(
                        db,
                        job_id,
                        spec.every,
                        parse_every(spec.every).next_after(max(now, spec.begin or now)),
                        owner,
                        uid,
                        now,
                    )
            db.executemany(
                "INSERT INTO job_inputs(job_id, name, source, source_id, added) VALUES(?,?,?,?,?)",
                [
                    (job_id, name, source, source_id(uid, source), now)
                    for job_id, spec, _ in jobs
                    for name, source in spec.stage_in.items()
                ],
            )
            db.executemany(
                "INSERT INTO events(job_id, time, from_state, to_state, reason) "
                "VALUES(?,?,NULL,'queued','submitted')",
                [(job_id, now) for job_id, _, _ in jobs],
            )

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
        Store._purge_payloads(db, now - _keep_or_default())

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
        return len(gone), sum(int(r[1]) for r in gone)

    def collect_leftovers(self) -> tuple[int, int]:
        """Count again which unfinished jobs name each blob; keep what jobs that ended less
        than ``payload_keep()`` ago named, and delete the rest (a ledger written by older
        code kept every payload); ``(blobs, bytes)`` freed.

        One pass over the jobs: the pool agent does it when it starts.
        """
        now = time.time()
        keep = payload_keep()
        with self.transaction() as db:
            db.execute("DELETE FROM blob_refs")
            db.execute(
                "INSERT INTO blob_refs(hash, refs, size, uid) SELECT f.value, COUNT(*), 0, "
                "MIN(j.uid) FROM jobs j, json_each(j.files) f "
                "WHERE j.state IN ('queued','running','preempted') GROUP BY f.value"
            )
            schedules.pin_all(db)  # a schedule's job is run again: its payload is in use
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
            db.execute("DELETE FROM blob_refs WHERE hash NOT IN (SELECT hash FROM blobs)")
            leftover = "FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs)"
            freed = db.execute(f"SELECT COUNT(*), COALESCE(SUM(length(data)), 0) {leftover}")
            count, size = freed.fetchone()
            db.execute(f"DELETE {leftover}")
            purged, purged_bytes = self._purge_payloads(db, now - keep)
        return int(count) + purged, int(size) + purged_bytes

    def payload_bytes(self, uid: int) -> int:
        """Bytes of the payloads (each blob once) that user ``uid``'s jobs hold, unfinished
        ones' and those ended ones' kept for a requeue: each blob is its storer's
        (``insert_jobs`` addresses content per user)."""
        row = self.db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM blob_refs WHERE uid=?", (uid,)
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
        return sum(int(r[1]) for r in gone)

    #: what a job asked for and what it runs: copied to the new job of a requeue
    _SPEC_COLUMNS = (
        "name, kind, owner, uid, origin, priority, gpus, gpu_mem, cpus, mem, deadline, "
        "time_limit, retries, preemptible, distributed, after, backend, env, inline, files, "
        "stage_in"
    )

    def requeue(self, job_id: str, now: float | None = None) -> JobInfo:
        """A new queued job with the spec of finished job ``job_id`` (what it runs, what it
        needs, its name and owner), linked to it by ``requeue_of``; an event on the old job
        names the new one. ``IllegalTransition`` for a job that has not ended."""
        now = time.time() if now is None else now
        new_id = self.new_id()
        self.spool(new_id)
        with self.transaction() as db:
            row = self.state_and_priority(db, job_id)
            if row is None:
                raise JobNotFound(job_id)
            if row[0] not in TERMINAL:
                raise IllegalTransition(
                    f"job {job_id} is {row[0]}: only a finished job (succeeded, failed, "
                    f"cancelled, timeout, lost) can be requeued; `dlsched cancel {job_id}` "
                    "first to run it anew"
                )
            kind, inline = db.execute(
                "SELECT kind, inline FROM jobs WHERE id=?", (job_id,)
            ).fetchone()
            if inline or kind == "kernel":
                from .errors import SpecError

                raise SpecError(
                    "requeue",
                    job_id,
                    "a job that runs in a job process (an --inline cell runs only in the "
                    "kernel that held it, a kernel's GPU lease with that kernel: run the cell "
                    "or start the kernel again)",
                )
            latest = db.execute("SELECT submitted FROM jobs ORDER BY seq DESC LIMIT 1").fetchone()
            if latest is not None and latest[0] is not None and latest[0] > now:
                now = float(latest[0])  # submit order and submit times agree (see insert_jobs)
            files = db.execute("SELECT files FROM jobs WHERE id=?", (job_id,)).fetchone()[0]
            hashes = sorted(set(json.loads(files or "{}").values()))
            marks = ",".join("?" * len(hashes))
            kept = db.execute(
                f"SELECT COUNT(*) FROM blobs WHERE hash IN ({marks})", hashes
            ).fetchone()[0]
            if kept != len(hashes):
                from .errors import SpecError

                raise SpecError(
                    "requeue",
                    job_id,
                    "a job whose payload is still kept (an ended job's is kept "
                    f"{format_duration(_keep_or_default())}, then deleted): submit it again",
                )
            db.execute(
                f"INSERT INTO jobs(id, state, submitted, requeue_of, {self._SPEC_COLUMNS}) "
                f"SELECT ?, 'queued', ?, id, {self._SPEC_COLUMNS} FROM jobs WHERE id=?",
                (new_id, now, job_id),
            )
            db.executemany(  # the new job names them: kept for as long as it may run
                "UPDATE blob_refs SET refs = refs + 1, unused_since = NULL WHERE hash=?",
                [(h,) for h in hashes],
            )
            db.execute(
                "INSERT INTO job_inputs(job_id, name, source, source_id, added) "
                "SELECT ?, name, source, source_id, ? FROM job_inputs WHERE job_id=?",
                (new_id, now, job_id),
            )
            self._event(db, new_id, None, "queued", f"submitted: requeue of {job_id}", now)
            self._event(db, job_id, row[0], row[0], f"requeued as {new_id}", now)
        return self.get(new_id)

    def read_file(self, job_id: str, name: str) -> bytes | None:
        """A file stored with the job at submission (``payload.pkl``, ``context.json``, ...);
        ``None`` once the job has ended (its payload is deleted then)."""
        rows = self.db.execute(
            "SELECT b.data FROM jobs j JOIN blobs b ON b.hash = json_extract(j.files, ?) "
            "WHERE j.id=?",
            (f'$."{name}"', job_id),
        ).fetchall()
        return bytes(rows[0][0]) if rows else None

    def get(self, job_id: str) -> JobInfo:
        if not isinstance(job_id, str) or not _ID.match(job_id):
            raise JobNotFound(job_id)
        rows = self.db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchall()
        if not rows:
            raise JobNotFound(job_id)
        return _row_to_info(rows[0])

    def owners(self, job_ids: Iterable[str]) -> dict[str, int]:
        """The owner uid of each of these jobs that exists (what a shared pool's replies are
        redacted by)."""
        ids = list(job_ids)
        out: dict[str, int] = {}
        for at in range(0, len(ids), 500):
            chunk = ids[at : at + 500]
            marks = ",".join("?" * len(chunk))
            for job_id, uid in self.db.execute(
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
    ) -> list[JobInfo]:
        """Jobs in submit order (or newest first), filtered by state, owner or ids."""
        clauses: list[str] = []
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
        sql = "SELECT * FROM jobs"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [int(limit), int(offset)]
        return [_row_to_info(r) for r in self.db.execute(sql, args)]

    def finished_jobs(
        self, since: float = 0.0, owner: str | None = None, limit: int | None = None
    ) -> list[JobInfo]:
        """Jobs that ended at or after ``since``, the most recently ended first (``history``)."""
        sql = "SELECT * FROM jobs WHERE finished IS NOT NULL AND finished >= ?"
        args: list[Any] = [since]
        if owner is not None:
            sql += " AND owner=?"
            args.append(owner)
        sql += " ORDER BY finished DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [_row_to_info(r) for r in self.db.execute(sql, args)]

    @staticmethod
    def finished_sizes(
        db: sqlite3.Connection, backend: str, limit: int
    ) -> list[tuple[str, str, float, float]]:
        """``(owner, name, attained GPU-seconds, finished)`` of the last ``limit`` jobs that
        ran to their end on ``backend``, oldest first: what a learning policy learns from."""
        rows = db.execute(
            "SELECT owner, name, attained, finished FROM jobs WHERE backend=? "
            "AND state IN ('succeeded','failed','timeout') AND finished IS NOT NULL "
            "ORDER BY seq DESC LIMIT ?",
            (backend, int(limit)),
        ).fetchall()
        return [(r[0], r[1], float(r[2] or 0.0), float(r[3])) for r in reversed(rows)]

    def count_jobs(self) -> dict[str, int]:
        """Number of jobs in each state."""
        counts = {state: 0 for state in STATES}
        for state, n in self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"):
            counts[state] = n
        return counts

    def wait_times(self) -> list[float]:
        """Seconds from submission to its (last) start, of every job that started."""
        rows = self.db.execute(
            "SELECT started - submitted FROM jobs WHERE started IS NOT NULL"
        ).fetchall()
        return [float(r[0]) for r in rows]

    def attained_by_owner(self) -> dict[str, float]:
        """GPU-seconds of every user's finished runs (``attained``), by owner."""
        rows = self.db.execute("SELECT owner, SUM(attained) FROM jobs GROUP BY owner")
        return {str(owner): float(total or 0.0) for owner, total in rows}

    def count_active(self, backend: str) -> int:
        """Jobs on ``backend`` waiting or running."""
        row = self.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE backend=? AND state IN ('queued','preempted','running')",
            (backend,),
        ).fetchone()
        return int(row[0])

    def count_waiting(self, uid: int) -> int:
        """Jobs of user ``uid`` waiting to start (``queued`` or ``preempted``)."""
        row = self.db.execute(
            "SELECT COUNT(*) FROM jobs WHERE uid=? AND state IN ('queued','preempted')", (uid,)
        ).fetchone()
        return int(row[0])

    def states(self, ids: Sequence[str], db: sqlite3.Connection | None = None) -> dict[str, str]:
        """The state of each of these jobs that exists (inside ``db``'s transaction if given)."""
        db = self.db if db is None else db
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
    def run_holder(db: sqlite3.Connection, job_id: str) -> sqlite3.Row | None:
        """``(state, attempts, supervisor_pid)``: which attempt of a job runs, and who holds it."""
        row: sqlite3.Row | None = db.execute(
            "SELECT state, attempts, supervisor_pid FROM jobs WHERE id=?", (job_id,)
        ).fetchone()
        return row

    @staticmethod
    def attempt_holder(db: sqlite3.Connection, job_id: str) -> sqlite3.Row | None:
        """``(attempts, supervisor_pid)``: a job's attempt and the process that holds it."""
        row: sqlite3.Row | None = db.execute(
            "SELECT attempts, supervisor_pid FROM jobs WHERE id=?", (job_id,)
        ).fetchone()
        return row

    @staticmethod
    def submitted_at(db: sqlite3.Connection, job_id: str) -> float:
        """When an existing job was submitted."""
        return float(db.execute("SELECT submitted FROM jobs WHERE id=?", (job_id,)).fetchone()[0])

    def run_requests(self, ids: Sequence[str]) -> list[sqlite3.Row]:
        """``(id, state, attempts, supervisor_pid, cancel_requested, preempt_requested)`` of
        these jobs: what a runner must carry out (cancels, preemptions, allocations lost)."""
        marks = ",".join("?" * len(ids))
        return self.db.execute(
            "SELECT id, state, attempts, supervisor_pid, cancel_requested, preempt_requested "
            f"FROM jobs WHERE id IN ({marks})",
            list(ids),
        ).fetchall()

    def followable_jobs(self, backend: str, uid: int) -> list[sqlite3.Row]:
        """``(id, inline, supervisor_pid, lease_expires)`` of this user's unfinished jobs on
        ``backend``: the ones a monitor may follow when nobody alive does."""
        return self.db.execute(
            "SELECT id, inline, supervisor_pid, lease_expires FROM jobs WHERE backend=? "
            "AND uid=? AND state IN ('queued','preempted','running')",
            (backend, uid),
        ).fetchall()

    def followed_jobs(self, ids: Sequence[str]) -> list[sqlite3.Row]:
        """``id, state, supervisor_pid, cancel_requested, priority, time_limit, started`` of
        the jobs a monitor follows: what the ledger asks of them now."""
        marks = ",".join("?" * len(ids))
        return self.db.execute(
            "SELECT id, state, supervisor_pid, cancel_requested, priority, time_limit, "
            f"started FROM jobs WHERE id IN ({marks})",
            list(ids),
        ).fetchall()

    # -- the tick's queries (see ``tick.py``) -------------------------------------------

    def tick_inputs(self, backend: str, now: float) -> tuple[int, int, int, str | None]:
        """``(any waiting, any lease expired, newest event, settings)`` on ``backend``: what a
        tick reads, in one query, to know whether deciding again is worth the write lock."""
        waiting, expired, last_event, settings_json = self.db.execute(
            # a running elastic job counts as waiting: idle GPUs may be its to grow into
            "SELECT EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state IN ('queued','preempted'))"
            " OR EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state='running'"
            " AND max_gpus IS NOT NULL),"
            " EXISTS(SELECT 1 FROM jobs WHERE backend=? AND state='running' AND lease_expires < ?),"
            " (SELECT COALESCE(MAX(seq), 0) FROM events),"
            " (SELECT value FROM meta WHERE key='settings')",
            (backend, backend, backend, now),
        ).fetchall()[0]
        return waiting, expired, last_event, settings_json

    def running_job_pids(self, backend: str) -> list[int | None]:
        """The job process of each running job on ``backend`` (``None`` until it started)."""
        return [
            r[0]
            for r in self.db.execute(
                "SELECT job_pid FROM jobs WHERE state='running' AND backend=?", (backend,)
            ).fetchall()
        ]

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
        """The waiting and running jobs on ``backend`` in submit order, with the columns a
        policy decides on (``_SNAPSHOT_COLUMNS``): one lean read per tick."""
        return db.execute(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM jobs WHERE backend=? "
            "AND state IN ('queued','preempted','running') ORDER BY seq",
            (backend,),
        ).fetchall()

    @staticmethod
    def snapshot_running(db: sqlite3.Connection, backend: str) -> list[sqlite3.Row]:
        """The running jobs of ``snapshot``."""
        return db.execute(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM jobs WHERE backend=? AND state='running' "
            "ORDER BY seq",
            (backend,),
        ).fetchall()

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
    def jobs_with_events_since(db: sqlite3.Connection, seq: int) -> list[str]:
        """Ids of the jobs with an event after ``seq`` (what changed since a decision)."""
        # not DISTINCT in SQL: SQLite would answer that by scanning the whole job_id index
        rows = db.execute("SELECT job_id FROM events WHERE seq > ?", (seq,))
        return list(dict.fromkeys(r[0] for r in rows if r[0] is not None))

    @staticmethod
    def set_queue_positions(
        db: sqlite3.Connection, changes: Iterable[tuple[int | None, str | None, str]]
    ) -> None:
        """Record ``(position, waiting reason, job id)`` of waiting jobs whose place changed
        (a job that has started meanwhile keeps none)."""
        db.executemany(
            "UPDATE jobs SET position=?, waiting=? WHERE id=? AND state IN ('queued','preempted')",
            changes,
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
            self._event(
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
            return self.db.execute(
                "SELECT id, started, inline FROM jobs WHERE state='running' "
                "AND supervisor_pid IS NULL AND backend=? AND cancel_requested=0",
                (backend,),
            ).fetchall()
        return self.db.execute(
            "SELECT id, started, inline FROM jobs WHERE state='running' AND supervisor_pid IS NULL "
            "AND uid=? AND backend=? AND cancel_requested=0",
            (uid, backend),
        ).fetchall()

    # -- state machine ------------------------------------------------------------------

    def transition(
        self,
        job_id: str,
        to_state: str,
        reason: str = "",
        *,
        expect: Iterable[str] | None = None,
        **columns: Any,
    ) -> JobInfo:
        """Move a job to ``to_state`` in one transaction (``IllegalTransition`` if not allowed)."""
        with self.transaction() as db:
            self.transition_in(db, job_id, to_state, reason, expect=expect, **columns)
        return self.get(job_id)

    def transition_in(
        self,
        db: sqlite3.Connection,
        job_id: str,
        to_state: str,
        reason: str = "",
        *,
        expect: Iterable[str] | None = None,
        now: float | None = None,
        event_data: dict[str, Any] | None = None,
        **columns: Any,
    ) -> str:
        """The same, inside an open transaction; returns the previous state.

        A job that reaches a final state can never run again: its payload goes.
        """
        row = db.execute("SELECT state, files FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        current = row[0]
        if expect is not None and current not in set(expect):
            raise IllegalTransition(
                f"job {job_id} is {current}, expected {' or '.join(expect)} for -> {to_state}"
            )
        if to_state not in TRANSITIONS[current]:
            raise IllegalTransition(f"job {job_id}: {current} -> {to_state} is not allowed")
        columns["state"] = to_state
        columns["reason"] = reason
        self._update(db, job_id, columns)
        self._event(db, job_id, current, to_state, reason, now=now, data=event_data)
        if to_state in TERMINAL:
            self._drop_files(db, row[1])
        return current

    def finish_run(
        self,
        db: sqlite3.Connection,
        job: JobInfo,
        end: RunEnd,
        now: float | None = None,
        **columns: Any,
    ) -> str:
        """Record how a run of ``job`` ended, by the one rule (``schema.end_of_run``), inside
        an open transaction; ``columns`` adds what the runner measured. Returns the state
        the job moved to (``IllegalTransition`` if it is no longer running)."""
        now = time.time() if now is None else now
        if job.max_gpus is not None:  # a resize asked for while it ran: read it now
            asked = db.execute("SELECT resize_to FROM jobs WHERE id=?", (job.id,)).fetchone()
            job = dataclasses.replace(job, resize_to=asked[0] if asked else None)
        to, why, ruled = end_of_run(job, end, now)
        self.transition_in(db, job.id, to, why, expect=["running"], now=now, **{**ruled, **columns})
        return to

    def claim(self, job: JobInfo, lease_ttl: float) -> JobInfo | None:
        """Take an allocated job for this process: the one claim every runner makes.

        Only one claimant wins (the job must still be ``running``, unclaimed and
        on the same attempt); the winner holds a lease of ``lease_ttl`` seconds.
        """
        with self.transaction() as db:
            claimed = db.execute(
                "UPDATE jobs SET supervisor_pid=?, host=?, lease_expires=? "
                "WHERE id=? AND state='running' AND supervisor_pid IS NULL AND attempts=?",
                (os.getpid(), socket.gethostname(), time.time() + lease_ttl, job.id, job.attempts),
            ).rowcount
        return self.get(job.id) if claimed else None

    # -- steering and leases, inside a caller's transaction --------------------------------

    @staticmethod
    def request_cancel(db: sqlite3.Connection, job_id: str) -> None:
        """Ask the supervisor of a running job to cancel it."""
        db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))

    def set_priority(self, job_id: str, priority: int) -> None:
        """Change a job's priority and record it as an event (``JobNotFound`` for a bad id)."""
        with self.transaction() as db:
            row = self.state_and_priority(db, job_id)
            if row is None:
                raise JobNotFound(job_id)
            if row[0] in TERMINAL:
                # a finished job's record is what happened; a new priority would rewrite it
                raise IllegalTransition(
                    f"job {job_id} already {row[0]}: a finished job's priority cannot change; "
                    f"`dlsched requeue {job_id}` (dls.requeue) runs it again as a new job"
                )
            db.execute("UPDATE jobs SET priority=? WHERE id=?", (priority, job_id))
            self._event(db, job_id, row[0], row[0], f"priority {row[1]} -> {priority}")

    @staticmethod
    def set_waiting_reason(db: sqlite3.Connection, job_id: str, words: str) -> None:
        """Say why a job still waits, if it still does."""
        db.execute(
            "UPDATE jobs SET waiting=? WHERE id=? AND state IN ('queued','preempted')",
            (words, job_id),
        )

    @staticmethod
    def claim_running(
        db: sqlite3.Connection, job_id: str, pid: int, host: str, until: float
    ) -> bool:
        """Take an allocated, unclaimed job for process ``pid`` on ``host``, leased until
        ``until`` (any attempt: an inline cell's); whether this claim won."""
        return bool(
            db.execute(
                "UPDATE jobs SET supervisor_pid=?, host=?, lease_expires=? "
                "WHERE id=? AND state='running' AND supervisor_pid IS NULL",
                (pid, host, until, job_id),
            ).rowcount
        )

    @staticmethod
    def take_over(db: sqlite3.Connection, job_id: str, pid: int, until: float, now: float) -> bool:
        """Make ``pid`` the follower of an unfinished job nobody alive follows (no follower,
        already ``pid``, or a lease that ran out before ``now``); whether it did."""
        return bool(
            db.execute(
                "UPDATE jobs SET supervisor_pid=?, lease_expires=? WHERE id=? AND "
                "state IN ('queued','preempted','running') AND (supervisor_pid IS NULL "
                "OR supervisor_pid=? OR lease_expires IS NULL OR lease_expires < ?)",
                (pid, until, job_id, pid, now),
            ).rowcount
        )

    @staticmethod
    def renew_lease(db: sqlite3.Connection, job_id: str, pid: int, until: float) -> bool:
        """Extend the lease ``pid`` holds on a running job; False when it was taken back."""
        return bool(
            db.execute(
                "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' "
                "AND supervisor_pid=?",
                (until, job_id, pid),
            ).rowcount
        )

    def set_live_usage(self, job_id: str, pid: int, cpu: float, rss: int) -> None:
        """What a running job uses now (CPU percent of one core, bytes resident), written by
        its supervisor ``pid``; a job that ended meanwhile keeps its cleared columns."""
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET cpu_now=?, rss_now=? WHERE id=? AND state='running' "
                "AND supervisor_pid=?",
                (cpu, rss, job_id, pid),
            )

    @staticmethod
    def renew_leases(
        db: sqlite3.Connection, job_ids: Iterable[str], pid: int, until: float
    ) -> None:
        """Extend the leases ``pid`` holds on these running jobs (those it still holds)."""
        db.executemany(
            "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' AND supervisor_pid=?",
            [(until, job_id, pid) for job_id in job_ids],
        )

    @staticmethod
    def renew_attempt_lease(
        db: sqlite3.Connection, job_id: str, attempts: int, pid: int, until: float
    ) -> None:
        """Extend the lease ``pid`` holds on attempt ``attempts`` of a running job."""
        db.execute(
            "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' "
            "AND supervisor_pid=? AND attempts=?",
            (until, job_id, pid, attempts),
        )

    @staticmethod
    def set_leases(db: sqlite3.Connection, job_ids: Iterable[str], pid: int, until: float) -> None:
        """Set the lease of the jobs ``pid`` follows, in any state, to ``until`` (a time
        past hands them back at once)."""
        db.executemany(
            "UPDATE jobs SET lease_expires=? WHERE id=? AND supervisor_pid=?",
            [(until, job_id, pid) for job_id in job_ids],
        )

    @staticmethod
    def record_job_process(
        db: sqlite3.Connection,
        job_id: str,
        attempts: int,
        supervisor_pid: int,
        job_pid: int,
        host: str,
    ) -> None:
        """Record where attempt ``attempts`` of a running job runs, if ``supervisor_pid``
        still holds it."""
        db.execute(
            "UPDATE jobs SET job_pid=?, host=? WHERE id=? AND state='running' "
            "AND supervisor_pid=? AND attempts=?",
            (job_pid, host, job_id, supervisor_pid, attempts),
        )

    def update(self, job_id: str, **columns: Any) -> None:
        """Change columns that are not the state (lease, progress, pids)."""
        with self.transaction() as db:
            self._update(db, job_id, columns)

    @staticmethod
    def _update(db: sqlite3.Connection, job_id: str, columns: dict[str, Any]) -> None:
        if not columns:
            return
        encoded = {}
        for key, value in columns.items():
            if key not in _JOB_COLUMNS:
                raise KeyError(f"unknown job column {key!r}")
            if key == "placement" and isinstance(value, Placement):
                value = json.dumps(value.to_json())
            elif key in ("progress", "env") and isinstance(value, dict):
                value = json.dumps(value)
            elif key == "after" and not isinstance(value, str):
                value = json.dumps(list(value))
            elif isinstance(value, bool):
                value = int(value)
            encoded[key] = value
        sets = ", ".join(f"{k}=?" for k in encoded)
        db.execute(f"UPDATE jobs SET {sets} WHERE id=?", [*encoded.values(), job_id])

    @staticmethod
    def _event(
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
        rows = self.db.execute(sql, args)
        return [{**dict(r), "data": json.loads(r["data"]) if r["data"] else None} for r in rows]

    def last_event_seq(self, db: sqlite3.Connection | None = None) -> int:
        """The newest event's number (0 for none): it changes with every state change.

        With ``db``, it is read inside that open transaction."""
        db = self.db if db is None else db
        rows = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchall()
        return int(rows[0][0])

    def state_changes_since(self, seq: int, limit: int = -1) -> list[sqlite3.Row]:
        """``(seq, job_id, to_state)`` of every event after ``seq`` (the first ``limit``;
        -1: all), oldest first."""
        return self.db.execute(
            "SELECT seq, job_id, to_state FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit),
        ).fetchall()

    # -- staged inputs and the cache (see ``staging/``) --------------------------------

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
        rows = self.db.execute("SELECT * FROM stagings WHERE source_id=?", (source_id,))
        return rows.fetchone()

    def claim_staging(self, source_id: str, attempt: int, lease_ttl: float) -> float | None:
        """Take an armed staging for this process (one claimant wins); returns the claim time."""
        now = time.time()
        with self.transaction() as db:
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
        with self.transaction() as db:
            kept = db.execute(
                "UPDATE stagings SET lease_expires=?, done_bytes=?, total_bytes=?, rate=?, note=? "
                "WHERE source_id=? AND stager_pid=?",
                (time.time() + lease_ttl, done, total, rate, note, source_id, os.getpid()),
            ).rowcount
            if kept:
                by_job: dict[str, list[sqlite3.Row]] = {}
                for row in self.waiting_inputs(db, source_id):
                    by_job.setdefault(row["job_id"], []).append(row)
                db.executemany(
                    "UPDATE jobs SET waiting=? WHERE id=?",
                    [(words(rows), job_id) for job_id, rows in by_job.items()],
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
        with self.transaction() as db:
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
            self._count(db, hits=hits, misses=1 if entry is not None else 0)
            for r in rows:
                self._event(db, r["job_id"], r["state"], r["state"], reason(r["name"]), now=now)
            db.execute(
                "UPDATE stagings SET stager_pid=NULL, lease_expires=NULL, note=NULL "
                "WHERE source_id=?",
                (source_id,),
            )
        return [r["job_id"] for r in rows]

    def fail_staging(
        self, source_id: str, *, since: float, reason: Callable[[str], str]
    ) -> list[str]:
        """Fail the waiting jobs (submitted before ``since``) that need this source."""
        now = time.time()
        with self.transaction() as db:
            if not self._holds_staging(db, source_id):
                return []
            rows = db.execute(
                "SELECT DISTINCT ji.job_id, ji.name FROM job_inputs ji "
                "JOIN jobs j ON j.id = ji.job_id WHERE ji.source_id=? AND ji.key IS NULL "
                "AND ji.added <= ? AND j.state IN ('queued','preempted')",
                (source_id, since),
            ).fetchall()
            failed: list[str] = []
            for r in rows:
                if r["job_id"] in failed:
                    continue
                self.transition_in(
                    db,
                    r["job_id"],
                    "failed",
                    reason(r["name"]),
                    now=now,
                    finished=now,
                    position=None,
                    waiting=None,
                )
                failed.append(r["job_id"])
            db.execute(
                "UPDATE stagings SET stager_pid=NULL, lease_expires=NULL WHERE source_id=?",
                (source_id,),
            )
        return failed

    def release_staging(self, source_id: str) -> None:
        """Give a claimed staging back unfinished (it is armed again by the next tick)."""
        with self.transaction() as db:
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

    def _count(self, db: sqlite3.Connection, **increments: int) -> None:
        row = db.execute("SELECT value FROM meta WHERE key='cache_counters'").fetchone()
        counters = json.loads(row[0]) if row else {}
        for name, n in increments.items():
            counters[name] = counters.get(name, 0) + n
        db.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES('cache_counters', ?)",
            (json.dumps(counters),),
        )

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
        return self.db.execute("SELECT * FROM cache_entries WHERE key=?", (key,)).fetchone()

    _REFERENCED = (
        "EXISTS(SELECT 1 FROM job_inputs ji JOIN jobs j ON j.id = ji.job_id "
        "WHERE ji.key = c.key AND j.state IN ('queued','running','preempted'))"
    )

    def cache_entries(self) -> list[dict[str, Any]]:
        """Every cache entry, least recently used first, with ``in_use`` (unfinished jobs)."""
        rows = self.db.execute(
            f"SELECT c.*, {self._REFERENCED} AS in_use FROM cache_entries c ORDER BY last_used"
        )
        return [{**dict(r), "in_use": bool(r["in_use"])} for r in rows]

    def drop_cache_entry(self, key: str) -> bool:
        """Forget an entry no unfinished job uses (False if one does, or it is gone)."""
        with self.transaction() as db:
            dropped = db.execute(
                f"DELETE FROM cache_entries AS c WHERE key=? AND NOT {self._REFERENCED}", (key,)
            ).rowcount
            if dropped:
                self._count(db, evictions=1)
        return bool(dropped)

    def cache_counters(self) -> dict[str, int]:
        """Hits, misses and evictions since the ledger was created."""
        counters = self.get_meta("cache_counters", {}) or {}
        return {k: int(counters.get(k, 0)) for k in ("hits", "misses", "evictions")}

    def active_stagings(self) -> list[sqlite3.Row]:
        """Stagings a stager works on now (or is about to), with their progress."""
        return self.db.execute(
            "SELECT * FROM stagings WHERE lease_expires IS NOT NULL ORDER BY started"
        ).fetchall()

    def job_data_paths(self, job_id: str) -> dict[str, str]:
        """``name -> local path`` of a job's staged inputs."""
        rows = self.db.execute(
            "SELECT ji.name, c.path FROM job_inputs ji JOIN cache_entries c ON c.key = ji.key "
            "WHERE ji.job_id=?",
            (job_id,),
        )
        return {r[0]: r[1] for r in rows}

    # -- utilisation samples -------------------------------------------------------------

    def add_samples(self, rows: Iterable[tuple[float, str, Any, Any, Any, Any]]) -> None:
        """Rows of ``(time, source, util, mem_used, mem_total, data-dict-or-None)``."""
        encoded = [
            (t, src, util, used, total, json.dumps(data) if data is not None else None)
            for t, src, util, used, total, data in rows
        ]
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO samples(time, source, util, mem_used, mem_total, data) "
                "VALUES(?,?,?,?,?,?)",
                encoded,
            )

    def samples(self, since: float = 0.0, until: float | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM samples WHERE time >= ?", [since]
        if until is not None:
            sql += " AND time <= ?"
            args.append(until)
        rows = self.db.execute(sql + " ORDER BY time", args)
        return [{**dict(r), "data": json.loads(r["data"]) if r["data"] else None} for r in rows]

    def thinned_samples(
        self, since: float, until: float, source: str | None, max_rows: int
    ) -> list[dict[str, Any]]:
        """Rows in ``[since, until]`` of ``source`` (and its parts, ``gpu0:...``) or of all
        sources, each source thinned evenly to about ``max_rows``, in time order.

        Filtering and thinning happen in SQLite, so a day of 1 s history is never
        loaded to answer for a sparkline.
        """
        where = "time >= ? AND time <= ?"
        args: list[Any] = [since, until]
        if source:
            where += " AND (source = ? OR source LIKE ?)"
            args += [source, source.replace("%", "").replace("_", "") + ":%"]
        db = self.db
        count = int(db.execute(f"SELECT COUNT(*) FROM samples WHERE {where}", args).fetchone()[0])
        stride = max(1, -(-count // max_rows))
        rows = db.execute(
            f"""SELECT time, source, util, mem_used, mem_total, data FROM (
                    SELECT *, ROW_NUMBER() OVER (PARTITION BY source ORDER BY time) - 1 AS n
                    FROM samples WHERE {where}
                ) WHERE n % ? = 0 ORDER BY time""",
            [*args, stride],
        )
        return [
            {
                "time": r[0],
                "source": r[1],
                "util": r[2],
                "mem_used": r[3],
                "mem_total": r[4],
                "data": json.loads(r[5]) if r[5] else None,
            }
            for r in rows
        ]

    def prune_samples(self, older_than: float) -> int:
        with self.transaction() as db:
            return db.execute("DELETE FROM samples WHERE time < ?", (older_than,)).rowcount

    def integrity_check(self) -> str:
        return str(self.db.execute("PRAGMA integrity_check").fetchone()[0])

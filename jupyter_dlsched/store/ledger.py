"""The ledger's file and its connections: opening (private folder, migrations), one
``BEGIN IMMEDIATE`` transaction per change, the meta table, the disk reserve.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..vocab import private
from ..vocab.errors import LedgerUnavailable
from ..vocab.migrations import MIGRATIONS
from ..vocab.private import default_home
from ..vocab.units import parse_duration

#: What a tick reads of each active job: the policy's inputs, and the columns it compares
#: before rewriting a job's place in the queue.
_SNAPSHOT_COLUMNS = (
    "id, seq, name, state, submitted, started, priority, owner, deadline, time_limit, preemptible, "
    "attained, preemptions, gpus, gpu_mem, cpus, mem, after, attempts, position, waiting, "
    "placement, job_pid, preempt_requested, cancel_requested, max_gpus, asked_gpus,"
    " resize_to, begin,"
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


def inventory_key(backend: str) -> str:
    """The meta key of a backend's pool shape: ``inventory`` for this machine's,
    ``inventory:<backend>`` for a cluster's (``ray``, ``slurm``)."""
    return "inventory" if backend == "local" else f"inventory:{backend}"


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
    from ..vocab.units import format_size

    return f"{format_size(_free_bytes(folder))} free in {folder}"


def _out_of_space(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "disk is full" in str(error)


class Ledger:
    """The ledger's file: its connections (one per thread), its transactions, its schema,
    the ``meta`` table and the disk reserve. Every other part of ``Store`` holds this one
    and writes through its ``transaction``."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home).expanduser() if home is not None else default_home()
        private.secure_folder(self.home)
        self.spool_root = private.private_subfolder(self.home / "spool")
        self.path = self.home / "ledger.sqlite"
        self._held: int | None = None  # the ledger's file, once ``removed`` holds it open
        for suffix in ("", "-wal", "-shm"):
            # SQLite gives its -wal and -shm files the ledger's own mode (0600)
            path = self.path.with_name(self.path.name + suffix)
            if suffix == "" or os.path.lexists(path):
                private.create_private(path)
        self._local = threading.local()
        self.reserve = Reserve(self.home / RESERVE_NAME)
        self.reserve.refill()
        self._migrate()

    def identity(self) -> str:
        """The ledger file this process holds (``removed``), as ``device:inode``; '' where it
        was gone before it could be held. A client compares it with the file at its path
        (``path_identity``): an agent still serving a removed ledger says another."""
        self.removed()
        return "" if self._held is None else _identity(os.fstat(self._held))

    def path_identity(self) -> str:
        """The ledger file now at this ledger's path, as ``device:inode`` ('' if none); a
        stat, not an open (closing a descriptor of a SQLite file drops its locks)."""
        try:
            return _identity(os.stat(self.path))
        except OSError:
            return ""

    def removed(self) -> bool:
        """Whether this ledger's file has been removed (its state folder deleted), even where
        a new ledger has been made at its path since (by an agent still running): the file
        first seen here is held open, so no new file can take its inode, and its link count
        says whether it is still there."""
        fd = self._held
        if fd is None:
            try:
                self._held = fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return True
        try:
            return os.fstat(fd).st_nlink == 0
        except OSError:
            return False

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

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, key: str, value: Any) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, json.dumps(value))
            )

    def integrity_check(self) -> str:
        return str(self.db.execute("PRAGMA integrity_check").fetchone()[0])

    @staticmethod
    def count(db: sqlite3.Connection, **increments: int) -> None:
        """Add to the ledger's counters (``meta`` key ``cache_counters``), inside ``db``'s
        open transaction."""
        row = db.execute("SELECT value FROM meta WHERE key='cache_counters'").fetchone()
        counters = json.loads(row[0]) if row else {}
        for name, n in increments.items():
            counters[name] = counters.get(name, 0) + n
        db.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES('cache_counters', ?)",
            (json.dumps(counters),),
        )


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"

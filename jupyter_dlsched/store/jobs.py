"""Jobs: inserting them (their files content-addressed in ``blobs``), the spool, the state
machine (``transition``) and steering (cancel, priority, requeue); reading them is
``job_reads``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound, UnsafeStateFolder
from ..vocab.every import parse_every
from ..vocab.resources import Placement
from ..vocab.schema import (
    _ID,
    _ID_ALPHABET,
    _JOB_COLUMNS,
    TERMINAL,
    TRANSITIONS,
    WAITING,
    JobInfo,
    source_id,
)
from ..vocab.spec import JobSpec
from ..vocab.units import format_duration
from .buffers import FILE_PREFIX, buffer_files, buffer_folder, file_size
from .events import EventLog
from .job_reads import JobReads
from .ledger import Ledger, _keep_or_default
from .payloads import Payloads
from .schedules import Timetable
from .staging import DataCache


class Lifecycle:
    """A job's life in the ``jobs`` table, ``store.lifecycle``: inserted with its files,
    moved through the state machine (``transition_in``, the one writer of ``state``),
    steered (cancel, priority), requeued; and its spool folder. What it stores beside the
    row goes through the part that owns it: ``payloads`` (its files), ``timetable`` (an
    ``--every``), ``cache`` (its staged inputs), ``event_log``."""

    def __init__(
        self,
        ledger: Ledger,
        event_log: EventLog,
        payloads: Payloads,
        timetable: Timetable,
        cache: DataCache,
        reads: JobReads,
    ) -> None:
        self.ledger = ledger
        self.event_log = event_log
        self.payloads = payloads
        self.timetable = timetable
        self.cache = cache
        self.reads = reads

    #: what a job asked for and what it runs: copied to the new job of a requeue
    _SPEC_COLUMNS = (
        "name, kind, owner, uid, origin, priority, gpus, gpu_mem, cpus, mem, deadline, "
        "time_limit, retries, preemptible, distributed, after, backend, env, inline, files, "
        "stage_in, max_gpus, asked_gpus"
    )

    def spool(self, job_id: str) -> Path:
        """The job's folder for payload, log and result (``JobNotFound`` for a bad id)."""
        if not isinstance(job_id, str) or not _ID.match(job_id):
            raise JobNotFound(job_id)
        return self.ledger.spool_root / job_id

    def make_spool(self, job_id: str, owner: int | None = None) -> Path:
        """Create the job's folder (0700, ours, not a link) before a run writes into it.

        ``owner``: a shared pool's service makes the folder the job owner's own.
        """
        return private.private_subfolder(self.spool(job_id), owner)

    def read_spool_file(self, job_id: str, name: str) -> bytes | None:
        """A file the job's run left (``result.pkl``, ``error.json``), checked before trusting it:
        a regular file of ours, not a link, that no other user can write."""
        return private.read_file(self.spool(job_id) / name)

    def _buffer_files(self, files: dict[str, bytes], uid: int) -> dict[str, int]:
        """The buffer files a job's payload names and their sizes, each checked to be a file
        of its submitter's, named by a digest, in the submitter's buffer folder (found by
        its name, wherever their ``DLSCHED_BUFFERS`` put it). The ledger deletes what it
        counts; a shared pool's service only in a folder of that user's
        (``buffers.remove_files``)."""
        data = files.get("payload.pkl")
        named = buffer_files(data) if data is not None else {}
        folder = buffer_folder(self.ledger.home, uid).name
        sizes = {}
        for path in named:
            parent, _, name = path.rpartition("/")
            digest = len(name) == 64 and set(name) <= set("0123456789abcdef")
            try:
                if Path(parent).name != folder or not digest:
                    raise ValueError(path)
                sizes[path] = file_size(path, uid)  # counted as it is, not as claimed
            except (OSError, ValueError, UnsafeStateFolder):
                from ..vocab.errors import SpecError

                raise SpecError(
                    "payload.pkl",
                    path,
                    f"a data file of the submitter's in a folder named {folder}",
                ) from None
        return sizes

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
        return self.reads.get(job_id)

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
        carried: list[int] = []  # each job's input bytes
        # addressed by content within one user's blobs: what a user stores is theirs alone
        # (their quota), and nobody else's job can keep it alive
        salt = f"{uid}:".encode()
        # big buffers stay in their files (``buffers.py``): each is named and counted here
        # as a blob is, by its path, and deleted by the same rule
        outside: dict[str, int] = {}
        for _, _, files in jobs:
            refs = {}
            carried.append(sum(len(data) for data in files.values()))
            for name, data in files.items():
                digest = hashlib.sha256(salt + data).hexdigest()
                blobs[digest] = data
                counts[digest] = counts.get(digest, 0) + 1
                refs[name] = digest
            for path, size in self._buffer_files(files, uid).items():
                key = FILE_PREFIX + path
                outside[key] = size
                counts[key] = counts.get(key, 0) + 1
                refs[key] = key
                carried[-1] += size
            names.append(json.dumps(refs))
        with self.ledger.transaction() as db:
            if clock:
                # submit order and submit times agree (the clock read before the write lock,
                # or stepped back): a deep queue's lanes rely on it (engine.queue_index.QueueIndex)
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
                from ..vocab.errors import SpecError

                raise SpecError("after", missing[0], "the id of a job in this ledger")
            self.payloads.store_blobs(db, blobs, counts, outside, uid)
            db.executemany(
                """INSERT INTO jobs(id, name, kind, owner, uid, origin, state, priority,
                   gpus, gpu_mem, cpus, mem, deadline, time_limit, retries, preemptible,
                   distributed, after, backend, submitted, env, inline, files, stage_in,
                   max_gpus, asked_gpus, begin, input_bytes)
                   VALUES(?,?,?,?,?,?,'queued',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
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
                        spec.asked_gpus,
                        spec.begin,
                        size,
                    )
                    for (job_id, spec, _), refs, size in zip(jobs, names, carried, strict=True)
                ],
            )
            for job_id, spec, _ in jobs:
                if spec.every is not None:
                    self.timetable.add(
                        db,
                        job_id,
                        spec.every,
                        parse_every(spec.every).next_after(max(now, spec.begin or now)),
                        owner,
                        uid,
                        now,
                    )
            self.cache.add_inputs(
                db,
                [
                    (job_id, name, source, source_id(uid, source), now)
                    for job_id, spec, _ in jobs
                    for name, source in spec.stage_in.items()
                ],
            )
            self.event_log.record_submits(db, [job_id for job_id, _, _ in jobs], now)

    def requeue(self, job_id: str, now: float | None = None) -> JobInfo:
        """A new queued job with the spec of finished job ``job_id`` (what it runs, what it
        needs, its name and owner), linked to it by ``requeue_of``; an event on the old job
        names the new one. ``IllegalTransition`` for a job that has not ended."""
        now = time.time() if now is None else now
        new_id = self.new_id()
        self.spool(new_id)
        with self.ledger.transaction() as db:
            row = self.reads.state_and_priority(db, job_id)
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
                from ..vocab.errors import SpecError

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
            if not self.payloads.keep_for_requeue(db, files):
                from ..vocab.errors import SpecError

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
            self.cache.copy_inputs(db, job_id, new_id, now)
            self.event_log.record(
                db, new_id, None, "queued", f"submitted: requeue of {job_id}", now
            )
            self.event_log.record(db, job_id, row[0], row[0], f"requeued as {new_id}", now)
        return self.reads.get(new_id)

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
        with self.ledger.transaction() as db:
            self.transition_in(db, job_id, to_state, reason, expect=expect, **columns)
        return self.reads.get(job_id)

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
        self.write_columns(db, job_id, columns)
        self.event_log.record(db, job_id, current, to_state, reason, now=now, data=event_data)
        if to_state in TERMINAL:
            self.payloads.drop_files(db, row[1])
        return current

    @staticmethod
    def request_cancel(db: sqlite3.Connection, job_id: str) -> None:
        """Ask the supervisor of a running job to cancel it."""
        db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=?", (job_id,))

    def cancel(self, job_id: str, *, unsupervised_ends: bool, now: float | None = None) -> None:
        """Cancel a job in one transaction: a waiting one ends now; a running one is asked
        to stop (its supervisor or backend ends it), or ends now when nobody supervises it
        and ``unsupervised_ends`` (a local job allocated but not claimed yet). Works on a
        full disk (the ledger's reserve); ``JobNotFound`` for a bad id."""
        now = time.time() if now is None else now
        with self.ledger.transaction(cancel=True) as db:
            row = self.reads.state_and_supervisor(db, job_id)
            if row is None:
                raise JobNotFound(job_id)
            state, supervisor = row
            if state in WAITING or (
                state == "running" and supervisor is None and unsupervised_ends
            ):
                self.transition_in(
                    db, job_id, "cancelled", "cancelled by user", now=now, finished=now
                )
            elif state == "running":
                self.request_cancel(db, job_id)

    def cancel_unlaunched(self, job_id: str, now: float | None = None) -> bool:
        """Cancel a job the queue allocated that no runner has launched (nobody holds it):
        nothing runs, so it ends here. False when it was launched, or does not run."""
        now = time.time() if now is None else now
        with self.ledger.transaction(cancel=True) as db:
            row = self.reads.state_and_supervisor(db, job_id)
            if row is None or row[0] != "running" or row[1] is not None:
                return False
            self.transition_in(db, job_id, "cancelled", "cancelled by user", now=now, finished=now)
        return True

    def set_priority(self, job_id: str, priority: int) -> None:
        """Change a job's priority and record it as an event (``JobNotFound`` for a bad id)."""
        with self.ledger.transaction() as db:
            row = self.reads.state_and_priority(db, job_id)
            if row is None:
                raise JobNotFound(job_id)
            if row[0] in TERMINAL:
                # a finished job's record is what happened; a new priority would rewrite it
                raise IllegalTransition(
                    f"job {job_id} already {row[0]}: a finished job's priority cannot change; "
                    f"`dlsched requeue {job_id}` (dls.requeue) runs it again as a new job"
                )
            db.execute("UPDATE jobs SET priority=? WHERE id=?", (priority, job_id))
            self.event_log.record(db, job_id, row[0], row[0], f"priority {row[1]} -> {priority}")

    def update(self, job_id: str, **columns: Any) -> None:
        """Change columns that are not the state (lease, progress, pids)."""
        with self.ledger.transaction() as db:
            self.write_columns(db, job_id, columns)

    @staticmethod
    def write_columns(db: sqlite3.Connection, job_id: str, columns: dict[str, Any]) -> None:
        """Write ``columns`` of one job (JSON for a placement, progress, env, after), inside
        ``db``'s open transaction; ``KeyError`` for a column the table does not have."""
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

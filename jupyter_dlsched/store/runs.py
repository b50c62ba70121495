"""Runs and their leases: one claim (``Store.claim``) that hands the winner a ``Lease``,
which it renews and ends its run with (``Lease.finish``, by the one rule: ``finish_run``);
live usage, the job's process, and what remote monitors (Ray, SLURM) follow.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ..vocab.errors import IllegalTransition
from ..vocab.resources import Placement
from ..vocab.schema import HELD_GRANT, WAITING, JobInfo, RunEnd, end_of_run
from .buffers import buffer_folder
from .job_reads import JobReads
from .jobs import Lifecycle
from .ledger import Ledger
from .results import discard, result_bytes, result_name

#: A run's renewal: the job still runs, held by this process (on this attempt, if the
#: lease names one).
_RENEW_RUN = (
    "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' AND supervisor_pid=? "
    "AND (? IS NULL OR attempts=?)"
)
#: A follower's renewal: held by this process, in whatever unfinished state the job is now.
_RENEW_FOLLOW = (
    "UPDATE jobs SET lease_expires=? WHERE id=? AND supervisor_pid=? "
    "AND state IN ('queued','preempted','running')"
)
#: A held grant's renewal: the job's result is recorded, its process still exits
#: (``Lease.finish(..., hold=True)``), and this process still holds it.
_RENEW_HOLD = f"UPDATE jobs SET lease_expires=? WHERE id=? AND supervisor_pid=? AND {HELD_GRANT}"


@dataclass(frozen=True)
class Lease:
    """A process's hold on one job, from ``Store.claim`` to the run's end: renewed before
    it runs out (or the reaper takes the job back), and what the run's end is ruled on.

    ``job``: the job as claimed. ``attempt``: the attempt held, or None for whichever
    runs (an inline cell's). ``host``: where the run is, None for a monitor that follows
    a job run elsewhere. ``follows``: held in any unfinished state, not only while the
    job runs (a monitor following a job through SLURM's queue).

        lease = store.claim(job, ttl)
        while lease is not None and lease.renew(time.time() + ttl):
            ...  # the run goes on; False: the allocation was taken back
        lease.finish(RunEnd("succeeded"))
    """

    job: JobInfo
    pid: int
    host: str | None
    attempt: int | None = None
    follows: bool = False
    store: Runs = field(repr=False, compare=False, kw_only=True)

    @property
    def job_id(self) -> str:
        return self.job.id

    def _renewal(self, until: float) -> tuple[str, tuple[Any, ...]]:
        if self.follows:
            return _RENEW_FOLLOW, (until, self.job.id, self.pid)
        return _RENEW_RUN, (until, self.job.id, self.pid, self.attempt, self.attempt)

    def renew(self, until: float, db: sqlite3.Connection | None = None) -> bool:
        """Extend this lease to ``until``; False when the job was taken back (it no longer
        runs, another process holds it, or it runs another attempt than this lease's).
        ``db``: an open transaction to write in; without one, a transaction of its own."""
        sql, args = self._renewal(until)
        if db is not None:
            return bool(db.execute(sql, args).rowcount)
        with self.store.ledger.transaction() as own:
            return bool(own.execute(sql, args).rowcount)

    @staticmethod
    def renew_all(
        leases: Sequence[Lease], until: float, db: sqlite3.Connection | None = None
    ) -> None:
        """Extend these leases of one holder to ``until``, those it still holds, each by
        the conditions ``renew`` checks; a time past hands them back at once (a monitor
        that stops following). One statement per kind of lease, however many there are.

            Lease.renew_all(held, time.time() + ttl)  # an inline runner's beat
        """
        if not leases:
            return
        if len({lease.pid for lease in leases}) > 1:
            raise ValueError("renew_all renews the leases of one holder at a time")
        if db is None:
            with leases[0].store.ledger.transaction() as own:
                Lease.renew_all(leases, until, own)
            return
        for follows in (False, True):
            kind = [lease._renewal(until) for lease in leases if lease.follows is follows]
            if kind:
                db.executemany(kind[0][0], [args for _, args in kind])

    def holds(self, db: sqlite3.Connection) -> bool:
        """Whether this lease's process still holds its job (on its attempt, if it names
        one), read inside the open transaction ``db``."""
        row = db.execute("SELECT attempts, supervisor_pid FROM jobs WHERE id=?", (self.job.id,))
        found = row.fetchone()
        return (
            found is not None
            and found[1] == self.pid
            and (self.attempt is None or found[0] == self.attempt)
        )

    def finish(
        self,
        end: RunEnd,
        now: float | None = None,
        db: sqlite3.Connection | None = None,
        *,
        hold: bool = False,
        **columns: Any,
    ) -> str:
        """Record how this lease's run ended, by the one rule (``Store.finish_run``), with
        what the runner measured (``columns``); the state the job moved to.
        ``IllegalTransition`` if the job no longer runs or this lease no longer holds it
        (a holder that stalled past its lease: the job was taken back, and may run again
        under another holder). ``db``: an open transaction to write in; without one, a
        transaction of its own.

        ``hold``: the job succeeded (its result is written) while its process still
        exits: the end is recorded now, for its client, and the lease goes on holding the
        job's grant (``HELD_GRANT``: its GPUs stay taken) until ``release`` after the
        exit, renewed by ``renew_held``, or until it lapses. Only a success is held.
        """
        if hold and end.outcome != "succeeded":
            raise ValueError(f"only a success holds its grant past its end, not {end.outcome!r}")
        if db is None:
            with self.store.ledger.transaction() as own:
                return self.finish(end, now, own, hold=hold, **columns)
        if not self.holds(db):
            raise IllegalTransition(f"job {self.job.id}: this process no longer holds its run")
        if hold:
            kept = db.execute("SELECT lease_expires FROM jobs WHERE id=?", (self.job.id,))
            columns["lease_expires"] = kept.fetchone()[0]
            if columns["lease_expires"] is None:  # nothing to hold the grant with
                raise IllegalTransition(f"job {self.job.id}: its run holds no lease")
        return self.store.finish_run(db, self.job, end, now, **columns)

    def renew_held(self, until: float) -> bool:
        """Extend the grant a held success keeps (``finish(..., hold=True)``) to ``until``;
        False when it lapsed and was released meanwhile."""
        with self.store.ledger.transaction() as db:
            return bool(db.execute(_RENEW_HOLD, (until, self.job.id, self.pid)).rowcount)

    def release(self, note: str = "") -> bool:
        """End the grant a held success kept (``finish(..., hold=True)``): its process has
        exited, and everything it started; ``note`` is added to its reason (what was
        killed once it had ended). False when the grant had lapsed meanwhile."""
        with self.store.ledger.transaction() as db:
            released = db.execute(
                "UPDATE jobs SET lease_expires=NULL, "
                "reason=CASE WHEN ?='' THEN reason WHEN reason='' THEN ? "
                "ELSE reason || '; ' || ? END "
                f"WHERE id=? AND supervisor_pid=? AND {HELD_GRANT}",
                (note, note, note, self.job.id, self.pid),
            ).rowcount
        return bool(released)

    # -- what a remote runner records (the Ray backend's monitor) ------------------------

    def record_process(self, job_pid: int, host: str) -> bool:
        """Record where this lease's run has its job process (a Ray worker's pid and
        node); False when the run was taken back meanwhile."""
        with self.store.ledger.transaction() as db:
            return bool(
                db.execute(
                    "UPDATE jobs SET job_pid=?, host=? WHERE id=? AND state='running' "
                    "AND supervisor_pid=? AND (? IS NULL OR attempts=?)",
                    (job_pid, host, self.job.id, self.pid, self.attempt, self.attempt),
                ).rowcount
            )

    def hand_back(self, reason: str, now: float | None = None) -> bool:
        """Give this lease's running job back to the queue without counting the attempt
        (its runner cannot keep it: the process that ran it on Ray exits); False when the
        run was taken back meanwhile."""
        with self.store.ledger.transaction() as db:
            row = self.store.run_holder(db, self.job.id)
            if row is None or row[0] != "running" or not self.holds(db):
                return False
            self.store.lifecycle.transition_in(
                db,
                self.job.id,
                "queued",
                reason,
                now=now,
                placement=None,
                supervisor_pid=None,
                job_pid=None,
                lease_expires=None,
                attempts=row[1] - 1,
            )
        return True

    # -- a follower's run: a job run through a queue of its own (SLURM's) ----------------

    def started(
        self, when: float, *, placement: Placement | None, host: str | None
    ) -> float | None:
        """The followed job started at ``when`` (on ``host``, with ``placement``): move it
        to ``running`` as its next attempt, never before it was submitted (a remote clock
        of whole seconds). The start time the ledger holds; None when this follower no
        longer holds the job. A job already running keeps its start."""
        with self.store.ledger.transaction() as db:
            row = self.store.run_holder(db, self.job.id)
            if row is None or row[2] != self.pid:
                return None
            if row[0] not in WAITING:
                began = db.execute("SELECT started FROM jobs WHERE id=?", (self.job.id,))
                return cast("float | None", began.fetchone()[0]) or when
            when = max(when, self.store.reads.submitted_at(db, self.job.id))
            self.store.lifecycle.transition_in(
                db,
                self.job.id,
                "running",
                "",
                now=when,
                placement=placement,
                started=when,
                attempts=row[1] + 1,
                host=host,
                job_pid=None,
                exit_code=None,
                term_signal=None,
                cancel_requested=0,
                position=None,
                waiting=None,
            )
        return when

    def end_followed(self, end: RunEnd, finished: float) -> str | None:
        """Record how the followed job ended, by the one rule; the state it moved to, or
        None when this follower no longer holds it. A job cancelled or failed while it
        still waited ends from the queue; one that ended before it was seen to start is
        started first (at its end: it ran for an unknown part of that)."""
        store = self.store
        with store.ledger.transaction() as db:
            row = store.run_holder(db, self.job.id)
            if row is None or row[2] != self.pid:
                return None
            state, attempts = row[0], row[1]
            if state != "running" and end.outcome in ("cancelled", "failed"):
                store.lifecycle.transition_in(
                    db,
                    self.job.id,
                    end.outcome,
                    end.reason,
                    now=finished,
                    finished=finished,
                    exit_code=end.exit_code,
                    term_signal=end.term_signal,
                    lease_expires=None,
                    supervisor_pid=None,
                )
                return end.outcome
            if state != "running":
                store.lifecycle.transition_in(
                    db,
                    self.job.id,
                    "running",
                    "",
                    now=finished,
                    started=finished,
                    attempts=attempts + 1,
                )
            job = store.reads.get(self.job.id)
            return store.finish_run(db, job, end, finished, supervisor_pid=None)


class Runs:
    """Runs of jobs, ``store.runs``: the one claim, which hands its winner a ``Lease``, and
    how a run ended (``finish_run``, by the one rule); what runners read and record of a
    run (who holds it, its live usage). It writes the ``jobs`` columns of a run's hold
    (``supervisor_pid``, ``host``, ``lease_expires``, ``job_pid``, live usage); a state
    change goes through ``lifecycle``."""

    def __init__(self, ledger: Ledger, lifecycle: Lifecycle, reads: JobReads) -> None:
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.reads = reads

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

    def run_requests(self, ids: Sequence[str]) -> list[sqlite3.Row]:
        """``(id, state, attempts, supervisor_pid, cancel_requested, preempt_requested)`` of
        these jobs: what a runner must carry out (cancels, preemptions, allocations lost)."""
        marks = ",".join("?" * len(ids))
        return self.ledger.db.execute(
            "SELECT id, state, attempts, supervisor_pid, cancel_requested, preempt_requested "
            f"FROM jobs WHERE id IN ({marks})",
            list(ids),
        ).fetchall()

    def followable_jobs(self, backend: str, uid: int) -> list[sqlite3.Row]:
        """``(id, inline, supervisor_pid, lease_expires)`` of this user's unfinished jobs on
        ``backend``: the ones a monitor may follow when nobody alive does."""
        return self.ledger.db.execute(
            "SELECT id, inline, supervisor_pid, lease_expires FROM jobs WHERE backend=? "
            "AND uid=? AND state IN ('queued','preempted','running')",
            (backend, uid),
        ).fetchall()

    def followed_jobs(self, ids: Sequence[str]) -> list[sqlite3.Row]:
        """``id, state, supervisor_pid, cancel_requested, priority, time_limit, started`` of
        the jobs a monitor follows: what the ledger asks of them now."""
        marks = ",".join("?" * len(ids))
        return self.ledger.db.execute(
            "SELECT id, state, supervisor_pid, cancel_requested, priority, time_limit, "
            f"started FROM jobs WHERE id IN ({marks})",
            list(ids),
        ).fetchall()

    def claim(
        self,
        job: JobInfo | str,
        lease_ttl: float,
        *,
        follow: bool = False,
        now: float | None = None,
        db: sqlite3.Connection | None = None,
    ) -> Lease | None:
        """Take a job for this process: the one claim every runner makes; the lease it
        holds for ``lease_ttl`` seconds, or None when another claimant won.

        A run's claim wins only on a job still ``running`` and unclaimed: given a
        ``JobInfo``, on the attempt it describes (a supervisor's, the Ray backend's);
        given a job id, on whichever attempt runs (an inline cell's thread, which made
        its job itself). ``follow``: a monitor takes over an unfinished job in any
        state that nobody alive follows (no follower, already this process, or a lease
        that ran out before ``now``), to follow it through a queue of its own (SLURM's).
        ``db``: an open transaction to claim in; without one, a transaction of its own.

            lease = store.claim(job, settings.lease_ttl)
            if lease is not None:
                lease.renew(time.time() + settings.lease_ttl)
        """
        now = time.time() if now is None else now
        job_id = job if isinstance(job, str) else job.id
        pid, until = os.getpid(), now + lease_ttl
        attempt = None if isinstance(job, str) or follow else job.attempts
        host = None if follow else socket.gethostname()
        if follow:
            sql = (
                "UPDATE jobs SET supervisor_pid=?, lease_expires=? WHERE id=? AND "
                "state IN ('queued','preempted','running') AND (supervisor_pid IS NULL "
                "OR supervisor_pid=? OR lease_expires IS NULL OR lease_expires < ?)"
            )
            args: tuple[Any, ...] = (pid, until, job_id, pid, now)
        else:
            sql = (
                "UPDATE jobs SET supervisor_pid=?, host=?, lease_expires=? WHERE id=? "
                "AND state='running' AND supervisor_pid IS NULL AND (? IS NULL OR attempts=?)"
            )
            args = (pid, host, until, job_id, attempt, attempt)
        if db is not None:
            claimed = db.execute(sql, args).rowcount
        else:
            with self.ledger.transaction() as own:
                claimed = own.execute(sql, args).rowcount
        if not claimed:
            return None
        return Lease(self.reads.get(job_id), pid, host, attempt, follow, store=self)

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
        the job moved to (``IllegalTransition`` if it is no longer running). A lease's
        holder ends its run with ``Lease.finish``; this is for those that hold none: the
        reaper, and a monitor that follows a job through SLURM."""
        now = time.time() if now is None else now
        if job.max_gpus is not None:  # a resize asked for while it ran: read it now
            asked = db.execute("SELECT resize_to FROM jobs WHERE id=?", (job.id,)).fetchone()
            job = dataclasses.replace(job, resize_to=asked[0] if asked else None)
        to, why, ruled = end_of_run(job, end, now)
        if to == "succeeded" and job.kind != "command":
            columns.setdefault("result_bytes", self._result_bytes(job))
        elif job.kind != "command":  # what a run killed while it wrote its result left
            discard(buffer_folder(self.ledger.home, job.uid), result_name(job.id, job.attempts))
        self.lifecycle.transition_in(
            db, job.id, to, why, expect=["running"], now=now, **{**ruled, **columns}
        )
        return to

    def _result_bytes(self, job: JobInfo) -> int | None:
        """The bytes of the result the job's attempt left, its buffers in its owner's
        buffer folder or already in its spool folder (``results.py``)."""
        return result_bytes(
            self.lifecycle.spool(job.id),
            buffer_folder(self.ledger.home, job.uid),
            result_name(job.id, job.attempts),
        )

    def set_live_usage(self, job_id: str, pid: int, cpu: float, rss: int) -> None:
        """What a running job uses now (CPU percent of one core, bytes resident), written by
        its supervisor ``pid``; a job that ended meanwhile keeps its cleared columns."""
        with self.ledger.transaction() as db:
            db.execute(
                "UPDATE jobs SET cpu_now=?, rss_now=? WHERE id=? AND state='running' "
                "AND supervisor_pid=?",
                (cpu, rss, job_id, pid),
            )

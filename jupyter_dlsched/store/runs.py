"""Runs and their leases: the supervisor's claim, lease renewals, live usage, the job's
process, and how a run ended (``finish_run``); what remote monitors (Ray, SLURM) follow.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..schema import (
    JobInfo,
    RunEnd,
    end_of_run,
)
from .jobs import Jobs


class Runs(Jobs):
    """The ledger's runs part of ``Store`` (see this module's docstring)."""

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

    def end_run(self, job: JobInfo, end: RunEnd, now: float | None = None, **columns: Any) -> str:
        """``finish_run`` in a transaction of its own, for a runner with nothing else to
        write with it (an inline job's thread); the state the job moved to."""
        with self.transaction() as db:
            return self.finish_run(db, job, end, now, **columns)

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

    def claim_inline_run(self, job_id: str, pid: int, host: str, until: float) -> bool:
        """``claim_running`` in a transaction of its own: an inline job's thread takes its
        job; whether this claim won."""
        with self.transaction() as db:
            return self.claim_running(db, job_id, pid, host, until)

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

    def renew_held_leases(self, job_ids: Iterable[str], pid: int, until: float) -> None:
        """``renew_leases`` in a transaction of its own (the inline runner's beat)."""
        with self.transaction() as db:
            self.renew_leases(db, job_ids, pid, until)

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

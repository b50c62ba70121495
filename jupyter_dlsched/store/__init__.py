"""The ledger: one SQLite database (WAL) plus a spool folder, shared by every participant.

Every state change is one short ``BEGIN IMMEDIATE`` transaction through the
state machine in ``schema.TRANSITIONS``; each is recorded in ``events``. What
a job runs is stored with its row (content-addressed ``blobs``); logs and
results live in ``spool/<job-id>/``. The folder is private to the user: see
``private`` for what is checked before anything in it is trusted.

The ledger is one ``Store`` composed of parts, each an object that owns its tables and
their SQL and holds, passed to it when it is made, the parts it uses (never a subclass of
another): ``ledger`` (the file, connections, transactions, migrations, ``meta``),
``event_log`` (``events``), ``payloads`` (``blobs``, ``blob_refs``: what jobs run, kept
while anyone may need it), ``timetable`` (``schedules``), ``reads`` (reading ``jobs``),
``lifecycle`` (writing ``jobs``: inserts, the state machine, steering; the spool),
``runs`` (claims, leases, how a run ended), ``queue`` (the tick's queries and a job's
place in line), ``cache`` (``job_inputs``, ``stagings``, ``cache_entries``) and
``usage`` (``samples``). ``Store`` makes them in that order. A job's whole life is asked
of ``Store``, which names, method by method, the part that answers (``store.get`` is
``store.reads.get``); the parts that serve one room are asked by name
(``store.queue.snapshot``, ``store.cache.finish_staging``, ``store.timetable``,
``store.usage``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..vocab.migrations import MIGRATIONS, SCHEMA_VERSION  # noqa: F401  (re-exported)
from ..vocab.schema import (  # noqa: F401  (the ledger's vocabulary, re-exported)
    _ID,
    _ID_ALPHABET,
    _JOB_COLUMNS,
    _SOURCE_ID,
    ACTIVE,
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
from .events import EventLog
from .job_reads import JobReads
from .jobs import Lifecycle
from .ledger import (  # noqa: F401  (its helpers, re-exported)
    _SNAPSHOT_COLUMNS,
    DEFAULT_PAYLOAD_KEEP,
    LAST_RESERVE_BYTES,
    LAST_RESERVE_NAME,
    PAYLOAD_KEEP_ENV,
    RESERVE_BYTES,
    RESERVE_NAME,
    Ledger,
    Reserve,
    _free_bytes,
    _free_words,
    _keep_or_default,
    _out_of_space,
    disk_full,
    inventory_key,
    payload_keep,
)
from .parts import Via
from .payloads import Payloads
from .queue import Queue
from .runs import Lease as Lease  # what a claim hands its winner
from .runs import Runs
from .samples import UsageHistory
from .schedules import Timetable
from .staging import DataCache


class Store:
    """The SQLite ledger and spool folder under ``home``, made of its parts (see this
    module's docstring).

    Connections are per thread; each state change is its own transaction.

    >>> store = Store("/tmp/dlsched-doc")  # doctest: +SKIP
    >>> store.jobs(states=["queued"])  # doctest: +SKIP
    []
    """

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.ledger = Ledger(home)
        self.event_log = EventLog(self.ledger)
        self.payloads = Payloads(self.ledger)
        self.timetable = Timetable(self.ledger, self.payloads)
        self.reads = JobReads(self.ledger)
        self.queue = Queue(self.ledger, self.event_log)
        self.cache = DataCache(self.ledger, self.event_log, self.queue)
        self.lifecycle = Lifecycle(
            self.ledger, self.event_log, self.payloads, self.timetable, self.cache, self.reads
        )
        self.runs = Runs(self.ledger, self.lifecycle, self.reads)
        self.usage = UsageHistory(self.ledger)
        self.home = self.ledger.home
        self.path = self.ledger.path
        self.spool_root = self.ledger.spool_root
        self.reserve = self.ledger.reserve

    @property
    def db(self) -> sqlite3.Connection:
        """This thread's connection to the ledger (``ledger.db``)."""
        return self.ledger.db

    # -- what only the parts together do: one transaction over two of them ----------------

    def fail_staging(self, source: str, *, since: float, reason: Callable[[str], str]) -> list[str]:
        """Fail the waiting jobs (submitted before ``since``) that need ``source`` (a
        source id), whose staging this process holds and failed: the cache ends the staging, the lifecycle
        moves each job to ``failed``, in one transaction; the jobs failed."""
        now = time.time()
        with self.ledger.transaction() as db:
            needing = self.cache.give_up_staging(db, source, since=since)
            for job_id, name in needing or ():
                self.lifecycle.transition_in(
                    db,
                    job_id,
                    "failed",
                    reason(name),
                    now=now,
                    finished=now,
                    position=None,
                    waiting=None,
                )
        return [job_id for job_id, _ in needing or ()]

    # -- the parts' methods callers reach through ``Store`` --------------------------------
    # A job's whole life is asked of ``Store``: each line names the part that answers (a
    # method with ``**columns`` is written out: a typed delegate cannot take one). The
    # parts that serve one room are asked by name: ``store.queue`` (the engine's tick),
    # ``store.cache`` (``staging/``), ``store.timetable`` (``schedules/``), ``store.usage``
    # (utilisation history).

    # ledger: the file, its transactions, ``meta``
    transaction = Via("ledger", Ledger.transaction)
    close = Via("ledger", Ledger.close)
    data_version = Via("ledger", Ledger.data_version)
    get_meta = Via("ledger", Ledger.get_meta)
    set_meta = Via("ledger", Ledger.set_meta)
    integrity_check = Via("ledger", Ledger.integrity_check)

    # event_log
    events = Via("event_log", EventLog.events)
    last_event_seq = Via("event_log", EventLog.last_event_seq)
    state_changes_since = Via("event_log", EventLog.state_changes_since)
    jobs_with_events_since = staticmethod(EventLog.jobs_with_events_since)

    # payloads
    read_file = Via("payloads", Payloads.read_file)
    collect_leftovers = Via("payloads", Payloads.collect_leftovers)
    payload_bytes = Via("payloads", Payloads.payload_bytes)
    kept_payload_bytes = Via("payloads", Payloads.kept_payload_bytes)
    release_kept_payloads = Via("payloads", Payloads.release_kept_payloads)

    # reads: the jobs table read
    get = Via("reads", JobReads.get)
    owners = Via("reads", JobReads.owners)
    jobs = Via("reads", JobReads.jobs)
    job_rows = Via("reads", JobReads.job_rows)
    finished_jobs = Via("reads", JobReads.finished_jobs)
    finished_rows = Via("reads", JobReads.finished_rows)
    finished_sizes = staticmethod(JobReads.finished_sizes)
    finished_run_times = staticmethod(JobReads.finished_run_times)
    count_kind = Via("reads", JobReads.count_kind)
    count_jobs = Via("reads", JobReads.count_jobs)
    wait_times = Via("reads", JobReads.wait_times)
    attained_by_owner = Via("reads", JobReads.attained_by_owner)
    count_active = Via("reads", JobReads.count_active)
    count_waiting = Via("reads", JobReads.count_waiting)
    states = Via("reads", JobReads.states)

    # lifecycle: the jobs table written, the state machine, the spool
    spool = Via("lifecycle", Lifecycle.spool)
    make_spool = Via("lifecycle", Lifecycle.make_spool)
    read_spool_file = Via("lifecycle", Lifecycle.read_spool_file)
    new_id = Via("lifecycle", Lifecycle.new_id)
    insert_job = Via("lifecycle", Lifecycle.insert_job)
    insert_jobs = Via("lifecycle", Lifecycle.insert_jobs)
    requeue = Via("lifecycle", Lifecycle.requeue)
    cancel = Via("lifecycle", Lifecycle.cancel)
    cancel_unlaunched = Via("lifecycle", Lifecycle.cancel_unlaunched)
    set_priority = Via("lifecycle", Lifecycle.set_priority)

    def transition(
        self,
        job_id: str,
        to_state: str,
        reason: str = "",
        *,
        expect: Iterable[str] | None = None,
        **columns: Any,
    ) -> JobInfo:
        """``lifecycle.transition``."""
        return self.lifecycle.transition(job_id, to_state, reason, expect=expect, **columns)

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
        """``lifecycle.transition_in``."""
        return self.lifecycle.transition_in(
            db, job_id, to_state, reason, expect=expect, now=now, event_data=event_data, **columns
        )

    def update(self, job_id: str, **columns: Any) -> None:
        """``lifecycle.update``."""
        self.lifecycle.update(job_id, **columns)

    # runs: claims, leases, how a run ended
    claim = Via("runs", Runs.claim)
    run_requests = Via("runs", Runs.run_requests)
    followable_jobs = Via("runs", Runs.followable_jobs)
    followed_jobs = Via("runs", Runs.followed_jobs)
    set_live_usage = Via("runs", Runs.set_live_usage)

    def finish_run(
        self,
        db: sqlite3.Connection,
        job: JobInfo,
        end: RunEnd,
        now: float | None = None,
        **columns: Any,
    ) -> str:
        """``runs.finish_run``."""
        return self.runs.finish_run(db, job, end, now, **columns)

    # what the job-process chain (``local/``) reads of the queue and the cache
    holding_attempts = Via("queue", Queue.holding_attempts)
    job_data_paths = Via("cache", DataCache.job_data_paths)

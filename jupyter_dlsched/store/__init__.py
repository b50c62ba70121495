"""The ledger: one SQLite database (WAL) plus a spool folder, shared by every participant.

Every state change is one short ``BEGIN IMMEDIATE`` transaction through the
state machine in ``schema.TRANSITIONS``; each is recorded in ``events``. What
a job runs is stored with its row (content-addressed ``blobs``); logs and
results live in ``spool/<job-id>/``. The folder is private to the user: see
``private`` for what is checked before anything in it is trusted.

The ledger is one ``Store``, written in parts by what each owns, each part a class
built on the one below it: ``ledger`` (the file, connections, migrations, meta),
``events``, ``schedules`` (``--every``'s rows, their ticks claimed and recorded),
``payloads`` (what ended jobs keep, and for how long), ``job_reads`` (rows read:
one, a listing, what finished, counts), ``jobs`` (inserts, files, the state machine,
steering), ``runs`` (claims,
leases, how a run ended), ``queue`` (the tick's queries), ``staging`` (staged inputs and
the cache) and ``samples`` (utilisation history).
"""

from __future__ import annotations

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
from .ledger import (  # noqa: F401  (its helpers, re-exported)
    _SNAPSHOT_COLUMNS,
    DEFAULT_PAYLOAD_KEEP,
    LAST_RESERVE_BYTES,
    LAST_RESERVE_NAME,
    PAYLOAD_KEEP_ENV,
    RESERVE_BYTES,
    RESERVE_NAME,
    Reserve,
    _free_bytes,
    _free_words,
    _keep_or_default,
    _out_of_space,
    disk_full,
    inventory_key,
    payload_keep,
)
from .runs import Lease  # noqa: F401  (what a claim hands its winner)
from .samples import Samples


class Store(Samples):
    """The SQLite ledger and spool folder under ``home``.

    Connections are per thread; each state change is its own transaction.

    >>> store = Store("/tmp/dlsched-doc")  # doctest: +SKIP
    >>> store.jobs(states=["queued"])  # doctest: +SKIP
    []
    """

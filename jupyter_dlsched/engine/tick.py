"""One decision inside one transaction: reap leases, snapshot, ask the policy, commit.

``Engine.tick`` (``core.py``) opens the transaction and launches what started; this
module holds the steps, reading the ledger with one lean query. The waiting jobs the
agent keeps between decisions are ``queue_index.QueueIndex``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..forecast import start_times
from ..policy import Decisions, FinishedJob, Policy, QueuedJob, RunningJob
from ..store import JobInfo, RunEnd, Store
from ..vocab.resources import Capacity, GpuFree, Placement
from ..vocab.schema import WAITING
from .line_ranks import rerank
from .queue_index import QueueIndex
from .rows import queued_job, running_job, settle_dependencies

CLAIM_GRACE = 30.0  # seconds an allocated job may wait for its supervisor to claim it


@dataclass
class TickResult:
    decisions: Decisions | None = None
    reaped: list[JobInfo] = field(default_factory=list)


def reap(store: Store, db: sqlite3.Connection, backend: str, now: float) -> list[JobInfo]:
    """Move running jobs whose lease expired on: cancelled, requeued for a retry, or lost;
    and release the grants successes held past their end whose lease expired."""
    store.queue.lapsed_holds(db, backend, now)
    reaped = []
    for job_id in store.queue.expired_leases(db, backend, now):
        info = store.get(job_id)
        if info.cancel_requested:
            end = RunEnd("cancelled")
        else:
            end = RunEnd("lost", "lost (lease expired): its supervisor stopped renewing it")
        store.finish_run(db, info, end, now, supervisor_pid=None)
        reaped.append(info)
    return reaped


def decide(
    store: Store,
    db: sqlite3.Connection,
    *,
    backend: str,
    policy: Policy,
    inventory: dict[str, Any],
    external_gpu_mem: dict[int, int],
    lease_ttl: float,
    now: float,
    deferred: list[tuple[float | None, str | None, str]] | None = None,
    index: QueueIndex | None = None,
    forecasts: list[start_times.Forecasting] | None = None,
) -> Decisions:
    """Snapshot the active jobs, run the policy, commit its starts, preemptions and reasons.

    ``deferred``: a list to receive the waiting jobs' new ranks in line and reasons
    instead of writing them here, so the caller can launch what started first.
    ``index``: the waiting jobs kept from the previous decision (the pool agent's),
    so only the rows of jobs that changed since are read again, and with a deep
    queue a decision looks only at its head (``QueueIndex.head``).
    ``forecasts``: a list to receive the start-time forecast a whole-queue decision asks
    for, which the caller runs once it has launched what started, outside the write
    lock (``start_times.estimate``); without it, no estimates are made."""
    started = time.perf_counter()
    blocked: dict[str, str] = {}
    if index is not None:
        running = index.read(store, db, backend)
        blocked = index.resolve_dependencies(store, db, now)
    else:
        snapshot = store.queue.snapshot(db, backend)
        running = [r for r in snapshot if r["state"] not in WAITING]
    active = [running_job(r, now) for r in running if r["placement"]]
    capacity = idle_capacity_minus(inventory, [a.placement for a in active], external_gpu_mem)
    learnt = False
    if index is not None:
        wanted = index.places_wanted(now)
        head = index.head(policy, now)
        if head is not None:
            if wanted:
                _learn(store, db, backend, policy)  # as a decision over the whole queue would
                learnt = True
            decisions = policy(head, active, capacity, now)
            if decisions.settled or len(head) == len(index.offered):
                if not wanted:
                    _commit(store, db, decisions, index.waiting, lease_ttl, now)
                    index.stale()
                    if deferred is not None:
                        deferred[:] = []
                    due = index.places_due()
                    if decisions.wake_at is None or due < decisions.wake_at:
                        decisions.wake_at = due
                    _wake_for_begin(decisions, index.pending.values(), now)
                    return decisions
                line = index.line(policy, decisions, head, active, capacity, now)
                if line is not None:
                    _commit(store, db, decisions, index.waiting, lease_ttl, now)
                    in_line, explain = line
                    # the forecast reads only the front of the line, later: a copy of it
                    ahead = list(in_line[: start_times.FORECAST_JOBS])
                    _estimate(forecasts, backend, policy, ahead, active, capacity, now, index)
                    changed = index.places_from(in_line, explain, decisions, blocked)
                    index.placed(time.perf_counter() - started)
                    _write_places(store, db, changed, deferred)
                    _wake_for_begin(decisions, index.pending.values(), now)
                    decisions.placed = True
                    return decisions
        waiting = index.in_submit_order()
        queued = [index.queued(row) for row in waiting if row["id"] in index.offered]
        rows = index.waiting
    else:
        waiting = [r for r in snapshot if r["state"] in WAITING]
        queued, blocked = _ready(store, db, waiting, now)
        rows = {r["id"]: r for r in waiting}
    if not learnt:
        _learn(store, db, backend, policy)
    decisions = policy(queued, active, capacity, now)
    _commit(store, db, decisions, rows, lease_ttl, now)
    # every waiting job's start-time estimate, from the same snapshot and the queue's order
    _estimate(
        forecasts,
        backend,
        policy,
        start_times.in_order(queued, decisions.order),
        active,
        capacity,
        now,
        index,
        written=None
        if index is not None
        else {
            r["id"]: (r["expected_start"], r["start_p80"])
            for r in waiting
            if r["expected_start"] is not None or r["start_p80"] is not None
        },
    )
    started_ids = {s.job_id for s in decisions.starts}
    order = [j for j in decisions.order if j not in started_ids and j in rows]
    reasons = {**decisions.waiting, **blocked}
    if index is not None:
        changed = index.take_places(order, list(map(reasons.get, order)), blocked)
        index.take_unlined(waiting, started_ids | set(order), reasons, changed)
    else:
        # ranks, not places: a job keeps its rank while its order with the others holds
        old = [rows[j]["position"] for j in order]
        moved = rerank(old)
        rank_of = {j: moved.get(i, old[i]) for i, j in enumerate(order)}
        changed = []
        for row in waiting:
            job_id = row["id"]
            if job_id in started_ids:
                continue
            rank, reason = rank_of.get(job_id), reasons.get(job_id)
            if row["position"] != rank or row["waiting"] != reason:
                changed.append((rank, reason, job_id))
    if index is not None:
        index.placed(time.perf_counter() - started)
    _write_places(store, db, changed, deferred)
    _wake_for_begin(decisions, waiting, now)
    decisions.placed = True
    return decisions


def _learn(store: Store, db: sqlite3.Connection, backend: str, policy: Policy) -> None:
    """Teach a learning policy (gittins; priority's backfill estimates) the sizes of the jobs
    that ran to their end here."""
    learn = getattr(policy, "learn", None)
    if callable(learn):
        window = int(getattr(policy, "window", 2000))
        learn(
            [
                FinishedJob(owner, name, size, finished, gpus)
                for owner, name, size, finished, gpus in store.finished_sizes(db, backend, window)
            ],
            replace=True,
        )


def _estimate(
    forecasts: list[start_times.Forecasting] | None,
    backend: str,
    policy: Policy,
    ordered: Sequence[QueuedJob],
    active: list[RunningJob],
    capacity: Capacity,
    now: float,
    index: QueueIndex | None,
    written: start_times.Estimates | None = None,
) -> None:
    """Ask for every waiting job's start-time estimate, from the decision's snapshot and
    the queue's order (``ordered``: the queue in that order)."""
    if forecasts is not None:
        forecasts.append(
            start_times.Forecasting(
                backend,
                policy,
                ordered,
                active,
                capacity,
                now,
                index.estimates if index is not None else (written or {}),
            )
        )


def _write_places(
    store: Store,
    db: sqlite3.Connection,
    changed: list[tuple[float | None, str | None, str]],
    deferred: list[tuple[float | None, str | None, str]] | None,
) -> None:
    """Write the places in line that changed in this transaction, or hand them to the caller."""
    if deferred is not None:
        deferred[:] = changed
    else:
        store.queue.set_queue_positions(db, changed)


def _wake_for_begin(decisions: Decisions, waiting: Iterable[sqlite3.Row], now: float) -> None:
    """Decide again when the first ``begin`` still ahead comes (nothing else may change)."""
    ahead = [r["begin"] for r in waiting if r["begin"] is not None and r["begin"] > now]
    if ahead and (decisions.wake_at is None or min(ahead) < decisions.wake_at):
        decisions.wake_at = min(ahead)


def _ready(
    store: Store, db: sqlite3.Connection, waiting: list[sqlite3.Row], now: float
) -> tuple[list[QueuedJob], dict[str, str]]:
    """The waiting jobs whose dependencies have succeeded, and the others' reasons (a job
    whose dependency failed fails here)."""
    reasons = settle_dependencies(store, db, waiting, now)
    queued: list[QueuedJob] = []
    blocked: dict[str, str] = {}
    for row in waiting:
        why = reasons[row["id"]]
        if why is None:
            queued.append(queued_job(row))
        elif why:
            blocked[row["id"]] = why
    return queued, blocked


def _commit(
    store: Store,
    db: sqlite3.Connection,
    decisions: Decisions,
    rows: Mapping[str, sqlite3.Row],
    lease_ttl: float,
    now: float,
) -> None:
    """Write a decision's starts and preemptions (``rows``: the waiting jobs' rows by id)."""
    for start in decisions.starts:
        store.transition_in(
            db,
            start.job_id,
            "running",
            "",
            now=now,
            event_data={"placement": start.placement.to_json()},
            placement=start.placement,
            started=now,
            attempts=rows[start.job_id]["attempts"] + 1,
            # time to claim: a supervisor's interpreter start can be slow on a busy machine
            lease_expires=now + max(lease_ttl, CLAIM_GRACE),
            supervisor_pid=None,
            job_pid=None,
            host=None,
            cancel_requested=0,
            preempt_requested=0,
            resize_to=None,
            exit_code=None,
            term_signal=None,
            position=None,
            waiting=None,
        )
    for preempt in decisions.preempts:
        store.queue.request_preemption(db, preempt.job_id)
    for resize in decisions.resizes:
        store.queue.request_resize(db, resize.job_id, resize.placement, resize.reason, now)


def idle_capacity_minus(
    inventory: dict[str, Any], held: list[Placement], external: dict[int, int]
) -> Capacity:
    """The pool's capacity less what running jobs hold and outside processes use."""
    capacity = Capacity(
        gpus=tuple(
            GpuFree(
                g["index"],
                g["mem_total"],
                max(0, g["mem_total"] - external.get(g["index"], 0)),
                0,
                g.get("group"),
            )
            for g in inventory.get("gpus", [])
        ),
        cpu_load=(0.0,) * int(inventory.get("cpus", 1)),
        mem_free=int(inventory.get("mem_total", 0)),
        mem_total=int(inventory.get("mem_total", 0)),
    )
    for placement in held:
        capacity = capacity.take(placement)
    return capacity

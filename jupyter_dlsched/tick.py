"""One scheduling tick inside one transaction: reap leases, snapshot, ask the policy, commit.

``Scheduler.tick`` opens the transaction and launches what started; this
module holds the steps, reading the ledger with one lean query.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from .policy import Decisions, FinishedJob, Policy, QueuedJob, RunningJob
from .resources import Capacity, GpuFree, Placement, Request
from .store import TERMINAL, JobInfo, RunEnd, Store

CLAIM_GRACE = 30.0  # seconds an allocated job may wait for its supervisor to claim it


@dataclass
class TickResult:
    decisions: Decisions | None = None
    reaped: list[JobInfo] = field(default_factory=list)


def reap(store: Store, db: sqlite3.Connection, backend: str, now: float) -> list[JobInfo]:
    """Move running jobs whose lease expired on: cancelled, requeued for a retry, or lost."""
    reaped = []
    for job_id in store.expired_leases(db, backend, now):
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
    deferred: list[tuple[int | None, str | None, str]] | None = None,
    index: QueueIndex | None = None,
) -> Decisions:
    """Snapshot the active jobs, run the policy, commit its starts, preemptions and reasons.

    ``deferred``: a list to receive the waiting jobs' new positions and reasons
    instead of writing them here, so the caller can launch what started first
    (with a deep queue every start moves every waiting job up one place).
    ``index``: the waiting jobs kept from the previous decision (the pool agent's),
    so only the rows of jobs that changed since are read again."""
    if index is not None:
        running, waiting = index.read(store, db, backend)
    else:
        rows = store.snapshot(db, backend)
        running = [r for r in rows if r["state"] == "running"]
        waiting = [r for r in rows if r["state"] != "running"]
    dep_states = _dependency_states(store, db, waiting)
    queued: list[QueuedJob] = []
    blocked: dict[str, str] = {}
    attempts: dict[str, int] = {}
    for row in waiting:
        if index is not None and row["after"] == "[]":
            queued.append(index.queued(row))  # unchanged since it was last read: as it was
            attempts[row["id"]] = row["attempts"]
            continue
        after = json.loads(row["after"]) if row["after"] != "[]" else []
        states = [dep_states.get(d, "missing") for d in after]
        bad = [d for d, s in zip(after, states, strict=True) if s in TERMINAL and s != "succeeded"]
        if bad:
            why = f"dependency {bad[0]} {dep_states[bad[0]]}"
            store.transition_in(db, row["id"], "failed", why, now=now, finished=now)
            continue
        pending = [d for d, s in zip(after, states, strict=True) if s != "succeeded"]
        if pending:
            blocked[row["id"]] = f"waiting for job {pending[0]} to finish"
            continue
        attempts[row["id"]] = row["attempts"]
        queued.append(_queued(row))
    active = [_running(r, now) for r in running if r["placement"]]
    capacity = idle_capacity_minus(inventory, [a.placement for a in active], external_gpu_mem)
    learn = getattr(policy, "learn", None)
    if callable(learn):
        # a learning policy (gittins) ranks by the sizes of jobs that ran to their end here
        window = int(getattr(policy, "window", 2000))
        learn(
            [
                FinishedJob(owner, name, size, finished)
                for owner, name, size, finished in store.finished_sizes(db, backend, window)
            ],
            replace=True,
        )
    decisions = policy(queued, active, capacity, now)
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
            attempts=attempts.get(start.job_id, 0) + 1,
            # time to claim: a supervisor's interpreter start can be slow on a busy machine
            lease_expires=now + max(lease_ttl, CLAIM_GRACE),
            supervisor_pid=None,
            job_pid=None,
            host=None,
            cancel_requested=0,
            preempt_requested=0,
            exit_code=None,
            term_signal=None,
            position=None,
            waiting=None,
        )
    for preempt in decisions.preempts:
        store.request_preemption(db, preempt.job_id)
    started = {s.job_id for s in decisions.starts}
    order = [j for j in decisions.order if j not in started]
    positions = {job_id: i + 1 for i, job_id in enumerate(order)}
    reasons = {**decisions.waiting, **blocked}
    changed = []
    for row in waiting:
        job_id = row["id"]
        if job_id in started:
            continue
        pos, reason = positions.get(job_id), reasons.get(job_id)
        if index is not None:
            if index.place(job_id, row) != (pos, reason):
                changed.append((pos, reason, job_id))
                index.places[job_id] = (pos, reason)
        elif row["position"] != pos or row["waiting"] != reason:
            changed.append((pos, reason, job_id))
    if deferred is not None:
        deferred[:] = changed
    else:
        store.set_queue_positions(db, changed)
    return decisions


class QueueIndex:
    """The waiting jobs of one backend, kept between decisions by the one process deciding.

    Every change a decision depends on writes an ``events`` row (a submit, a
    state change, a priority change, a staged input bound), so each decision
    reads again only the rows of jobs with an event since the previous one
    (and the few running jobs, whose stop flags change without one). The
    policy's ``QueuedJob`` of a row is built once, and each job's place in line
    is compared with the one last computed, not re-read.
    """

    def __init__(self) -> None:
        self.seq = -1
        self.waiting: dict[str, sqlite3.Row] = {}
        self._queued: dict[str, QueuedJob] = {}
        #: the place in line and reason last computed for each waiting job
        self.places: dict[str, tuple[int | None, str | None]] = {}

    def read(
        self, store: Store, db: sqlite3.Connection, backend: str
    ) -> tuple[list[sqlite3.Row], list[sqlite3.Row]]:
        """``(running, waiting)`` rows, waiting ones in submit order."""
        last = store.last_event_seq(db)
        if self.seq < 0:
            rows = store.snapshot(db, backend)
            self.waiting = {r["id"]: r for r in rows if r["state"] != "running"}
            self._queued.clear()
            self.places.clear()
            running = [r for r in rows if r["state"] == "running"]
        else:
            if last != self.seq:
                changed = store.jobs_with_events_since(db, self.seq)
                for job_id in changed:
                    self.waiting.pop(job_id, None)
                    self._queued.pop(job_id, None)
                    self.places.pop(job_id, None)
                fresh = [
                    r for r in store.snapshot_of(db, backend, changed) if r["state"] != "running"
                ]
                if fresh:
                    self.waiting.update((r["id"], r) for r in fresh)
                    # submit order: a requeued job keeps its place by its number
                    self.waiting = dict(sorted(self.waiting.items(), key=lambda kv: kv[1]["seq"]))
            running = store.snapshot_running(db, backend)
        self.seq = last
        return running, list(self.waiting.values())

    def queued(self, row: sqlite3.Row) -> QueuedJob:
        job = self._queued.get(row["id"])
        if job is None:
            job = self._queued[row["id"]] = _queued(row)
        return job

    def place(self, job_id: str, row: sqlite3.Row) -> tuple[int | None, str | None]:
        return self.places.get(job_id, (row["position"], row["waiting"]))


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


def _dependency_states(
    store: Store, db: sqlite3.Connection, waiting: list[sqlite3.Row]
) -> dict[str, str]:
    deps = sorted({d for r in waiting if r["after"] != "[]" for d in json.loads(r["after"])})
    return store.states(deps, db)


def _request(row: sqlite3.Row) -> Request:
    return Request(row["gpus"], row["gpu_mem"], row["cpus"], row["mem"])


def _queued(row: sqlite3.Row) -> QueuedJob:
    return QueuedJob(
        id=row["id"],
        seq=row["seq"],
        submitted=row["submitted"],
        request=_request(row),
        priority=row["priority"],
        owner=row["owner"],
        deadline=row["deadline"],
        time_limit=row["time_limit"],
        preemptible=bool(row["preemptible"]),
        attained=row["attained"],
        preemptions=row["preemptions"],
        name=row["name"],
    )


def _running(row: sqlite3.Row, now: float) -> RunningJob:
    return RunningJob(
        id=row["id"],
        seq=row["seq"],
        submitted=row["submitted"],
        started=row["started"] or now,
        request=_request(row),
        placement=Placement.from_json(json.loads(row["placement"])),
        priority=row["priority"],
        owner=row["owner"],
        time_limit=row["time_limit"],
        preemptible=bool(row["preemptible"]),
        attained=row["attained"],
        name=row["name"],
        # already asked to stop: its devices are about to be free, pick no new victim for it
        stopping=bool(row["preempt_requested"] or row["cancel_requested"]),
    )

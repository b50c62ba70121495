"""The tick's side of staging: hold back jobs whose data is not staged, arm stagers for the next.

``StagingGate`` wraps the policy for one tick. Jobs with an input not yet
bound to a cache entry are not offered to the policy (so it never starts
them, and never reserves resources for them); the policy is asked once more
over the whole queue to rank them, and the first ``ahead`` of them get a
staging armed in the ledger, which the scheduler launches after the commit.
Their waiting reason is the staging's progress.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..policy import Decisions, Policy, QueuedJob, RunningJob
from ..policy.base import PolicyGate, narrowed, passes_through
from ..store import Store
from ..vocab.resources import Capacity

#: Seconds an armed staging waits for its stager to claim it (an interpreter start, at worst).
CLAIM_GRACE = 30.0


def format_rate(rate: float) -> str:
    """Bytes per second in the decimal units people quote for links: ``'1.2 GB/s'``."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if rate >= size:
            return f"{rate / size:.1f} {unit}"
    return f"{rate:.0f} B/s"


def staging_words(rows: Sequence[sqlite3.Row | dict[str, Any]], next_up: bool = True) -> str:
    """A waiting job's reason from its unstaged inputs: ``'staging data 43 %, 1.2 GB/s'``."""
    live = [r for r in rows if r["lease_expires"] is not None]
    if not live:
        if next_up:
            return "staging data: starting"
        return "waiting to stage its data (staged when it nears the front of the queue)"
    notes = [r["note"] for r in live if r["note"]]
    if all(r["stager_pid"] is None for r in live):
        return "staging data: starting"
    if any(r["total_bytes"] is None for r in live):
        return "staging data: listing " + ", ".join(sorted({r["source"] for r in live}))
    total = sum(r["total_bytes"] for r in live)
    done = sum(min(r["done_bytes"], r["total_bytes"]) for r in live)
    rate = sum(r["rate"] or 0.0 for r in live)
    percent = int(100 * done / total) if total else 100
    words = f"staging data {percent} %"
    if rate > 0 and done < total:
        words += f", {format_rate(rate)}"
    if notes:
        words += f", {notes[0]}"
    return words


class StagingGate(PolicyGate):
    """A policy for one tick that leaves out jobs whose inputs are not staged yet."""

    #: it reads the ledger on every call: a start-time forecast uses the policy it wraps
    does_io = True

    def __init__(self, store: Store, policy: Policy, *, uid: int | None) -> None:
        super().__init__(policy)
        self._store = store
        self._uid = uid
        #: source ids armed by this tick, to launch after the commit
        self.armed: list[str] = []

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        db = self._store.db  # the tick's transaction is open on this thread's connection
        inputs: dict[str, list[sqlite3.Row]] = {}
        for row in self._store.cache.waiting_inputs(db):
            inputs.setdefault(row["job_id"], []).append(row)
        held = [q for q in queued if q.id in inputs]
        if not held:
            decisions = self._policy(queued, running, capacity, now)
        else:
            decisions = self._gate(queued, held, inputs, running, capacity, now)
        started = [s.job_id for s in decisions.starts]
        if started:
            self._store.cache.touch_cache(db, started, now)
        return decisions

    def passes_through(
        self,
        decisions: Decisions,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
    ) -> bool:
        """No waiting job has an input left to stage: this tick held nothing back
        (``PolicyGate.passes_through``)."""
        if self._store.cache.waiting_inputs(self._store.db):
            return False
        return passes_through(self._policy, decisions, queued, running)

    def _gate(
        self,
        queued: Sequence[QueuedJob],
        held: list[QueuedJob],
        inputs: dict[str, list[sqlite3.Row]],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        from .cache import CacheConfig

        # the policy's view of the whole queue says which held jobs would run next
        ranking = self._policy(queued, running, capacity, now)
        ranked = [s.job_id for s in ranking.starts] + list(ranking.order)
        held_ids = {q.id for q in held}
        order = [j for j in dict.fromkeys(ranked) if j in held_ids]
        order += [q.id for q in held if q.id not in set(order)]
        ahead = CacheConfig.load(self._store).ahead
        next_up = set(order[:ahead])
        db = self._store.db
        for job_id in order[:ahead]:
            for row in inputs[job_id]:
                sid = row["source_id"]
                if (self._uid is not None and row["uid"] != self._uid) or sid in self.armed:
                    continue  # only the owner reads a source (a shared pool: as its owner)
                live = row["lease_expires"] is not None and row["lease_expires"] >= now
                if not live and self._store.cache.request_staging(
                    db, sid, row["source"], row["uid"], now + CLAIM_GRACE
                ):
                    self.armed.append(sid)
        ready = narrowed(queued, [q for q in queued if q.id not in held_ids])
        decisions = self._policy(ready, running, capacity, now)
        for job_id in order:
            rows = [
                {**dict(r), "lease_expires": now, "stager_pid": None}
                if r["source_id"] in self.armed
                else r
                for r in inputs[job_id]
            ]
            decisions.waiting[job_id] = staging_words(rows, job_id in next_up)
        decisions.order = list(decisions.order) + order
        # decide again when a stager's lease would run out: a killed one is replaced then
        leases = [r["lease_expires"] for j in order for r in inputs[j] if r["lease_expires"]]
        if leases:
            expiry = max(min(leases), now) + 0.1
            wake = decisions.wake_at
            decisions.wake_at = expiry if wake is None else min(wake, expiry)
        return decisions

"""A ledger row as a policy sees it: the policy's inputs made from the rows a decision
reads (``queued_job``, ``running_job``), and why a waiting row cannot start yet
(``why_blocked``: its ``begin``, a dependency; ``settle_dependencies``: every waiting
row's, a failure passed down each chain at once).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from functools import lru_cache

from ..policy import QueuedJob, RunningJob
from ..store import TERMINAL, Store
from ..vocab.resources import Placement, Request
from ..vocab.when import begin_words


def why_blocked(
    store: Store, db: sqlite3.Connection, row: sqlite3.Row, dep_states: dict[str, str], now: float
) -> str | None:
    """Why ``row`` waits for its ``begin`` or its dependencies (``None``: it may start;
    ``""``: a dependency failed, and so has the job now)."""
    if row["begin"] is not None and row["begin"] > now:
        return begin_words(row["begin"], now)
    if row["after"] == "[]":
        return None
    after = json.loads(row["after"])
    states = [dep_states.get(d, "missing") for d in after]
    bad = [d for d, s in zip(after, states, strict=True) if s in TERMINAL and s != "succeeded"]
    if bad:
        why = f"dependency {bad[0]} {dep_states.get(bad[0], 'missing')}"
        store.transition_in(db, row["id"], "failed", why, now=now, finished=now)
        return ""
    pending = [d for d, s in zip(after, states, strict=True) if s != "succeeded"]
    if pending:
        return f"waiting for job {pending[0]} to finish"
    return None


def dependency_states(
    store: Store, db: sqlite3.Connection, waiting: list[sqlite3.Row]
) -> dict[str, str]:
    deps = sorted({d for r in waiting if r["after"] != "[]" for d in json.loads(r["after"])})
    return store.states(deps, db)


def settle_dependencies(
    store: Store, db: sqlite3.Connection, waiting: list[sqlite3.Row], now: float
) -> dict[str, str | None]:
    """``why_blocked`` of each waiting row, by id, with a failure passed down whole chains
    in this one decision: a job failed here for its dependency is a failed dependency of
    the jobs after it, which fail too (a chain of thousands fails at once, not one link a
    decision). Looks again only while a pass failed someone."""
    dep_states = dependency_states(store, db, waiting)
    why: dict[str, str | None] = {}
    todo = waiting
    while todo:
        failed = False
        still: list[sqlite3.Row] = []
        for row in todo:
            why[row["id"]] = reason = why_blocked(store, db, row, dep_states, now)
            if reason == "":
                dep_states[row["id"]] = "failed"
                failed = True
            elif reason and row["after"] != "[]":
                still.append(row)
        todo = still if failed else []
    return why


def request_of(row: sqlite3.Row) -> Request:
    return _shape(row["gpus"], row["gpu_mem"], row["cpus"], row["mem"])


@lru_cache(maxsize=1024)
def _shape(gpus: float, gpu_mem: int | None, cpus: float, mem: int) -> Request:
    """One request object per shape, shared by the waiting jobs that ask for it (a map's
    thousands), so what is worked out per request is found by identity."""
    return Request(gpus, gpu_mem, cpus, mem)


def queued_job(row: sqlite3.Row) -> QueuedJob:
    """A waiting row; an elastic job with an asked size (``"1:2:4"``) offered at that size,
    which it may start below, down to its minimum (``QueuedJob.min_gpus``)."""
    asked = row["asked_gpus"]
    request = (
        request_of(row)
        if asked is None
        else _shape(float(asked), row["gpu_mem"], row["cpus"], row["mem"])
    )
    return QueuedJob(
        id=row["id"],
        seq=row["seq"],
        submitted=row["submitted"],
        request=request,
        priority=row["priority"],
        owner=row["owner"],
        deadline=row["deadline"],
        time_limit=row["time_limit"],
        preemptible=bool(row["preemptible"]),
        attained=row["attained"],
        preemptions=row["preemptions"],
        name=row["name"],
        max_gpus=row["max_gpus"],
        min_gpus=None if asked is None else int(row["gpus"]),
        resume_on=Placement.from_json(json.loads(row["resize_to"])) if row["resize_to"] else None,
    )


def running_job(row: sqlite3.Row, now: float) -> RunningJob:
    """A job holding a grant as the policy sees it: running, or a success whose process
    still exits (about to be free: neither a victim nor elastic any more)."""
    ended = row["state"] != "running"
    placement = Placement.from_json(json.loads(row["placement"]))
    request = request_of(row)
    if row["max_gpus"] is not None:  # an elastic job holds what it was last sized to
        request = replace(request, gpus=float(len(placement.gpus)))
    return RunningJob(
        id=row["id"],
        seq=row["seq"],
        submitted=row["submitted"],
        started=row["started"] or now,
        request=request,
        placement=placement,
        priority=row["priority"],
        owner=row["owner"],
        time_limit=row["time_limit"],
        deadline=row["deadline"],
        preemptible=bool(row["preemptible"]) and not ended,
        attained=row["attained"],
        name=row["name"],
        min_gpus=None if row["max_gpus"] is None or ended else int(row["gpus"]),
        max_gpus=None if ended else row["max_gpus"],
        # already asked to stop, or a success whose process still exits (it holds its
        # grant, ``HELD_GRANT``): its devices are about to be free, pick no new victim for it
        stopping=bool(row["preempt_requested"] or row["cancel_requested"] or ended),
    )

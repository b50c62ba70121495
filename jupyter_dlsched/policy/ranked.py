"""The shared engine of queue-order policies: rank the queue, start what fits, preempt.

A ranked policy gives every queued job a key (``queue_key``, smaller first)
that does not change while the job waits, starts jobs in that order while they
fit (skipping a job that does not fit, unless ``skip`` is off), and, when
``preempt`` is on, lets a waiting job stop running jobs of a strictly worse
*rank* when that frees enough room for it. ``fifo``, ``sjf``, ``srtf``,
``las`` and ``gittins`` are ranked policies that differ only in their keys.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..resources import Capacity
from .base import (
    Decisions,
    Preempt,
    QueuedJob,
    Room,
    RunningJob,
    Start,
    describe_shortfall,
    gpu_only,
    presorted,
    smallest_size,
    submit_order,
)


class RankedPolicy:
    """Base class: subclasses define ``queue_key`` and, to preempt, the two rank methods.

    Subclasses are dataclasses with at least the fields ``name``, ``skip`` and
    ``preempt``.
    """

    name: str
    skip: bool
    preempt: bool

    def queue_key(self, job: QueuedJob) -> Any:
        raise NotImplementedError

    def queued_rank(self, job: QueuedJob) -> float:
        """How urgent a waiting job is for preemption (smaller is more urgent)."""
        raise NotImplementedError

    def running_rank(self, job: RunningJob, now: float) -> float:
        """The same scale for a running job at ``now``: a victim ranks strictly worse."""
        raise NotImplementedError

    def next_change(self, job: RunningJob, now: float) -> float | None:
        """When ``job``'s running rank next changes, if it changes on its own."""
        return None

    def rank_running(
        self, running: Sequence[RunningJob], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        """Possible victims as ``(-rank, -seq, job)`` and when the first rank changes.

        Subclasses may replace this with one tight loop: it runs over every
        running job on every call, which dominates the cost on large pools.
        """
        victims = []
        wake: float | None = None
        for r in running:
            if r.preemptible and not r.stopping:
                victims.append((-self.running_rank(r, now), -r.seq, r))
                change = self.next_change(r, now)
                if change is not None and (wake is None or change < wake):
                    wake = change
        return victims, wake

    def blocked_reason(self, head: QueuedJob) -> str:
        return f"behind {head.id} (first in line)"

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        out = Decisions()
        fast = presorted(queued, self.queue_key)
        ordered: Sequence[QueuedJob] = queued if fast else sorted(queued, key=self.queue_key)
        lean = fast and gpu_only(queued)
        promote_after = getattr(self, "promote_after", None)
        cutoff = -math.inf
        promotion: float | None = None
        if promote_after is not None and ordered:
            # jobs in the system longer than promote_after go first, oldest first
            cutoff = now - promote_after
            old = [j for j in ordered if j.submitted <= cutoff]
            if old:
                old.sort(key=submit_order)
                rest = [j for j in ordered if j.submitted > cutoff]
                ordered = old + rest
            else:
                rest = list(ordered)
            if rest:
                promotion = min(j.submitted for j in rest) + promote_after
        room = Room(capacity)
        waiting: list[QueuedJob] = []
        blocked: QueuedJob | None = None
        looked = len(ordered)
        # lean: count the sizes still waiting, to stop as soon as none of them fits
        sizes = dict(queued.sizes) if lean and queued.sizes else {}  # type: ignore[attr-defined]
        smallest = smallest_size(queued) if lean else 0
        for i, job in enumerate(ordered):
            if lean and room.whole < smallest:
                looked = i  # nothing further can start: leave the rest unexamined
                break
            if blocked is not None and not self.skip:
                if lean:
                    looked = i  # strict order: nothing behind a blocked head starts
                    break
                waiting.append(job)
                continue
            placement = room.place(job.request)
            if placement is None:
                waiting.append(job)
                blocked = blocked or job
                continue
            room.take(placement)
            out.starts.append(Start(job.id, placement))
            if sizes:
                n = job.request.whole_gpus
                sizes[n] -= 1
                if sizes[n] <= 0:
                    del sizes[n]
                    smallest = min(sizes, default=smallest)
        if not lean:
            out.order = [j.id for j in ordered]
            for job in waiting:
                if blocked is not None and job is not blocked and not self.skip:
                    out.waiting[job.id] = self.blocked_reason(blocked)
                else:
                    out.waiting[job.id] = describe_shortfall(job.request, room.capacity)
        if self.preempt and (waiting or looked < len(ordered)):
            left = itertools.chain(waiting, itertools.islice(ordered, looked, None))
            self._plan_preemptions(left, running, room, now, out, cutoff)
        if promotion is not None and promotion > now:
            out.wake_at = promotion if out.wake_at is None else min(out.wake_at, promotion)
        return out

    def _plan_preemptions(
        self,
        waiting: Iterable[QueuedJob],
        running: Sequence[RunningJob],
        room: Room,
        now: float,
        out: Decisions,
        cutoff: float = -math.inf,
    ) -> None:
        """Stop the worst-ranked running jobs for the most urgent waiting ones.

        Waiting jobs come in key order, which is also rank order, so the walk
        ends at the first waiting job that no running job ranks below.
        """
        plan = room.copy()
        for r in running:
            if r.stopping:
                plan.give_back(r.placement)
        victims, out.wake_at = self.rank_running(running, now)
        if cutoff > -math.inf:  # promoted jobs are nobody's victims
            victims = [v for v in victims if v[2].submitted > cutoff]
        if not victims:
            return
        heapq.heapify(victims)  # worst rank first, then the latest submitted
        for job in waiting:
            if not victims:
                return
            rank = -math.inf if job.submitted <= cutoff else self.queued_rank(job)
            if rank >= -victims[0][0]:
                return
            placement = plan.place(job.request)
            if placement is not None:  # fits once jobs already stopping have left
                plan.take(placement)
                continue
            chosen = _victims_for(job, plan, victims, rank)
            if chosen is None:
                continue
            for r in chosen:
                plan.give_back(r.placement)
                out.preempts.append(Preempt(r.id, f"for {job.id} ({self.name})"))
                out.waiting[job.id] = "waiting for preempted jobs to stop"
            placement = plan.place(job.request)
            if placement is not None:
                plan.take(placement)


def _victims_for(
    job: QueuedJob,
    plan: Room,
    victims: list[tuple[float, int, RunningJob]],
    rank: float,
) -> list[RunningJob] | None:
    """The fewest worst-ranked victims (ranked strictly worse than ``rank``) that make room."""
    popped: list[tuple[float, int, RunningJob]] = []
    trial = plan.copy()
    fits = False
    while victims and -victims[0][0] > rank:
        item = heapq.heappop(victims)
        popped.append(item)
        trial.give_back(item[2].placement)
        if trial.place(job.request) is not None:
            fits = True
            break
    if not fits:
        for item in popped:
            heapq.heappush(victims, item)
        return None
    chosen = [item[2] for item in popped]
    # the worst-first walk may have taken jobs that the last one makes unneeded
    for r in list(reversed(chosen[:-1])):
        others = [v for v in chosen if v is not r]
        trial = plan.copy()
        for v in others:
            trial.give_back(v.placement)
        if trial.place(job.request) is not None:
            chosen = others
    kept = {id(r) for r in chosen}
    for item in popped:
        if id(item[2]) not in kept:
            heapq.heappush(victims, item)
    return chosen

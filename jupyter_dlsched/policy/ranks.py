"""Running jobs kept by rank as they start and stop, so a large pool is not re-ranked per event.

A preemptive ranked policy must know, at every decision, how many GPUs are
held by jobs it ranks worse than a waiting job. Ranking every running job
again on every event costs hundreds of rank evaluations per event on a pool
of hundreds of GPUs. A caller that sees every start and stop (the simulator)
keeps one of these indexes instead: ranks of running jobs change only at
known moments (``las`` thresholds, Gittins grid points: ``StepRanks``) or all
together in a known way (remaining time: ``RemainingRanks``), so each query
touches only the jobs whose rank changed.

Every rank the index reports is computed with the policy's own formula at the
moment asked: predicted crossing times only choose which jobs to re-evaluate,
with a margin far above their rounding error, so decisions are the same as
ranking every job afresh.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from .base import RunningJob

# seconds: predicted crossing times are re-checked with the exact formula this close to now
_MARGIN = 1e-3


class RunningRanks:
    """Base: the possible victims (preemptible, not stopping) of one policy, by rank.

    The caller adds every running job when it starts and removes it when it
    stops or is asked to stop (then adds it back as stopping); ``size`` counts
    them so a policy can tell the index covers the jobs it is shown.
    """

    #: whether ``guarded_worse`` answers (``StepRanks`` of a policy whose margins are its jobs')
    guard_known = False

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.version = getattr(policy, "model_version", None)
        self.size = 0
        self.stopping_gpus = 0  # whole GPUs of jobs asked to stop: free in every plan

    def covers(self, policy: Any, running: Sequence[RunningJob]) -> bool:
        """Whether this index was built for ``policy`` as it ranks now, over ``running``."""
        return (
            self.policy is policy
            and self.version == getattr(policy, "model_version", None)
            and self.size == len(running)
        )

    def add(self, job: RunningJob) -> None:
        self.size += 1
        if job.stopping:
            self.stopping_gpus += len(job.placement.gpus)
        elif job.preemptible:
            self._add(job)

    def remove(self, job: RunningJob) -> None:
        self.size -= 1
        if job.stopping:
            self.stopping_gpus -= len(job.placement.gpus)
        elif job.preemptible:
            self._remove(job)

    def worse(self, rank: float, now: float) -> tuple[int, int]:
        """Victims ranked strictly worse than ``rank`` at ``now``: how many, and their GPUs."""
        raise NotImplementedError

    def wake(self, now: float) -> float | None:
        """When the first victim's rank changes on its own (``rank_running``'s second value)."""
        return None

    def guarded_worse(self, rank: float, now: float) -> int | None:
        """Whole GPUs of the victims the policy's guard leaves (``_guard``: past the minimum
        run time, ranked by rank less restart margin) ranked strictly worse than ``rank``;
        ``None`` where this index cannot tell (margins that depend on the queue)."""
        return None

    def protected_until(self, now: float) -> float | None:
        """When the first victim still inside its minimum run time leaves it (``None``: none
        is); asked only where ``guarded_worse`` answers."""
        return None

    def _add(self, job: RunningJob) -> None:
        raise NotImplementedError

    def _remove(self, job: RunningJob) -> None:
        raise NotImplementedError


class StepRanks(RunningRanks):
    """Ranks that are a step function of attained GPU-service (``las`` levels, Gittins cells).

    ``steps(job)`` gives the job's boundaries (sorted GPU-seconds) and its rank in
    each cell: ``ranks[bisect_right(bounds, attained)]``. A job's rank changes
    only when its service crosses the next boundary; a heap of those moments says
    which jobs to look at again.
    """

    def __init__(
        self, policy: Any, steps: Callable[[RunningJob], tuple[Sequence[float], Sequence[float]]]
    ) -> None:
        super().__init__(policy)
        self.steps = steps
        # seq -> [job, bounds, ranks, cell, stamp, margin, guarded rank (None: protected)]
        self.jobs: dict[int, list[Any]] = {}
        self.count: dict[float, int] = {}  # rank -> victims at that rank
        self.gpus: dict[float, int] = {}  # rank -> their GPUs
        self.values: list[float] = []  # ranks held by at least one victim, ascending
        self.heap: list[tuple[float, int, int]] = []  # (predicted crossing, seq, stamp)
        self.stamp = 0
        self.now = -math.inf
        # The victims the policy's guard leaves (``RankedPreemption._guard``): past their
        # minimum run time, each ranked better by its restart margin, which here depends on
        # the job alone. Kept apart, so that a plan is asked for only when one could stop
        # somebody: guarded rank -> GPUs, the ranks held, and the jobs still inside their
        # minimum run time as (moment it ends, seq, stamp).
        self.min_run = float(getattr(policy, "min_run", 0.0))
        self.guards = self.min_run > 0 or float(getattr(policy, "restart_cost", 0.0)) > 0
        # margins that count the waiting jobs (``margin_counts_queue``) are not the job's own
        self.guard_known = not getattr(policy, "margin_counts_queue", False)
        self.guarded_gpus: dict[float, list[int]] = {}  # guarded rank -> [victims, GPUs]
        self.guarded_values: list[float] = []
        self.young: list[tuple[float, int, int]] = []

    def _add(self, job: RunningJob) -> None:
        bounds, ranks = self.steps(job)
        cell = bisect.bisect_right(bounds, job.attained_at(max(self.now, job.started)))
        self.stamp += 1
        margin = self.policy.rank_margin(job, 0.0) if self.guards else 0.0
        entry = [job, bounds, ranks, cell, self.stamp, margin, None]
        self.jobs[job.seq] = entry
        self._count(ranks[cell], len(job.placement.gpus), +1)
        self._push(job, bounds, cell, self.stamp)
        if self.min_run > 0:
            heapq.heappush(self.young, (job.started + self.min_run, job.seq, self.stamp))
        else:
            self._guarded(entry, +1)

    def _remove(self, job: RunningJob) -> None:
        entry = self.jobs.pop(job.seq)
        self._count(entry[2][entry[3]], len(job.placement.gpus), -1)
        if entry[6] is not None:
            self._guarded(entry, -1)

    def _guarded(self, entry: list[Any], sign: int) -> None:
        """Count ``entry`` in (1) or out of (-1) the guarded victims, at its current cell."""
        if sign > 0:
            rank, margin = entry[2][entry[3]], entry[5]
            # the guard's arithmetic: (-rank + margin) negated, so the floats are the same
            entry[6] = -(-rank + margin) if margin else rank
        value, gpus = entry[6], entry[0].request.whole_gpus
        held = self.guarded_gpus.get(value)
        if held is None:
            bisect.insort(self.guarded_values, value)
            held = self.guarded_gpus[value] = [0, 0]
        held[0] += sign
        held[1] += sign * gpus
        if held[0] == 0:
            del self.guarded_gpus[value]
            self.guarded_values.pop(bisect.bisect_left(self.guarded_values, value))
        if sign < 0:
            entry[6] = None

    def _count(self, rank: float, gpus: int, sign: int) -> None:
        n = self.count.get(rank, 0) + sign
        if n == 0:
            del self.count[rank], self.gpus[rank]
            self.values.pop(bisect.bisect_left(self.values, rank))
            return
        if rank not in self.count:
            bisect.insort(self.values, rank)
        self.count[rank] = n
        self.gpus[rank] = self.gpus.get(rank, 0) + sign * gpus

    def _push(self, job: RunningJob, bounds: Sequence[float], cell: int, stamp: int) -> None:
        gpus = job.request.gpus
        if cell < len(bounds) and gpus > 0:
            crossing = job.started + (bounds[cell] - job.attained) / gpus
            heapq.heappush(self.heap, (crossing, job.seq, stamp))

    def _advance(self, now: float) -> None:
        """Bring every victim's cell to ``now`` (times only move forward)."""
        if now < self.now:
            raise ValueError(f"ranks asked at {now} after {self.now}: time only moves forward")
        self.now = now
        heap, jobs = self.heap, self.jobs
        again = []
        while heap and heap[0][0] <= now + _MARGIN:
            crossing, seq, stamp = heapq.heappop(heap)
            entry = jobs.get(seq)
            if entry is None or entry[4] != stamp:
                continue  # the job stopped, or started again since
            job, bounds, ranks, cell = entry[0], entry[1], entry[2], entry[3]
            new = bisect.bisect_right(bounds, job.attained_at(now))
            if new != cell:
                gpus = len(job.placement.gpus)
                self._count(ranks[cell], gpus, -1)
                self._count(ranks[new], gpus, +1)
                guarded = entry[6] is not None
                if guarded:
                    self._guarded(entry, -1)
                entry[3] = cell = new
                if guarded:
                    self._guarded(entry, +1)
            gpus_asked = job.request.gpus
            if cell < len(bounds) and gpus_asked > 0:
                crossing = job.started + (bounds[cell] - job.attained) / gpus_asked
                if crossing <= now + _MARGIN:
                    # this close to now the exact formula decides: look again next time
                    again.append((crossing, seq, stamp))
                else:
                    heapq.heappush(heap, (crossing, seq, stamp))
        for item in again:
            heapq.heappush(heap, item)
        # past their minimum run time (the guard protects a job while now < its end),
        # at the cell just brought to now
        young = self.young
        while young and young[0][0] <= now:
            _, seq, stamp = heapq.heappop(young)
            entry = jobs.get(seq)
            if entry is not None and entry[4] == stamp:
                self._guarded(entry, +1)

    def worse(self, rank: float, now: float) -> tuple[int, int]:
        self._advance(now)
        values = self.values
        jobs = gpus = 0
        for value in values[bisect.bisect_right(values, rank) :]:
            jobs += self.count[value]
            gpus += self.gpus[value]
        return jobs, gpus

    def guarded_worse(self, rank: float, now: float) -> int | None:
        if not self.guard_known:
            return None
        self._advance(now)
        values, held = self.guarded_values, self.guarded_gpus
        gpus = 0
        for value in values[bisect.bisect_right(values, rank) :]:
            gpus += held[value][1]
        return gpus

    def protected_until(self, now: float) -> float | None:
        self._advance(now)
        young, jobs = self.young, self.jobs
        while young and (young[0][1] not in jobs or jobs[young[0][1]][4] != young[0][2]):
            heapq.heappop(young)
        return young[0][0] if young else None

    def wake(self, now: float) -> float | None:
        self._advance(now)
        heap, jobs = self.heap, self.jobs
        while heap and (heap[0][1] not in jobs or jobs[heap[0][1]][4] != heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            return None
        # predictions only pick the candidates; the policy's formula gives the value
        last = heap[0][0] + _MARGIN
        near = []
        while heap and heap[0][0] <= last:
            near.append(heapq.heappop(heap))
        best = math.inf
        for item in near:
            entry = jobs.get(item[1])
            if entry is not None and entry[4] == item[2]:
                job, bounds, cell = entry[0], entry[1], entry[3]
                gpus = job.request.gpus
                attained = job.attained + gpus * max(0.0, now - job.started)
                best = min(best, now + (bounds[cell] - attained) / gpus + 1e-6)
            heapq.heappush(heap, item)
        return None if best == math.inf else best


class RemainingRanks(RunningRanks):
    """Ranks by remaining GPU-time (``srtf``): all running jobs count down together.

    Jobs asking for the same GPUs keep their order (by the moment they will
    end) for as long as they run, so each such class is one sorted list and a
    query is a binary search per class.
    """

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.classes: dict[float, list[tuple[float, int]]] = {}  # GPUs asked -> (end, seq)
        self.jobs: dict[int, RunningJob] = {}
        self.endless = [0, 0]  # victims without a known remaining time: jobs, GPUs

    def _add(self, job: RunningJob) -> None:
        self.jobs[job.seq] = job
        if job.remaining is None:
            self.endless[0] += 1
            self.endless[1] += len(job.placement.gpus)
            return
        ends = self.classes.setdefault(job.request.gpus, [])
        bisect.insort(ends, (job.started + job.remaining, job.seq))

    def _remove(self, job: RunningJob) -> None:
        del self.jobs[job.seq]
        if job.remaining is None:
            self.endless[0] -= 1
            self.endless[1] -= len(job.placement.gpus)
            return
        ends = self.classes[job.request.gpus]
        del ends[bisect.bisect_left(ends, (job.started + job.remaining, job.seq))]

    def worse(self, rank: float, now: float) -> tuple[int, int]:
        count = self.endless[0] if rank < math.inf else 0
        gpus = self.endless[1] if rank < math.inf else 0
        if rank == math.inf:
            return count, gpus
        for asked, ends in self.classes.items():
            if not ends:
                continue
            factor = max(asked, 1.0)
            edge = now + rank / factor
            lo = bisect.bisect_left(ends, (edge - _MARGIN, -1))
            # the first end at or past edge + margin: seldom more than a step or two on
            top, hi, size = edge + _MARGIN, lo, len(ends)
            while hi < size and ends[hi][0] < top:
                hi += 1
            n = size - hi
            for i in range(lo, hi):  # close to the edge: the policy's formula decides
                job = self.jobs[ends[i][1]]
                left = max(0.0, job.remaining - max(0.0, now - job.started))  # type: ignore[operator]
                if left * factor > rank:
                    n += 1
            if n:
                count += n
                gpus += n * len(self.jobs[ends[-1][1]].placement.gpus)
        return count, gpus

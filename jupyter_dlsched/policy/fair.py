"""Dominant-resource fair share between owners (people, notebooks), with weights.

Each owner's share is its largest fraction of any one resource held by its
running jobs (GPUs, CPU cores, memory), divided by its weight. The next job to
start is the first job that fits of the owner with the smallest share, so a
person with one job is not stuck behind someone who queued fifty (Ghodsi et
al., "Dominant Resource Fairness", NSDI'11).

It also remembers: the GPU-seconds an owner's finished jobs used count
against it, decayed with a half-life (SLURM's ``PriorityDecayHalfLife``), so
someone who used the machine all of last night waits behind someone who did
not, and what was used a month ago is all but forgotten.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from operator import attrgetter
from typing import Any

from ..vocab.resources import Capacity, Request
from .base import (
    Decisions,
    FinishedJob,
    PresortedQueue,
    QueuedJob,
    Room,
    RunningJob,
    Start,
    gpu_only,
    nothing_fits,
    presorted,
    shapes_of,
    smallest_size,
    submit_order,
)
from .shortfall import Shortfalls, describe_shortfall


@dataclass
class FairPolicy:
    """Smallest weighted dominant share first; submit order within an owner.

    Parameters (defaults shown):

    * ``weights={}``: owner -> weight; a weight of 2 entitles an owner to twice
      the share of someone with weight 1;
    * ``default_weight=1.0``: the weight of owners not named in ``weights``;
    * ``half_life=7 days``: seconds after which the GPU-seconds of an owner's
      finished jobs count half against it; holding every GPU for one half-life
      weighs as much as holding all of them now. ``None``: no memory, only
      what runs now counts.

    Never preempts: fairness is restored as running jobs end.

    >>> FairPolicy(weights={"ana": 2}).weight("ana")
    2.0
    """

    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    half_life: float | None = 7 * 86400.0
    window: int = 2000
    name: str = "fair"
    # owner -> (decayed GPU-seconds, as of this time)
    _used: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)

    def weight(self, owner: str) -> float:
        return float(self.weights.get(owner, self.default_weight)) or 1e-9

    def learn(self, finished: list[FinishedJob], replace: bool = False) -> None:
        """Take in jobs that finished (each once): their GPU-seconds count against their
        owners, decaying from the moment they finished."""
        if not self.half_life:
            return
        if replace:
            self._used = {}
        for job in finished:
            if job.size > 0 and math.isfinite(job.size):
                value, at = self._used.get(job.owner, (0.0, job.finished))
                if job.finished >= at:
                    value, at = self._decay(value, job.finished - at) + job.size, job.finished
                else:
                    value += self._decay(job.size, at - job.finished)
                self._used[job.owner] = (value, at)

    def used(self, owner: str, now: float) -> float:
        """The decayed GPU-seconds of ``owner``'s finished jobs at ``now``."""
        value, at = self._used.get(owner, (0.0, now))
        return self._decay(value, max(0.0, now - at))

    def _decay(self, value: float, elapsed: float) -> float:
        return value * 0.5 ** (elapsed / self.half_life) if self.half_life else value

    # -- the head of a deep queue (see PresortedQueue) ------------------------------------

    def lane_layout(self) -> Hashable:
        return ("fair",)

    def lane(self, job: QueuedJob) -> tuple[Hashable, Any]:
        return job.owner, job.seq

    def head(
        self, lanes: Mapping[Hashable, Sequence[QueuedJob]], now: float, k: int
    ) -> PresortedQueue | None:
        """Each owner's first ``k`` jobs, in submit order (an owner's jobs start in that order)."""
        jobs = sorted((j for owned in lanes.values() for j in islice(owned, k)), key=submit_order)
        cut = frozenset(owner for owner, owned in lanes.items() if len(owned) > k)
        return PresortedQueue(jobs, key=submit_order, in_order=True, cut=cut)

    def line(
        self,
        lanes: Mapping[Hashable, Sequence[QueuedJob]],
        decided: Decisions,
        head: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        left: Capacity,
        now: float,
    ) -> tuple[Sequence[QueuedJob], Callable[[QueuedJob], str]]:
        """The whole queue in the order a decision over it gives (``Decisions.order``: the
        starts, then the owners' jobs by their share once those started, then submit
        order), and why a waiting job ``decided`` did not look at waits, after ``decided``:
        a settled decision on ``head``, which left ``left`` free."""
        totals = _totals(left)
        usage: dict[str, list[float]] = {}
        for r in running:
            _add(usage, r.owner, r.request, r.placement.cpu_share)
        by_id = {j.id: j for j in head}
        for s in decided.starts:
            job = by_id[s.job_id]
            _add(usage, job.owner, job.request, s.placement.cpu_share)
        shares: dict[float, list[Sequence[QueuedJob]]] = {}
        for owner, jobs in lanes.items():
            shares.setdefault(self._share(str(owner), usage, totals, now), []).append(jobs)
        order = [by_id[s.job_id] for s in decided.starts]
        started = {s.job_id for s in decided.starts}
        for level in sorted(shares):
            same = shares[level]
            merged = same[0] if len(same) == 1 else sorted(chain(*same), key=attrgetter("seq"))
            order.extend([j for j in merged if j.id not in started] if started else merged)
        return order, Shortfalls(left)

    def _share(
        self,
        owner: str,
        usage: dict[str, list[float]],
        totals: tuple[float, float, float],
        now: float,
    ) -> float:
        """``owner``'s weighted dominant share: what its jobs hold now and its decayed past."""
        used = usage.get(owner, [0.0, 0.0, 0.0])
        now_share = max(u / t for u, t in zip(used, totals, strict=True))
        scale = totals[0] * self.half_life if self.half_life else 0.0
        past = self.used(owner, now) / scale if scale and owner in self._used else 0.0
        return (now_share + past) / self.weight(owner)

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        out = Decisions()
        room = Room(capacity)
        lean = presorted(queued, submit_order) and gpu_only(queued)
        if lean and room.whole < smallest_size(queued):
            return out
        shapes = shapes_of(queued)
        if shapes is not None and nothing_fits(room, shapes):
            out.settled = True
            return out
        totals = _totals(capacity)
        usage: dict[str, list[float]] = {}
        for r in running:
            _add(usage, r.owner, r.request, r.placement.cpu_share)
        by_owner: dict[str, list[QueuedJob]] = {}
        ordered = queued if presorted(queued, submit_order) else sorted(queued, key=submit_order)
        for job in ordered:
            by_owner.setdefault(job.owner, []).append(job)
        cut: frozenset[str] = getattr(queued, "cut", frozenset())  # owners with jobs behind a head
        if cut - by_owner.keys():
            # an owner whose jobs in the head were all held back (a limit, unstaged data) has
            # others behind it that this call cannot see: it may not settle
            shapes = None

        def share(owner: str) -> float:
            return self._share(owner, usage, totals, now)

        heap = [(share(o), jobs[0].seq, o) for o, jobs in by_owner.items()]
        heapq.heapify(heap)
        position = dict.fromkeys(by_owner, 0)
        while heap and not (lean and room.whole == 0):
            _, _, owner = heapq.heappop(heap)
            jobs = by_owner[owner]
            i = position[owner]
            full = False
            while i < len(jobs):
                # a job that did not fit will not fit later in this call: room only shrinks
                placement = room.place(jobs[i].request)
                i += 1
                if placement is not None:
                    room.take(placement)
                    out.starts.append(Start(jobs[i - 1].id, placement))
                    _add(usage, owner, jobs[i - 1].request, placement.cpu_share)
                    full = shapes is not None and nothing_fits(room, shapes)
                    break
            if full:
                out.settled = True
                break
            position[owner] = i
            if i < len(jobs):
                heapq.heappush(heap, (share(owner), jobs[i].seq, owner))
            elif owner in cut:
                break  # the next of this owner's jobs is behind the head: not settled
        if not lean:
            started = {s.job_id for s in out.starts}
            final = {owner: share(owner) for owner in by_owner}
            rest = sorted(
                (j for j in ordered if j.id not in started),
                key=lambda j: (final[j.owner], j.seq),
            )
            out.order = [s.job_id for s in out.starts] + [j.id for j in rest]
            for job in rest:
                out.waiting[job.id] = describe_shortfall(job.request, room.capacity)
        return out


def _totals(capacity: Capacity) -> tuple[float, float, float]:
    """The pool's GPUs, CPU cores and memory: what a dominant share is a fraction of."""
    return (
        float(len(capacity.gpus)) or 1.0,
        float(capacity.cpus_total) or 1.0,
        float(capacity.mem_total) or 1.0,
    )


def _add(usage: dict[str, list[float]], owner: str, request: Request, cpus: float) -> None:
    used = usage.setdefault(owner, [0.0, 0.0, 0.0])
    used[0] += request.gpus
    used[1] += cpus
    used[2] += request.mem

"""The shared engine of queue-order policies: rank the queue, start what fits, preempt.

A ranked policy gives every queued job a key (``queue_key``, smaller first)
that does not change while the job waits, starts jobs in that order while they
fit (skipping a job that does not fit, unless ``skip`` is off), and, when
``preempt`` is on, lets a waiting job stop running jobs of a strictly worse
*rank* when that frees enough room for it. ``fifo``, ``sjf``, ``srtf``,
``las`` and ``gittins`` are ranked policies that differ only in their keys.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import Any

from ..resources import Capacity, Placement
from .base import (
    Decisions,
    GangRoom,
    Preempt,
    PresortedQueue,
    QueuedJob,
    Room,
    RunningJob,
    Start,
    describe_shortfall,
    gpu_only,
    nothing_fits,
    presorted,
    shapes_of,
    smallest_size,
    submit_order,
)
from .ranks import RunningRanks


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

    def rank_margin(self, job: RunningJob) -> float:
        """How much better, in rank units, a waiting job must rank to stop ``job``.

        Stopping a job costs it a restart (``restart_cost`` seconds on each of its
        GPUs): a preemption only pays when the waiting job is shorter by more than
        that. ``0`` for ranks that are not in GPU-seconds (``las`` levels).
        """
        return 0.0

    def _guard(
        self, victims: list[tuple[float, int, RunningJob]], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        """``victims`` without jobs inside their minimum run time, each ranked better by its
        restart margin; and when the first protected job may be stopped."""
        min_run = float(getattr(self, "min_run", 0.0))
        if min_run <= 0 and float(getattr(self, "restart_cost", 0.0)) <= 0:
            return victims, None
        guarded = []
        until = math.inf
        for item in victims:
            r = item[2]
            free_at = r.started + min_run
            if min_run > 0 and now < free_at:
                until = min(until, free_at)
                continue
            margin = self.rank_margin(r)
            guarded.append((item[0] + margin, item[1], r) if margin else item)
        return guarded, (None if until == math.inf else until)

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

    def running_ranks(self) -> RunningRanks | None:
        """An index of running jobs by rank that a caller may keep for this policy, if any."""
        return None

    def promotes(self) -> bool:
        """Whether a starvation guard may promote jobs (``promote_after`` or ``promote_factor``)."""
        return (
            getattr(self, "promote_after", None) is not None
            or getattr(self, "promote_factor", None) is not None
        )

    def promote_at(self, job: QueuedJob | RunningJob) -> float:
        """When ``job`` goes ahead of every job not yet promoted (``inf``: never)."""
        after = getattr(self, "promote_after", None)
        return job.submitted + after if after is not None else math.inf

    # -- the head of a deep queue (see PresortedQueue) ------------------------------------

    def lane_layout(self) -> Hashable:
        return (type(self).__name__, repr(self))

    def lane(self, job: QueuedJob) -> tuple[Hashable, Any]:
        return (), self.queue_key(job)

    def head(
        self, lanes: Mapping[Hashable, Sequence[QueuedJob]], now: float, k: int
    ) -> PresortedQueue | None:
        """The first ``k`` jobs by ``queue_key``; ``None`` for a policy that preempts, promotes
        by age or learns (those look at the whole queue, or re-rank it, at each decision)."""
        if (
            self.preempt
            or self.promotes()
            or callable(getattr(self, "learn", None))
            or getattr(self, "oracle", False)
        ):
            return None
        return PresortedQueue(islice(lanes.get((), ()), k), key=self.queue_key, in_order=True)

    def line(
        self,
        lanes: Mapping[Hashable, Sequence[QueuedJob]],
        decided: Decisions,
        head: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        left: Capacity,
        now: float,
    ) -> tuple[Sequence[QueuedJob], Callable[[QueuedJob], str]] | None:
        """The whole queue in the order a decision over it would give (``Decisions.order``),
        and why a waiting job it did not look at waits, after ``decided``: a settled
        decision on the head of the queue, which left ``left`` free. A ranked queue's lane
        is its order; what blocks a strict queue is its first waiting job.
        ``None`` where ``head`` offers none."""
        if self.head({}, now, 0) is None:
            return None
        order = lanes.get((), ())
        if self.skip:
            return order, lambda job: describe_shortfall(job.request, left)
        started = {s.job_id for s in decided.starts}
        first = next((job for job in order if job.id not in started), None)
        behind = "" if first is None else self.blocked_reason(first)

        def explain(job: QueuedJob) -> str:
            return describe_shortfall(job.request, left) if job is first else behind

        return order, explain

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
        promote_after = 0.0 if self.promotes() else None
        promoted: set[str] = set()  # waiting jobs that go first, oldest first
        protected: set[str] = set()  # running jobs nobody may preempt
        promotion: float | None = None
        if promote_after is not None and ordered:
            ordered, promotion = self._promote(ordered, running, capacity, now, promoted, protected)
        ranks = getattr(running, "ranks", None)
        if (
            self.preempt
            and ordered
            and lean
            and promote_after is None
            and ranks is not None
            and ranks.covers(self, running)
        ):
            self._decide_by_index(queued, ordered, running, ranks, capacity, now, out)
        elif self.preempt and ordered:
            victims, wake = self.rank_running(running, now)
            victims, free_at = self._guard(victims, now)
            wake = _earliest(wake, free_at)
            if protected:
                victims = [v for v in victims if v[2].id not in protected]
            first = ordered[0]
            best = -math.inf if first.id in promoted else self.queued_rank(first)
            # the GPUs of stopping jobs are free in the plan: a waiting job they make room for
            # keeps them, where first fit would start a worse job there only to stop it
            if (victims and best < max(-v[0] for v in victims)) or any(r.stopping for r in running):
                smallest = smallest_size(queued) if lean else 0
                self._plan_by_rank(ordered, running, victims, capacity, out, promoted, smallest)
            else:
                self._first_fit(queued, ordered, capacity, lean, out)
            if wake is not None:
                out.wake_at = wake
        else:
            self._first_fit(queued, ordered, capacity, lean, out)
        if promotion is not None and promotion > now:
            out.wake_at = promotion if out.wake_at is None else min(out.wake_at, promotion)
        return out

    def _decide_by_index(
        self,
        queued: Sequence[QueuedJob],
        ordered: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        ranks: RunningRanks,
        capacity: Capacity,
        now: float,
        out: Decisions,
    ) -> None:
        """The decision of ``__call__``, with running jobs ranked by a kept index.

        Until a waiting job is planned over victims, planning by rank starts
        exactly the jobs first fit starts (a started job takes only free GPUs,
        which no running job holds). So the pool is planned in full only when
        some waiting job that does not fit now would fit once every victim
        ranked worse than it let go; otherwise first fit is the plan.
        """
        smallest = smallest_size(queued)
        free_at: float | None = None
        # the index counts every victim; the minimum run time and restart margins only
        # protect more of them, so where it says nobody would be stopped and nobody is
        # stopping (whose GPUs a waiting job may be planned on), first fit is the plan
        if ranks.stopping_gpus == 0 and ranks.worse(self.queued_rank(ordered[0]), now)[0] == 0:
            self._first_fit(queued, ordered, capacity, True, out)
        elif self._first_fit_unless_planned(ordered, ranks, capacity, now, smallest, out):
            victims, _ = self.rank_running(running, now)
            victims, free_at = self._guard(victims, now)
            if self._plan_reaches(ordered, victims, capacity, ranks.stopping_gpus, smallest):
                room = GangRoom if _indexed(capacity.gpus) else Room
                self._plan_by_rank(ordered, running, victims, capacity, out, set(), smallest, room)
            else:
                # the minimum run time and restart margins protect enough of the victims
                # the index counted that no waiting job can be planned over the rest
                self._first_fit(queued, ordered, capacity, True, out)
        out.wake_at = _earliest(ranks.wake(now), free_at)

    def _plan_reaches(
        self,
        ordered: Sequence[QueuedJob],
        victims: list[tuple[float, int, RunningJob]],
        capacity: Capacity,
        stopping_gpus: int,
        smallest: int,
    ) -> bool:
        """Whether planning by rank over ``victims`` (as guarded: ``(-(rank - margin), -seq,
        job)``) would plan some waiting job over victims, so differ from first fit.

        The test of ``_first_fit_unless_planned`` with the victims that may really be
        stopped: a job that does not fit now is planned only when the GPUs free now,
        those of stopping jobs and those of victims ranked strictly worse than it are
        enough (``_plan_by_rank`` keeps the others before it places the job).
        """
        ranked = sorted((-v[0], v[2].request.whole_gpus) for v in victims)
        ranks = [r for r, _ in ranked]
        worse_gpus = [0] * (len(ranked) + 1)
        for i in range(len(ranked) - 1, -1, -1):
            worse_gpus[i] = worse_gpus[i + 1] + ranked[i][1]
        room = Room(capacity)
        blocked = False
        for job in ordered:
            worse = worse_gpus[bisect.bisect_right(ranks, self.queued_rank(job))]
            reachable = room.whole + stopping_gpus + worse
            if reachable < smallest:
                break
            if blocked and not self.skip:
                break
            placement = room.place(job.request)
            if placement is None:
                if job.request.whole_gpus <= reachable:
                    return True
                blocked = True
                continue
            room.take(placement)
        return False

    def _first_fit_unless_planned(
        self,
        ordered: Sequence[QueuedJob],
        ranks: RunningRanks,
        capacity: Capacity,
        now: float,
        smallest: int,
        out: Decisions,
    ) -> bool:
        """First fit into ``out``; True (and nothing in ``out``) if planning by rank would differ.

        A waiting job that does not fit now is planned when the GPUs free now, those
        of stopping jobs and those of victims ranked worse than it are enough. Those
        can only shrink further down the queue, so the walk ends once they are fewer
        than the smallest job asks for.
        """
        room = Room(capacity)
        starts: list[Start] = []
        blocked = False
        last: float | None = None
        worse = 0
        for job in ordered:
            rank = self.queued_rank(job)
            if rank != last:
                last, worse = rank, ranks.worse(rank, now)[1]
            reachable = room.whole + ranks.stopping_gpus + worse
            if reachable < smallest:
                break
            if blocked and not self.skip:
                break
            placement = room.place(job.request)
            if placement is None:
                if job.request.whole_gpus <= reachable:
                    return True
                blocked = True
                continue
            room.take(placement)
            starts.append(Start(job.id, placement))
        out.starts.extend(starts)
        return False

    def _promote(
        self,
        ordered: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
        promoted: set[str],
        protected: set[str],
    ) -> tuple[Sequence[QueuedJob], float | None]:
        """The starvation guard: jobs past their ``promote_at`` go first, oldest first.

        With ``promote_share`` below 1 they hold at most that share of the GPUs
        (running promoted jobs count first): a lane in submit order for the
        oldest jobs beside the ranked order, like a multi-level feedback queue
        whose aged jobs get a bounded share, so the tail is bounded without
        handing the whole pool to a backlog of old jobs. Returns the new order
        and when the next waiting job is promoted.
        """
        share = float(getattr(self, "promote_share", 1.0))
        budget = share * len(capacity.gpus) if share < 1 else math.inf
        for r in sorted((r for r in running if self.promote_at(r) <= now), key=lambda r: r.seq):
            if r.request.gpus > budget:
                break
            budget -= r.request.gpus
            protected.add(r.id)
        due = [(self.promote_at(j), j) for j in ordered]
        old = sorted((j for at, j in due if at <= now), key=submit_order)
        for j in old:
            if j.request.gpus > budget:
                break
            budget -= j.request.gpus
            promoted.add(j.id)
        later = [at for at, j in due if at > now]
        promotion = min(later) if later else None
        if promoted:
            return [j for j in old if j.id in promoted] + [
                j for j in ordered if j.id not in promoted
            ], promotion
        return ordered, promotion

    def _first_fit(
        self,
        queued: Sequence[QueuedJob],
        ordered: Sequence[QueuedJob],
        capacity: Capacity,
        lean: bool,
        out: Decisions,
    ) -> None:
        """Start jobs in queue order while they fit; nobody is preempted."""
        room = Room(capacity)
        waiting: list[QueuedJob] = []
        blocked: QueuedJob | None = None
        # lean: count the sizes still waiting, to stop as soon as none of them fits
        sizes = dict(queued.sizes) if lean and queued.sizes else {}  # type: ignore[attr-defined]
        smallest = smallest_size(queued) if lean else 0
        shapes = shapes_of(queued)
        if shapes is not None and nothing_fits(room, shapes):
            out.settled = True
            return
        for job in ordered:
            if lean and room.whole < smallest:
                break  # nothing further can start: leave the rest unexamined
            if blocked is not None and not self.skip:
                if lean or shapes is not None:
                    out.settled = shapes is not None
                    break  # strict order: nothing behind a blocked head starts
                waiting.append(job)
                continue
            placement = room.place(job.request)
            if placement is None:
                waiting.append(job)
                blocked = blocked or job
                continue
            room.take(placement)
            out.starts.append(Start(job.id, placement))
            if shapes is not None and nothing_fits(room, shapes):
                out.settled = True
                break
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

    def _plan_by_rank(
        self,
        ordered: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        victims: list[tuple[float, int, RunningJob]],
        capacity: Capacity,
        out: Decisions,
        promoted: set[str],
        smallest: int,
        room: type[Room] | type[GangRoom] = Room,
    ) -> None:
        """Choose the jobs that should hold the pool, by rank, then act on the difference.

        Queued jobs and possible victims are walked together, best rank first (a
        running job before a queued one of equal rank, so equals never stop each
        other). Each takes its share of a plan of the pool in which every possible
        victim has let go; a running job whose devices a better-ranked job took is
        preempted. A planned job starts at once if it fits in what is free now,
        else it waits for its victims. So a lower-ranked job never takes devices a
        higher-ranked one needs (textbook SRTF / LAS), and nobody is stopped for a
        job that could not start anyway.
        """
        now_room = room(capacity)
        plan = room(capacity)
        for r in running:
            if r.stopping:
                plan.give_back(r.placement)
        for _, _, r in victims:
            plan.give_back(r.placement)
        holders = sorted(((-v[0], -v[1]), v[2]) for v in victims)
        started: set[str] = set()
        displaced: list[RunningJob] = []
        planned_for: dict[str, str] = {}
        h = 0
        blocked = False
        lean = smallest > 0
        for job in ordered:
            if lean and plan.whole < smallest:
                break
            rank = -math.inf if job.id in promoted else self.queued_rank(job)
            while h < len(holders) and holders[h][0][0] <= rank:
                _keep_or_displace(holders[h][1], plan, displaced)
                h += 1
            if blocked and not self.skip:
                break
            placement = now_room.place(job.request)
            if placement is not None and _fits(plan, placement):
                now_room.take(placement)
                plan.take(placement)
                out.starts.append(Start(job.id, placement))
                started.add(job.id)
                continue
            planned = _place_sparing(plan, job.request, holders, h)
            if planned is None:
                blocked = True
                continue
            plan.take(planned)
            _reserve(now_room, planned)
            planned_for[job.id] = "waiting for preempted jobs to stop"
        while h < len(holders):
            _keep_or_displace(holders[h][1], plan, displaced)
            h += 1
        for r in displaced:
            out.preempts.append(Preempt(r.id, f"ranked below waiting jobs ({self.name})"))
        out.waiting.update(planned_for)
        if not lean:
            out.order = [j.id for j in ordered]
            for job in ordered:
                if job.id not in started and job.id not in planned_for:
                    out.waiting[job.id] = describe_shortfall(job.request, now_room.capacity)


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


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _place_sparing(
    plan: Room | GangRoom,
    request: Any,
    holders: list[tuple[tuple[float, int], RunningJob]],
    h: int,
) -> Placement | None:
    """Where ``request`` goes in ``plan``, displacing the worst-ranked holders it must.

    ``holders[h:]`` are running jobs ranked worse than the job, not yet placed in
    the plan. A placement anywhere in the plan would land on whichever of their
    devices comes first, so a job that keeps its rank could be stopped while a
    worse one keeps running; so their devices count as taken, and the worst are
    handed back one by one until the job fits.
    """
    if plan.place(request) is None:
        return None
    trial = plan.copy()
    taken: list[Placement] = []
    for _, r in holders[h:]:
        if _fits(trial, r.placement):
            trial.take(r.placement)
            taken.append(r.placement)
    whole = request.whole_gpus
    while True:
        if trial.whole >= whole:
            spot = trial.place(request)
            if spot is not None:
                return spot
        if not taken:
            return plan.place(request)
        trial.give_back(taken.pop())


def _fits(room: Room | GangRoom, placement: Placement) -> bool:
    """Whether ``placement``'s devices are all still free in ``room``."""
    gpus = room.gpus
    by_index = {g.index: g for g in gpus} if not room.indexed else None
    for i, mem in zip(placement.gpus, placement.gpu_mem, strict=False):
        g = gpus[i] if by_index is None else by_index.get(i)
        if g is None:
            return False
        if placement.shared:
            if g.mem_free < mem:
                return False
        elif g.jobs:
            return False
    return True


def _indexed(gpus: Sequence[Any]) -> bool:
    return all(g.index == i for i, g in enumerate(gpus))


def _keep_or_displace(job: RunningJob, plan: Room | GangRoom, displaced: list[RunningJob]) -> None:
    """A running job keeps its devices in the plan if nobody better-ranked took them."""
    if _fits(plan, job.placement):
        plan.take(job.placement)
    else:
        displaced.append(job)


def _reserve(room: Room | GangRoom, planned: Placement) -> None:
    """Hold back, in what is free now, the devices a job waiting for its victims will use."""
    gpus = room.gpus
    part = [
        (i, mem)
        for i, mem in zip(planned.gpus, planned.gpu_mem, strict=False)
        if i < len(gpus)
        and gpus[i].index == i
        and (gpus[i].mem_free >= mem if planned.shared else not gpus[i].jobs)
    ]
    if part:
        room.take(
            Placement(
                gpus=tuple(i for i, _ in part),
                gpu_mem=tuple(m for _, m in part),
                shared=planned.shared,
            )
        )

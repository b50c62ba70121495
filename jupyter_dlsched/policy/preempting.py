"""Preemption by rank: which running jobs a waiting job may stop, and the plan that says so.

A ranked policy that preempts puts waiting and running jobs on one scale
(``queued_rank``, ``running_rank``; smaller is more urgent). A waiting job may stop
running jobs of a strictly worse rank, and only when that frees enough room for it:
the plan walks both kinds of job best rank first, each taking its share of a pool in
which every possible victim has let go, and a running job whose devices a better job
took is preempted. A minimum run time and the restart cost (``min_run``,
``restart_cost``) protect a job that has just started or is nearly as good.

``RankedPreemption`` is the half of ``RankedPolicy`` that does this; the
module's ``_victims_for`` (the fewest worst-ranked victims that make room for one
job) is ``priority``'s choice of victims too.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from typing import Any

from ..vocab.resources import Capacity, Placement
from .base import Decisions, GangRoom, Preempt, QueuedJob, Room, RunningJob, Start
from .held_plan import HeldPlan
from .ranks import RunningRanks
from .shortfall import describe_shortfall


class RankedPreemption:
    """The ranks a preempting policy defines and the planning over them.

    A subclass defines the two rank methods and has the fields ``name`` and
    ``skip`` (whether a job that does not fit lets the jobs behind it go first).
    """

    name: str
    skip: bool
    #: whether ``rank_margin`` counts the waiting jobs a restart holds back (``delayed``)
    margin_counts_queue = False

    def queued_rank(self, job: QueuedJob) -> float:
        """How urgent a waiting job is for preemption (smaller is more urgent)."""
        raise NotImplementedError

    def running_rank(self, job: RunningJob, now: float) -> float:
        """The same scale for a running job at ``now``: a victim ranks strictly worse."""
        raise NotImplementedError

    def next_change(self, job: RunningJob, now: float) -> float | None:
        """When ``job``'s running rank next changes, if it changes on its own."""
        return None

    def rank_margin(self, job: RunningJob, delayed: float = 0.0) -> float:
        """How much better, in rank units, a waiting job must rank to stop ``job``.

        Stopping a job costs it a restart (``restart_cost`` seconds on each of its
        GPUs): a preemption only pays when the waiting job is shorter by more than
        that. ``delayed`` is how many waiting jobs ranked after ``job`` the restart
        also holds back (each by its share of the pool: its GPUs over the pool's),
        for a policy whose margin counts them. ``0`` for ranks that are not in
        GPU-seconds (``las`` levels).
        """
        return 0.0

    def _guard(
        self,
        victims: list[tuple[float, int, RunningJob]],
        now: float,
        ordered: Sequence[QueuedJob] = (),
        pool: int = 1,
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        """``victims`` without jobs inside their minimum run time, each ranked better by its
        restart margin; and when the first protected job may be stopped. ``ordered`` (the
        waiting jobs) and ``pool`` (GPUs in all) tell a margin whom a restart holds back."""
        min_run = float(getattr(self, "min_run", 0.0))
        if min_run <= 0 and float(getattr(self, "restart_cost", 0.0)) <= 0:
            return victims, None
        # ranks of the waiting jobs, where the margin counts those a restart holds back
        waiting = (
            sorted(self.queued_rank(j) for j in ordered)
            if self.margin_counts_queue and ordered and victims
            else None
        )
        n, share, after = len(waiting or ()), max(pool, 1), bisect.bisect_right
        margin_of = self.rank_margin  # this loop runs over every running job before a plan
        guarded = []
        until = math.inf
        for item in victims:
            r = item[2]
            if min_run > 0:
                free_at = r.started + min_run
                if now < free_at:
                    until = min(until, free_at)
                    continue
            if waiting is None:
                margin = margin_of(r, 0.0)
            else:
                behind = n - after(waiting, -item[0])
                margin = margin_of(r, behind * max(r.request.gpus, 1.0) / share)
            guarded.append((item[0] + margin, item[1], r) if margin else item)
        return guarded, (None if until == math.inf else until)

    def _guarded_victims(
        self, running: Sequence[RunningJob], now: float, ordered: Sequence[QueuedJob], pool: int
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        """``_guard`` over ``rank_running``'s victims, without its wake-up time.

        A job inside its minimum run time is no victim whatever its rank, so only the
        others are ranked: with a long ``min_run`` (``gittins``) most running jobs are.
        """
        min_run = float(getattr(self, "min_run", 0.0))
        if min_run <= 0:
            victims, _ = self.rank_running(running, now)
            return self._guard(victims, now, ordered, pool)
        until = math.inf
        past: list[RunningJob] = []
        for r in running:
            if r.preemptible and not r.stopping:
                free_at = r.started + min_run
                if now < free_at:
                    until = min(until, free_at)
                    continue
            past.append(r)
        victims, _ = self.rank_running(past, now)
        victims, _ = self._guard(victims, now, ordered, pool)
        return victims, (None if until == math.inf else until)

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

    def _plan_reaches(
        self,
        ordered: Sequence[QueuedJob],
        holders: list[tuple[tuple[float, int], RunningJob]],
        capacity: Capacity,
        stopping_gpus: int,
        smallest: int,
    ) -> bool:
        """Whether planning by rank over the victims ``holders`` (as guarded, in
        ``_plan_by_rank``'s order: ``((rank - margin, seq), job)`` sorted) would plan some
        waiting job over victims, so differ from first fit.

        The test of ``_first_fit_unless_planned`` with the victims that may really be
        stopped: a job that does not fit now is planned only when the GPUs free now,
        those of stopping jobs and those of victims ranked strictly worse than it are
        enough (``_plan_by_rank`` keeps the others before it places the job).
        """
        # asked of a job or two per plan, mostly ranked worse than half the holders: the
        # holders are neither listed by rank nor summed in full for them
        worse_gpus = _GpusFrom(holders)
        room = Room(capacity)
        blocked = False
        for job in ordered:
            worse = worse_gpus(bisect.bisect_right(holders, self.queued_rank(job), key=_rank_of))
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
        guarded: bool = False,
    ) -> tuple[bool, bool]:
        """First fit into ``out``, unless planning by rank may differ: then ``(True, reaches)``
        and nothing in ``out``.

        A waiting job that does not fit now is planned when the GPUs free now, those
        of stopping jobs and those of victims ranked worse than it are enough. Those
        can only shrink further down the queue, so the walk ends once they are fewer
        than the smallest job asks for. The victims are those the index counts; with
        ``guarded`` the walk goes on over those the guard leaves (``guarded_worse``,
        never more), and ``reaches`` is ``_plan_reaches``' answer over them: the two
        walks are one, since the room is the same in both and the second can only say
        yes where the first did.
        """
        room = Room(capacity)
        starts: list[Start] = []
        blocked = planned = False
        last: float | None = None
        worse = spared = 0
        stopping = ranks.stopping_gpus
        for job in ordered:
            rank = self.queued_rank(job)
            if rank != last:
                last = rank
                if not planned:
                    worse = ranks.worse(rank, now)[1]
                if guarded:
                    spared = ranks.guarded_worse(rank, now) or 0
            free = room.whole + stopping
            if free + (spared if planned else worse) < smallest:
                break
            if blocked and not self.skip:
                break
            placement = room.place(job.request)
            if placement is None:
                need = job.request.whole_gpus
                if not planned and need <= free + worse:
                    if not guarded:
                        return True, False
                    planned = True
                if planned and need <= free + spared:
                    return True, True
                blocked = True
                continue
            room.take(placement)
            starts.append(Start(job.id, placement))
        if planned:
            return True, False
        out.starts.extend(starts)
        return False, False

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
        holders: list[tuple[tuple[float, int], RunningJob]] | None = None,
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
        if holders is None:
            holders = ranked_holders(victims)
        h = 0
        if room is GangRoom and ordered:
            # holders ranked no worse than the first waiting job take their devices back
            # before anything is placed, so nothing can have taken them (whole GPUs, apart
            # from each other's): they stay in the plan, counted as free until that moment
            best = -math.inf if ordered[0].id in promoted else self.queued_rank(ordered[0])
            while h < len(holders) and holders[h][0][0] <= best:
                h += 1
        # on whole GPUs the holders not yet passed stay held and count as free (HeldPlan);
        # elsewhere every holder ranked worse than the first waiting job lets go now
        lazy = HeldPlan(plan, holders, h) if isinstance(plan, GangRoom) else None
        held = 0 if lazy is None else lazy.gpus_before(h)
        if lazy is None:
            kept = {id(r) for _, r in holders[:h]}
            for _, _, r in victims:
                if id(r) not in kept:
                    plan.give_back(r.placement)
        started: set[str] = set()
        displaced: list[RunningJob] = []
        planned_for: dict[str, str] = {}
        blocked = False
        lean = smallest > 0
        for job in ordered:
            if lean and (plan.whole if lazy is None else lazy.whole) + held < smallest:
                break
            held = 0
            rank = -math.inf if job.id in promoted else self.queued_rank(job)
            if lazy is not None:
                lazy.pass_to(rank, displaced)
            while lazy is None and h < len(holders) and holders[h][0][0] <= rank:
                _keep_or_displace(holders[h][1], plan, displaced)
                h += 1
            if blocked and not self.skip:
                break
            # a job that fits in what is free now lands on no holder's GPUs
            placement = now_room.place(job.request)
            if placement is not None and _fits(plan, placement):
                now_room.take(placement)
                plan.take(placement)
                out.starts.append(Start(job.id, placement))
                started.add(job.id)
                continue
            if lazy is not None:
                found = lazy.place_sparing(job.request)
                planned = None if found is None else found[0]
                if found is not None:
                    lazy.take(*found)
            else:
                planned = _place_sparing(plan, job.request, holders, h)
                if planned is not None:
                    plan.take(planned)
            if planned is None:
                blocked = True
                continue
            _reserve(now_room, planned)
            planned_for[job.id] = "waiting for preempted jobs to stop"
        if lazy is not None:
            # nothing is placed after the last holders: the plan is not read again
            displaced.extend(lazy.displaced_rest())
        while lazy is None and h < len(holders):
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


class _GpusFrom:
    """Whole GPUs of ``holders[i:]``, summed from the back only as far as asked."""

    __slots__ = ("holders", "sums")

    def __init__(self, holders: list[tuple[tuple[float, int], RunningJob]]) -> None:
        self.holders = holders
        self.sums = [0]  # sums[k]: GPUs of the last k holders

    def __call__(self, i: int) -> int:
        holders, sums = self.holders, self.sums
        n = len(holders)
        while len(sums) <= n - i:
            sums.append(sums[-1] + holders[n - len(sums)][1].request.whole_gpus)
        return sums[n - i]


def _rank_of(holder: tuple[tuple[float, int], RunningJob]) -> float:
    return holder[0][0]


def ranked_holders(
    victims: list[tuple[float, int, RunningJob]],
) -> list[tuple[tuple[float, int], RunningJob]]:
    """``victims`` (``(-rank, -seq, job)``) best rank first, as ``((rank, seq), job)``."""
    return sorted(((-v[0], -v[1]), v[2]) for v in victims)


def _victims_for(
    job: QueuedJob,
    plan: Room | GangRoom,
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
    anywhere = plan.place(request)
    if anywhere is None:
        return None
    whole = request.whole_gpus
    trial = plan.copy()
    taken: list[Placement] = []
    for _, r in holders[h:]:
        if _fits(trial, r.placement):
            trial.take(r.placement)
            taken.append(r.placement)
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

"""The default policy: priority with aging, deadline tie-break, EASY backfill.

Order: effective priority (base priority plus ``aging_step`` points for every
``aging_interval`` seconds waited, so nothing starves), then earliest deadline,
then submit order. Jobs start in that order while they fit. The first job that
does not fit gets a reservation: the devices it will take when running jobs
end (their ``time_limit`` tells when). Jobs behind it may still start
(backfill) if they end before that moment, or if they only use what the
reservation leaves free, so a blocked big job is never delayed by small ones.
Preemptible jobs that started on learnt run times and would now keep it from
the start fifo would give it are taken back (``reclaim``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from operator import attrgetter
from typing import Any

from ..vocab.placement import place
from ..vocab.resources import EPS, Capacity, Placement, Request
from .base import (
    Decisions,
    FinishedJob,
    Preempt,
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
from .lane_line import LaneLine, Stretch
from .preempting import _victims_for
from .shortfall import Shortfalls, describe_shortfall
from .sizes import SizeModel

_DEADLINE_LANE = ("deadline",)


@dataclass
class PriorityPolicy:
    """Priority + aging + deadline + EASY backfill, with optional preemption.

    Parameters (all configuration, defaults shown):

    * ``aging_step=10``, ``aging_interval=600``: +10 priority per 10 minutes waited;
    * ``backfill=True``: let later jobs use resources a blocked job cannot use yet;
    * ``reserve_after=0``: seconds a blocked job must have waited before it
      holds resources back (its reservation); until then jobs behind it that
      fit simply start (first fit);
    * ``preempt=False``: a waiting job may stop running jobs that were submitted
      with ``preemptible=True`` and have a strictly lower base priority, when
      that lets it start (aging never triggers preemption, so equals never
      take turns stopping each other);
    * ``preempt_grace=30``: seconds a preempted job gets between SIGTERM and
      SIGKILL to checkpoint; it then waits as ``preempted``, keeping its
      priority and submit order;
    * ``learn_sizes=True``: a job without a ``time_limit`` is taken, for
      backfill, to run as long as ``estimate_quantile`` of the jobs of its
      owner and name (else its owner, else everyone) that finished before
      this decision; ``False``: such jobs have no known end, as before;
    * ``estimate_quantile=0.8``, ``window=2000``, ``group_min=3``: see ``SizeModel``;
    * ``end_quantile=0.5``: the quantile a job holding devices is expected to
      end at when a reservation is planned: the median, not the cautious
      ``estimate_quantile``, so a job that may start behind the reservation
      must end before the holders' likely end, not their late one (with one
      learnt length for all, a backfilled job then never outruns the job it
      waits on by estimate alone);
    * ``reserve_depth=4``: how many blocked jobs, in order, may hold devices
      back: the first always; each of the next ones that is wider than the
      first, since it needs some of the devices the first leaves to
      backfill, where one long job would hold it back long after the first
      started. ``1`` is plain EASY backfill;
    * ``reclaim=True``: jobs of the first blocked job's priority, submitted
      after it and ``preemptible``, that started while it waited (backfill's
      bet that the jobs it waits for end in time) are stopped, the latest
      started first, once the free devices and theirs would let it start:
      when plain fifo would have started it. Where the bet fails, it then
      waits no longer than under fifo. ``False``: it waits for them.

    >>> PriorityPolicy(preempt=True).preempt_grace
    30.0
    """

    aging_step: float = 10.0
    aging_interval: float = 600.0
    backfill: bool = True
    reserve_after: float = 0.0
    preempt: bool = False
    preempt_grace: float = 30.0
    learn_sizes: bool = True
    estimate_quantile: float = 0.8
    window: int = 2000
    group_min: int = 3
    end_quantile: float = 0.5
    reserve_depth: int = 4
    reclaim: bool = True
    name: str = "priority"
    #: backfill reads declared time limits (the simulator says when those are true durations)
    reads_time_limits = True
    _sizes: SizeModel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sizes = SizeModel(self.window, self.group_min, self.estimate_quantile)
        self._ends = SizeModel(self.window, self.group_min, self.end_quantile)

    def learn(self, finished: list[FinishedJob], replace: bool = False) -> None:
        """Take in jobs that finished (each once), for the estimates of jobs without limits."""
        if self.learn_sizes and self.backfill:
            self._sizes.learn(finished, replace=replace)
            self._ends.learn(finished, replace=replace)

    def length(self, owner: str, name: str, gpus: float, time_limit: float | None) -> float | None:
        """Seconds a job is expected to run: its ``time_limit``, else what was learnt."""
        if time_limit is not None:
            return time_limit
        return self._sizes.estimate(owner, name)

    def _behind(self, head: QueuedJob, now: float) -> Callable[[RunningJob], bool]:
        """Whether a running job of ``head``'s priority was submitted after it and would
        wait behind it if it waited again (its priority aged from its submission, as a
        preempted job's is). Jobs of other priorities are ``preempt``'s business."""
        ahead = self.sort_key(head, now)

        def behind(r: RunningJob) -> bool:
            if r.priority != head.priority or r.seq < head.seq:
                return False
            aged: float = r.priority
            if self.aging_interval > 0:
                waited = max(0.0, now - r.submitted)
                aged += self.aging_step * math.floor(waited / self.aging_interval)
            deadline = r.deadline if r.deadline is not None else math.inf
            return (-aged, deadline, r.seq) > ahead

        return behind

    def effective_priority(self, job: QueuedJob, now: float) -> float:
        if self.aging_interval <= 0:
            return float(job.priority)
        waited = max(0.0, now - job.submitted)
        return job.priority + self.aging_step * math.floor(waited / self.aging_interval)

    def sort_key(self, job: QueuedJob, now: float) -> tuple:
        deadline = job.deadline if job.deadline is not None else math.inf
        return (-self.effective_priority(job, now), deadline, job.seq)

    # -- the head of a deep queue (see PresortedQueue) ------------------------------------

    def lane_layout(self) -> Hashable:
        return ("priority", self.aging_interval > 0, self.preempt)

    def lane(self, job: QueuedJob) -> tuple[Hashable, Any]:
        """A job's lane and its place in it, neither changing while the job waits.

        Jobs of one base priority without a deadline keep their order as they
        age (the earlier submitted has aged as much or more, then submit order
        breaks ties; the ledger keeps submit times in submit order), so each
        such lane stays sorted; jobs with deadlines share a lane sorted again
        at each decision.
        """
        if job.deadline is not None:
            return _DEADLINE_LANE, job.seq
        if self.aging_interval > 0:
            return (job.priority,), (job.submitted, job.seq)
        return (job.priority,), job.seq

    def head(
        self, lanes: Mapping[Hashable, Sequence[QueuedJob]], now: float, k: int
    ) -> PresortedQueue | None:
        """The first ``k`` jobs of the queue in this policy's order at ``now``, merged from
        the lanes; ``None`` with preemption on (victims are chosen over the whole queue)."""
        if self.preempt:
            return None

        def key(job: QueuedJob) -> tuple:
            return self.sort_key(job, now)

        streams: list[Any] = [
            islice(jobs, k) for lane, jobs in lanes.items() if lane != _DEADLINE_LANE
        ]
        if lanes.get(_DEADLINE_LANE):
            streams.append(heapq.nsmallest(k, lanes[_DEADLINE_LANE], key=key))
        return PresortedQueue(islice(heapq.merge(*streams, key=key), k), key=key, in_order=True)

    def line(
        self,
        lanes: Mapping[Hashable, Sequence[QueuedJob]],
        decided: Decisions,
        head: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        left: Capacity,
        now: float,
    ) -> tuple[Sequence[QueuedJob], Callable[[QueuedJob], str]] | None:
        """The whole queue in this policy's order at ``now`` (``Decisions.order`` of a
        decision over it), and why a waiting job ``decided`` did not look at waits: a
        settled decision on the head, which left ``left`` free, so nothing further fits.
        Without backfill, jobs behind the first blocked one wait for it. ``None`` with
        preemption on (see ``head``)."""
        if self.preempt:
            return None
        order = self._merged(lanes, now)
        if self.backfill:
            return order, Shortfalls(left)
        started = {s.job_id for s in decided.starts}
        ahead: set[str] = set()  # up to the first job blocked long enough to hold the line
        first: QueuedJob | None = None
        for job in order:
            ahead.add(job.id)
            if job.id not in started and now - job.submitted >= self.reserve_after:
                first = job
                break
        behind = "" if first is None else f"behind {first.id} (higher in line)"

        def explain(job: QueuedJob) -> str:
            return describe_shortfall(job.request, left) if job.id in ahead else behind

        return order, explain

    def _merged(self, lanes: Mapping[Hashable, Sequence[QueuedJob]], now: float) -> LaneLine:
        """Every job of the lanes in ``sort_key`` order at ``now``, without a key per job.

        Along a lane of one base priority the effective priority only falls (the jobs
        further on have waited less), so each lane is a few runs of one effective
        priority, found by bisection; runs of equal priority from different lanes merge
        by submit order, and jobs with deadlines go first within their priority. A run
        that is the only one of its priority stays a stretch of its lane."""

        def rank(job: QueuedJob) -> float:
            return -self.effective_priority(job, now)

        runs: dict[float, list[Stretch]] = {}
        for lane, jobs in lanes.items():
            if lane == _DEADLINE_LANE:
                continue
            i = 0
            while i < len(jobs):
                level = rank(jobs[i])
                j = (
                    len(jobs)
                    if self.aging_interval <= 0
                    else bisect.bisect_right(jobs, level, lo=i, key=rank)
                )
                runs.setdefault(level, []).append(Stretch(lane, i, j))
                i = j
        due: dict[float, list[QueuedJob]] = {}
        for job in lanes.get(_DEADLINE_LANE, ()):
            due.setdefault(rank(job), []).append(job)
        pieces: list[Stretch | list[QueuedJob]] = []
        for level in sorted(runs.keys() | due.keys()):
            early = sorted(due.get(level, ()), key=lambda j: self.sort_key(j, now))
            late = [j for j in early if j.deadline == math.inf]  # ties with no deadline
            pieces.append([j for j in early if j.deadline != math.inf])
            same = runs.get(level, [])
            if len(same) == 1 and not late:
                pieces.append(same[0])
            elif same or late:
                merged = chain(late, *(islice(lanes[s.lane], s.start, s.stop) for s in same))
                pieces.append(sorted(merged, key=attrgetter("seq")))
        return LaneLine(lanes, pieces)

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        out = Decisions()
        # with one priority and no deadlines, aging keeps submit order
        fast = (
            presorted(queued, submit_order)
            and isinstance(queued, PresortedQueue)
            and queued.uniform_priority
        )
        lean = fast and gpu_only(queued)
        room = Room(capacity)
        if lean and room.whole < smallest_size(queued):
            return out
        shapes = shapes_of(queued)
        if shapes is not None and nothing_fits(room, shapes):
            out.settled = True
            return out
        in_order = fast or getattr(queued, "in_order", False)
        ordered = queued if in_order else sorted(queued, key=lambda j: self.sort_key(j, now))
        if not lean:
            out.order = [j.id for j in ordered]
        holders: list[tuple[float | None, Placement]] | None = None
        head: QueuedJob | None = None
        shadow: float | None = None
        protected = room
        ahead: list[QueuedJob] = []  # started before the head
        held = 1  # blocked jobs holding devices back
        for job in ordered:
            if lean and room.whole == 0:
                break
            if head is None:
                placement = room.place(job.request)
                if placement is not None:
                    room.take(placement)
                    out.starts.append(Start(job.id, placement))
                    ahead.append(job)
                    if shapes is not None and nothing_fits(room, shapes):
                        out.settled = True
                        break
                    continue
                out.waiting[job.id] = describe_shortfall(job.request, room.capacity)
                if now - job.submitted < self.reserve_after:
                    continue  # not waited long enough to hold resources back: first fit
                head = job
                if self.reclaim and self.backfill:
                    victims = _reclaim(job, running, room, self._behind(job, now))
                    if victims is not None:
                        for r in victims:
                            out.preempts.append(Preempt(r.id, f"for {job.id} (ahead in line)"))
                        out.waiting[job.id] = "waiting for jobs that went ahead to stop"
                        break  # nothing else starts until it has
                if not self.backfill:
                    if shapes is not None:
                        out.settled = True  # nothing behind the head starts
                        break
                    continue
                holders = [(self._expected_end(r, now), r.placement) for r in running]
                holders.extend(
                    (_end(now, self._likely_length(q)), s.placement)
                    for q, s in zip(ahead, out.starts, strict=True)
                )
                shadow, reserved = _reservation(job.request, room.capacity, holders, now)
                protected = Room(_protect(room.capacity, job.request, reserved))
                continue
            if not self.backfill:
                if not lean:
                    out.waiting[job.id] = f"behind {head.id} (higher in line)"
                continue
            length = self._length(job) if shadow is not None else None
            ends_in_time = length is not None and now + length <= shadow + EPS  # type: ignore[operator]
            placement = (room if ends_in_time else protected).place(job.request)
            if placement is None:
                if held < self.reserve_depth and holders is not None and protected.whole > 0:
                    held += 1
                    if job.request.whole_gpus > head.request.whole_gpus:
                        # it needs devices the head leaves to backfill: keep long jobs off
                        _, claim = _reservation(job.request, protected.capacity, holders, now)
                        protected = Room(_protect(protected.capacity, job.request, claim))
                if lean:
                    continue
                if room.place(job.request) is None:
                    out.waiting[job.id] = describe_shortfall(job.request, room.capacity)
                else:
                    out.waiting[job.id] = f"resources held for {head.id} (ahead in line)"
                continue
            room.take(placement)
            protected = Room(_take_clamped(protected.capacity, placement))
            out.starts.append(Start(job.id, placement))
            if shapes is not None and nothing_fits(room, shapes):
                out.settled = True
                break
        if self.preempt and head is not None and not fast:
            self._plan_preemptions(ordered, running, room, now, out)
        return out

    def _length(self, job: QueuedJob) -> float | None:
        return self.length(job.owner, job.name, job.request.gpus, job.time_limit)

    def _likely_length(self, job: QueuedJob | RunningJob) -> float | None:
        """Seconds a job holding devices is likely to run: its limit, else the learnt median."""
        if job.time_limit is not None:
            return job.time_limit
        return self._ends.estimate(job.owner, job.name)

    def _expected_end(self, job: RunningJob, now: float) -> float | None:
        length = self._likely_length(job)
        if length is None:
            return None
        # a job past its estimate is expected to end any moment, not in the past
        return max(job.started + length, now)

    def _plan_preemptions(
        self,
        ordered: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        room: Room,
        now: float,
        out: Decisions,
    ) -> None:
        """Stop lower-priority preemptible jobs for waiting jobs, highest in line first."""
        going = {p.job_id for p in out.preempts}  # stopped for the first blocked job
        victims = [
            (float(r.priority), -r.seq, r)
            for r in running
            if r.preemptible and not r.stopping and r.id not in going
        ]
        if not victims:
            return
        plan = room.copy()
        for r in running:
            if r.stopping or r.id in going:
                plan.give_back(r.placement)
        heapq.heapify(victims)  # lowest priority first, then the latest submitted
        started = {s.job_id for s in out.starts}
        for job in ordered:
            if not victims:
                return
            if job.id in started or job.priority <= victims[0][0]:
                continue
            placement = plan.place(job.request)
            if placement is not None:  # fits once jobs already stopping have left
                plan.take(placement)
                continue
            chosen = _victims_for(job, plan, victims, -job.priority)
            if chosen is None:
                continue
            for r in chosen:
                plan.give_back(r.placement)
                out.preempts.append(
                    Preempt(r.id, f"for {job.id} (priority {job.priority} > {r.priority})")
                )
            out.waiting[job.id] = "waiting for preempted jobs to stop"
            placement = plan.place(job.request)
            if placement is not None:
                plan.take(placement)


def _reclaim(
    head: QueuedJob,
    running: Sequence[RunningJob],
    room: Room,
    is_behind: Callable[[RunningJob], bool],
) -> list[RunningJob] | None:
    """The preemptible jobs behind ``head`` in line to stop so that it starts now, as
    plain fifo would have started it: ``None`` unless the whole GPUs free and those of
    jobs behind it (started on a bet that they would end in time) add up to what it
    asks. The latest started go first (they lose the least); jobs already stopping count
    as gone. An empty list: those stopping are enough, wait for them."""
    need = head.request.whole_gpus
    if not need or head.request.shared:
        return None
    plan = room.copy()
    for r in running:
        if r.stopping:
            plan.give_back(r.placement)
    behind = sorted(
        (r for r in running if not r.stopping and is_behind(r)),
        key=lambda r: -r.started,
    )
    if plan.whole + sum(r.request.whole_gpus for r in behind) < need:
        return None
    chosen: list[RunningJob] = []
    for r in behind:
        if plan.place(head.request) is not None:
            break
        if not r.preemptible:
            continue
        plan.give_back(r.placement)
        chosen.append(r)
    if plan.place(head.request) is None:
        return None
    return chosen


def _end(now: float, time_limit: float | None) -> float | None:
    return None if time_limit is None else now + time_limit


def _reservation(
    request: Request,
    capacity: Capacity,
    holders: list[tuple[float | None, Placement]],
    now: float,
) -> tuple[float | None, Placement | None]:
    """When and where ``request`` could start as known-ending jobs finish.

    A holder past its expected end counts as ending ``now``. Where the
    reservation must wait for a job still within its estimate anyway, it
    takes the devices of jobs past theirs only if it cannot do without them:
    the free devices it leaves go to jobs that may outrun it, and a job past
    its estimate may run for hours yet, so devices left on its strength
    would hold the reserved job back when the job it waits for ends on time
    or early. Where it waits for nothing but jobs past their estimate there
    is no likely time to keep free devices idle for, and it takes the first
    devices that fit.
    """
    future = capacity
    late: set[int] = set()  # devices of holders past their expected end
    for end, placement in sorted(
        ((e, p) for e, p in holders if e is not None), key=lambda item: item[0]
    ):
        future = future.give_back(placement)
        if end <= now:
            late.update(placement.gpus)
        spot = place(request, future)
        if spot is not None:
            if end > now and request.whole_gpus and late.intersection(spot.gpus):
                spot = _sparing(request, future, late) or spot
            return end, spot
    return None, None


def _sparing(request: Request, future: Capacity, late: set[int]) -> Placement | None:
    """A placement of ``request`` on ``future`` that takes devices in ``late`` last."""
    free = sorted(
        (g for g in future.gpus if g.whole_free), key=lambda g: (g.index in late, g.index)
    )
    keep = {g.index for g in free[: request.whole_gpus]}
    others_held = tuple(
        g if g.index in keep else replace(g, jobs=g.jobs + 1, mem_free=0) for g in future.gpus
    )
    return place(request, replace(future, gpus=others_held))


def _protect(capacity: Capacity, request: Request, reserved: Placement | None) -> Capacity:
    """Capacity left for jobs that may run past the reservation: the head's share withheld.

    With a known reservation the reserved devices are withheld; without one
    (running jobs have no time limit) the head keeps first claim on whatever
    it could use of what is free now.
    """
    if reserved is not None:
        gpu_ids = set(reserved.gpus)
    elif request.whole_gpus:
        gpu_ids = {g.index for g in capacity.gpus if g.whole_free}
        gpu_ids = set(sorted(gpu_ids)[: request.whole_gpus])
    elif request.shared:
        roomiest = max(capacity.gpus, key=lambda g: g.mem_free, default=None)
        gpu_ids = {roomiest.index} if roomiest is not None else set()
    else:
        gpu_ids = set()
    gpus = tuple(
        replace(
            g,
            jobs=g.jobs + 1,
            mem_free=(
                max(0, g.mem_free - request.gpu_mem_on(g.mem_total)) if request.shared else 0
            ),
        )
        if g.index in gpu_ids
        else g
        for g in capacity.gpus
    )
    withheld = Placement(
        cpus=tuple(range(len(capacity.cpu_load))),
        cpu_share=min(request.cpus, capacity.cpus_free),
        mem=min(request.mem, capacity.mem_free),
    )
    return _take_clamped(replace(capacity, gpus=gpus), withheld)


def _take_clamped(capacity: Capacity, placement: Placement) -> Capacity:
    """``capacity.take(placement)`` with nothing below zero (withheld room may be re-granted)."""
    taken = capacity.take(placement)
    granted = set(placement.gpus)
    if any(g.mem_free < 0 for g in taken.gpus if g.index in granted):
        taken = replace(
            taken,
            gpus=tuple(
                replace(g, mem_free=0) if g.mem_free < 0 and g.index in granted else g
                for g in taken.gpus
            ),
        )
    if taken.mem_free < 0:
        taken = replace(taken, mem_free=0)
    return taken

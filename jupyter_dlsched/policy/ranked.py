"""The shared engine of queue-order policies: rank the queue, start what fits, preempt.

A ranked policy gives every queued job a key (``queue_key``, smaller first)
that does not change while the job waits, starts jobs in that order while they
fit (skipping a job that does not fit, unless ``skip`` is off), and, when
``preempt`` is on, lets a waiting job stop running jobs of a strictly worse
*rank* when that frees enough room for it. ``fifo``, ``sjf``, ``srtf``,
``las`` and ``gittins`` are ranked policies that differ only in their keys.

This module holds the queue order, first fit and the starvation guard; the ranks
and the plan of who is preempted are ``jupyter_dlsched.policy.preempting``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import Any

from ..vocab.resources import Capacity
from .base import (
    Decisions,
    GangRoom,
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
from .preempting import RankedPreemption, ranked_holders
from .ranks import RunningRanks
from .shortfall import Shortfalls, describe_shortfall


class RankedPolicy(RankedPreemption):
    """Base class: subclasses define ``queue_key`` and, to preempt, the two rank methods
    (``RankedPreemption``).

    Subclasses are dataclasses with at least the fields ``name``, ``skip`` and
    ``preempt``.
    """

    name: str
    skip: bool
    preempt: bool

    def queue_key(self, job: QueuedJob) -> Any:
        raise NotImplementedError

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
        order = LaneLine(lanes, [Stretch((), 0, len(lanes.get((), ())))])
        if self.skip:
            return order, Shortfalls(left)
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
            victims, free_at = self._guard(victims, now, ordered, len(capacity.gpus))
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
        else:
            guarded = ranks.guard_known
            planned, reaches = self._first_fit_unless_planned(
                ordered, ranks, capacity, now, smallest, out, guarded
            )
            if planned:
                victims: list[tuple[float, int, RunningJob]] = []
                if guarded:
                    # the index keeps the victims the guard leaves too: rank them only to plan
                    free_at = ranks.protected_until(now)
                    if reaches:
                        victims, _ = self._guarded_victims(
                            running, now, ordered, len(capacity.gpus)
                        )
                else:
                    victims, free_at = self._guarded_victims(
                        running, now, ordered, len(capacity.gpus)
                    )
                holders = ranked_holders(victims)  # sorted once, for both
                if not guarded:
                    reaches = self._plan_reaches(
                        ordered, holders, capacity, ranks.stopping_gpus, smallest
                    )
                if reaches:
                    room = GangRoom if _indexed(capacity.gpus) else Room
                    self._plan_by_rank(
                        ordered, running, victims, capacity, out, set(), smallest, room, holders
                    )
                else:
                    # the minimum run time and restart margins protect enough of the victims
                    # the index counted that no waiting job can be planned over the rest
                    self._first_fit(queued, ordered, capacity, True, out)
        out.wake_at = _earliest(ranks.wake(now), free_at)

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


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _indexed(gpus: Sequence[Any]) -> bool:
    # asked before every full plan, of a pool's GPUs that change less often than that
    seen = _INDEXED.get(id(gpus))
    if seen is not None and seen[0] is gpus:
        return seen[1]
    if len(_INDEXED) > 64:
        _INDEXED.clear()
    answer = all(map(operator.eq, map(_index_of, gpus), range(len(gpus))))
    _INDEXED[id(gpus)] = (gpus, answer)  # holding the GPUs keeps their id theirs
    return answer


_INDEXED: dict[int, tuple[Sequence[Any], bool]] = {}
_index_of = operator.attrgetter("index")

"""Elastic jobs under a policy that ranks by remaining work: idle GPUs in rank order.

``ElasticPolicy`` shares idle GPUs by water-filling, which suits a policy that
does not know how long jobs run. For one that does (``grows_by_rank``: its
ranks are remaining GPU-seconds, as ``srtf``'s), water-filling is processor
sharing, which loses to serving the shortest job first: with linear speedup
two equal jobs on half the pool each both end when the second would have
ended alone. So there, idle GPUs go to the best-ranked elastic job first, as
many as pay (the time it saves against its restart and, where the speedup is
sub-linear, the GPU time the jobs ranked after it wait for), before a
worse-ranked job starts on them; an elastic job about to start waits where a
better-ranked one uses its GPUs in full; and a job lends the GPUs it borrowed
only to a waiting job ranked ahead of it by more than a restart costs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..vocab.resources import Capacity, Placement
from .base import Policy, QueuedJob, RunningJob
from .speedup import Speedup


@dataclass
class Grower:
    """One elastic job that may take idle GPUs in this decision."""

    id: str
    seq: int
    size: int
    most: int
    placement: Placement
    running: RunningJob | None  # None: starting now, so growing costs nothing
    owner: str = ""
    rank: float = 0.0  # the wrapped policy's rank, where it grows by rank
    left: float | None = None  # seconds still to run at ``size``, where known


class RankedGrowth:
    """The rank-ordered growth ``ElasticPolicy`` uses for a policy with ``grows_by_rank``."""

    _policy: Policy
    speedup: Speedup
    margin: float
    resize_every: float
    _restart_cost: float

    def _worth(self, job: RunningJob, old: int, new: int, now: float) -> bool:
        raise NotImplementedError

    def _grow_by_rank(
        self,
        growers: list[Grower],
        room: Capacity,
        ranks: list[float],
        now: float,
        budget: dict[str, float] | None = None,
    ) -> tuple[list[Grower], set[str]]:
        """The whole GPUs free in ``room`` to ``growers`` best-ranked first, each as many as
        pay (``_best_extra``), within ``budget``; those that grew, and the elastic jobs
        starting now that wait instead, their GPUs gone to better-ranked ones (with linear
        speedup, the shortest job on every GPU it can use finishes first and no one later).
        """
        free = [g for g in room.gpus if g.jobs == 0]
        pending = sum(g.size for g in growers if g.running is None)  # GPUs of later starts
        left = len(free) + pending
        pool = len(room.gpus)
        left_to = dict(budget or {})
        sizes: dict[str, int] = {}
        deferred: set[str] = set()
        for g in sorted(growers, key=lambda g: (g.rank, g.seq)):
            if g.running is None:
                pending -= g.size
                if g.size > left:
                    deferred.add(g.id)
                    continue
                left -= g.size
            most = min(g.most - g.size, left, int(left_to.get(g.owner, left)))
            if most > left - pending and not self._linear(g.size, g.size + most):
                most = max(0, left - pending)  # a later start waits only for full use of its GPUs
            extra = self._best_extra(g, most, ranks, pool, now) if most > 0 else 0
            if extra:
                sizes[g.id] = g.size + extra
                left -= extra
                if g.owner in left_to:
                    left_to[g.owner] -= extra
        for g in growers:
            if g.id in deferred:
                room = room.give_back(g.placement)
        free = [g for g in room.gpus if g.jobs == 0]
        grown = placed([g for g in growers if g.id in sizes], sizes, room, free)
        return grown, deferred

    def _linear(self, old: int, new: int) -> bool:
        """Whether ``new`` GPUs run a job ``new / old`` times as fast as ``old`` do."""
        return self.speedup.ratio(old, new) >= new / old - 1e-9

    def _ranks(
        self, queued: Sequence[QueuedJob], elastic_running: Sequence[RunningJob]
    ) -> list[float] | None:
        """The waiting jobs' ranks, sorted, for a policy that grows by rank and knows every
        job's remaining time (a replay); else ``None``: live jobs are shared out as usual."""
        if not getattr(self._policy, "grows_by_rank", False):
            return None
        if any(j.remaining is None for j in elastic_running):
            return None
        ranks = sorted(self._policy.queued_rank(q) for q in queued)  # type: ignore[attr-defined]
        return None if ranks and math.isinf(ranks[-1]) else ranks

    def _claim(
        self,
        queued: Sequence[QueuedJob],
        ranks: list[float],
        elastic_running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> list[Grower]:
        """For a policy whose ranks are remaining work: the running elastic jobs that grow
        into idle GPUs before a worse-ranked waiting job starts on them, where it pays."""
        free = [g for g in capacity.gpus if g.jobs == 0]
        policy = self._policy
        growers = (
            sorted(
                (
                    Grower(
                        j.id,
                        j.seq,
                        len(j.placement.gpus),
                        int(j.max_gpus or 0),
                        j.placement,
                        j,
                        j.owner,
                        policy.running_rank(j, now),  # type: ignore[attr-defined]
                        j.remaining_at(now),
                    )
                    for j in elastic_running
                    if not j.stopping
                    and now - j.started >= self.resize_every
                    and len(j.placement.gpus) < int(j.max_gpus or 0)
                ),
                key=lambda g: (g.rank, g.seq),
            )
            if free
            else []
        )
        if not growers:
            return []
        left, pool = len(free), len(capacity.gpus)
        sizes: dict[str, int] = {}
        gi = 0
        for job in [*queued, None]:  # waiting jobs in the policy's order
            rank = math.inf if job is None else policy.queued_rank(job)  # type: ignore[attr-defined]
            while gi < len(growers) and growers[gi].rank < rank and left > 0:
                g = growers[gi]
                extra = self._best_extra(g, min(g.most - g.size, left), ranks, pool, now)
                if extra:
                    sizes[g.id] = g.size + extra
                    left -= extra
                gi += 1
            if left <= 0 or gi >= len(growers) or job is None:
                break
            if job.request.whole_gpus <= left:  # it starts before the growers ranked after it
                left -= job.request.whole_gpus
        return placed([g for g in growers if g.id in sizes], sizes, capacity, free)

    def _best_extra(self, g: Grower, most: int, ranks: list[float], pool: int, now: float) -> int:
        """How many GPUs ``g`` gains most by taking (0: none pays). A growth saves ``g``
        time; it costs the restart and, where the speedup is sub-linear, GPU time that
        every waiting job ranked after ``g`` waits for, by its share of the pool. Ranks
        are remaining GPU-seconds: a growth that would rank ``g`` behind a waiting job
        (more GPU time where the speedup is sub-linear) is not taken, or that job would
        preempt it at once."""
        left = g.left
        if left is None:
            if g.running is None:
                return most
            return most if self._worth(g.running, g.size, g.size + most, now) else 0
        restart = 0.0 if g.running is None else self._restart_cost
        after_g = bisect.bisect_right(ranks, g.rank)
        behind = len(ranks) - after_g
        nxt = ranks[after_g] if behind else math.inf  # the next waiting job ranked after g
        best, gain = 0, (self.margin - 1.0) * restart
        for extra in range(1, most + 1):
            new = g.size + extra
            after = left / self.speedup.ratio(g.size, new) + restart
            if after * new > nxt:
                break
            spent = max(0.0, new * after - g.size * left)
            net = left - after - behind * spent / max(1, pool)
            if net > gain:
                best, gain = extra, net
        return best

    def _lends(self, job: RunningJob, ranks: list[float] | None, now: float) -> bool:
        """Whether ``job``'s borrowed GPUs are offered to waiting work: always, unless the
        policy grows by rank (``ranks``), knows ``job``'s, and no waiting job ranks ahead of
        it by more than a restart costs (a shrink would then cost more JCT than it saves)."""
        if ranks is None:
            return True
        policy = self._policy
        rank = policy.running_rank(job, now)  # type: ignore[attr-defined]
        if not math.isfinite(rank):
            return True
        margin = policy.rank_margin(job)  # type: ignore[attr-defined]
        return bool(ranks) and ranks[0] + margin < rank


def placed(
    growers: list[Grower], sizes: dict[str, int], room: Capacity, free: list[Any]
) -> list[Grower]:
    """``growers`` grown to ``sizes`` on cards of ``free`` (near their first GPU first)."""
    grown = []
    for g in sorted(growers, key=lambda g: g.seq):
        extra = sizes[g.id] - g.size
        if extra <= 0:
            continue
        first = g.placement.gpus[0] if g.placement.gpus else None
        group = next((c.group for c in room.gpus if c.index == first), None)
        free.sort(key=lambda c: (c.group != group, c.index))
        cards, free = free[:extra], free[extra:]
        placement = replace(
            g.placement,
            gpus=g.placement.gpus + tuple(c.index for c in cards),
            gpu_mem=g.placement.gpu_mem + tuple(c.mem_free for c in cards),
        )
        grown.append(replace(g, size=sizes[g.id], placement=placement))
    return grown

"""Oracle shortest remaining time first: the simulator's lower bracket.

Textbook preemptive SRTF, ranked by remaining GPU-time (remaining run time ×
GPUs; for gangs of GPUs this is Tiresias' "shortest remaining service
first"): at every moment the pool holds the jobs with the least remaining
GPU-time that fit, planned by rank, so a job never takes GPUs a better-ranked
one needs and a running job is stopped only for a strictly shorter one.

It needs every job's true remaining run time (``QueuedJob.remaining`` and
``RunningJob.remaining``), which only a simulator knows; live jobs without it
are ordered as if endless, in submit order. Use it to see how much room a
policy has left, not to run a real queue.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .base import QueuedJob, RunningJob
from .ranked import RankedPolicy
from .ranks import RemainingRanks, RunningRanks


@dataclass
class SrtfPolicy(RankedPolicy):
    """Least remaining GPU-time (remaining run time × GPUs) first, preemptive.

    Parameters (defaults shown):

    * ``preempt=True``: a waiting job stops running jobs with more remaining GPU-time;
    * ``preempt_grace=30``: seconds a preempted job gets to checkpoint;
    * ``restart_cost=30``: seconds a job loses when it starts again; a running job
      is stopped only for a job whose remaining GPU-time is smaller by more than
      that on each of the victim's GPUs, counted once for the victim and once for
      each waiting job ranked after it, in the victim's share of the pool (the
      restart delays them too): the JCT a preemption saves against what it costs;
    * ``min_run=0``: seconds a job runs before it can be preempted;
    * ``skip=True``: a job that fits starts even if one ahead does not.

    >>> from jupyter_dlsched.vocab.resources import Request
    >>> SrtfPolicy().queue_key(QueuedJob("a", 0, 0.0, Request(gpus=2), remaining=10.0))
    (20.0, 0)
    """

    preempt: bool = True
    preempt_grace: float = 30.0
    restart_cost: float = 30.0
    min_run: float = 0.0
    skip: bool = True
    name: str = "srtf"
    #: the restart margin counts the waiting jobs a restart holds back, not the victim alone
    margin_counts_queue = True
    #: it reads every job's true remaining run time: the simulator labels its rows "(oracle)"
    oracle = True
    #: its ranks are remaining GPU-seconds: elastic jobs get idle GPUs in rank order
    #: (``jupyter_dlsched.policy.elastic_ranks``), not shared out by water-filling
    grows_by_rank = True

    def queue_key(self, job: QueuedJob) -> tuple[float, int]:
        return (self.queued_rank(job), job.seq)

    def queued_rank(self, job: QueuedJob) -> float:
        if job.remaining is None:
            return math.inf
        return job.remaining * max(job.request.gpus, 1.0)

    def running_rank(self, job: RunningJob, now: float) -> float:
        left = job.remaining_at(now)
        if left is None:
            return math.inf
        return left * max(job.request.gpus, 1.0)

    def rank_margin(self, job: RunningJob, delayed: float = 0.0) -> float:
        # Stopping the victim for a shorter job saves that job the victim's remaining
        # time and costs the victim the shorter one's: the difference of their ranks.
        # The restart costs restart_cost more, to the victim and to every waiting job
        # ranked after it, which the victim's extra time on its GPUs holds back by its
        # share of the pool. On one GPU with n jobs behind the victim, a preemption
        # pays only when the ranks differ by more than restart_cost x (1 + n).
        return self.restart_cost * max(job.request.gpus, 1.0) * (1.0 + delayed)

    def rank_running(
        self, running: Sequence[RunningJob], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        # running_rank in one tight pass: this loop is the hot path
        victims: list[tuple[float, int, RunningJob]] = []
        for r in running:
            if not r.preemptible or r.stopping:
                continue
            if r.remaining is None:
                rank = math.inf
            else:
                left = max(0.0, r.remaining - max(0.0, now - r.started))
                rank = left * max(r.request.gpus, 1.0)
            victims.append((-rank, -r.seq, r))
        return victims, None

    def _guarded_victims(
        self, running: Sequence[RunningJob], now: float, ordered: Sequence[QueuedJob], pool: int
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        # rank_running, then _guard with this policy's margin, in one tight pass: asked
        # before every full plan, over every running job (the same arithmetic, so the
        # same floats)
        if (
            self.min_run > 0
            or self.restart_cost <= 0
            or not self.margin_counts_queue
            or type(self).rank_margin is not SrtfPolicy.rank_margin
            or type(self).rank_running is not SrtfPolicy.rank_running
        ):
            return super()._guarded_victims(running, now, ordered, pool)
        waiting = sorted(self.queued_rank(j) for j in ordered) if ordered else None
        n, share, after, cost = (
            len(waiting or ()),
            max(pool, 1),
            bisect.bisect_right,
            self.restart_cost,
        )
        guarded: list[tuple[float, int, RunningJob]] = []
        for r in running:
            if not r.preemptible or r.stopping:
                continue
            gpus = max(r.request.gpus, 1.0)
            if r.remaining is None:
                rank = math.inf
            else:
                rank = max(0.0, r.remaining - max(0.0, now - r.started)) * gpus
            delayed = 0.0 if waiting is None else (n - after(waiting, rank)) * gpus / share
            margin = cost * gpus * (1.0 + delayed)
            guarded.append((-rank + margin, -r.seq, r) if margin else (-rank, -r.seq, r))
        return guarded, None

    def running_ranks(self) -> RunningRanks | None:
        return RemainingRanks(self)

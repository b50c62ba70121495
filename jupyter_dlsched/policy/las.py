"""Least attained service, Tiresias-style: multi-level queues on GPU-service received.

A job's level is how many ``thresholds`` its attained GPU-service (GPUs ×
seconds it has run, over all its runs) has passed. Lower levels go first;
within a level, submit order. A running job that crosses a threshold drops a
level, and a waiting job of a higher level may then preempt it. New and short
jobs therefore finish fast without anyone knowing durations, while long jobs
share what is left.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .base import QueuedJob, RunningJob
from .ranked import RankedPolicy
from .ranks import RunningRanks, StepRanks


@dataclass
class LasPolicy(RankedPolicy):
    """Discretised least-attained-service, preemptive.

    Parameters (defaults shown):

    * ``thresholds=(3600, 36000)``: level boundaries in GPU-seconds (1 and 10 GPU-hours);
    * ``promote_after=None``: seconds after submission when a job goes ahead of
      every younger one and is no longer preempted (a starvation guard); ``None``: never;
    * ``promote_share=1.0``: the most of the GPUs promoted jobs may hold; below 1
      the oldest jobs get a lane of that share and the rest stays ranked;
    * ``preempt=True``: a waiting job stops running jobs of a lower level
      (more service); only jobs submitted with ``preemptible=True``;
    * ``preempt_grace=30``: seconds a preempted job gets to checkpoint;
    * ``min_run=60``: seconds a job runs before it can be preempted (a restart
      costs time; levels say nothing of how much a preemption would gain);
    * ``yield_after=86400``: among running jobs of one level, the one stopped
      first for a waiting job of a better level is the newest, unless some have
      run this many seconds since they last started: then the one that has run
      longest. Without it the last level is first come, first served: a job of
      weeks that started first is never the one stopped, and jobs of a day that
      reach its level after it are stopped again and again; ``None``: newest first;
    * ``skip=True``: a job that fits starts even if one ahead does not.

    >>> LasPolicy().level(5000.0)
    1
    """

    thresholds: tuple[float, ...] = (3600.0, 36000.0)
    promote_after: float | None = None
    promote_share: float = 1.0
    preempt: bool = True
    preempt_grace: float = 30.0
    min_run: float = 60.0
    yield_after: float | None = 86400.0
    skip: bool = True
    name: str = "las"

    def __post_init__(self) -> None:
        self.thresholds = tuple(sorted(float(t) for t in self.thresholds))

    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained)

    def queue_key(self, job: QueuedJob) -> tuple[int, int]:
        return (self.level(job.attained), job.seq)

    def queued_rank(self, job: QueuedJob) -> float:
        return self.level(job.attained)

    def running_rank(self, job: RunningJob, now: float) -> float:
        return self.level(job.attained_at(now))

    def next_change(self, job: RunningJob, now: float) -> float | None:
        attained = job.attained_at(now)
        i = self.level(attained)
        if i >= len(self.thresholds) or job.request.gpus <= 0:
            return None
        # a hair past the boundary, so that the job is on the next level when asked again
        return now + (self.thresholds[i] - attained) / job.request.gpus + 1e-6

    def rank_running(
        self, running: Sequence[RunningJob], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        # running_rank and next_change in one pass: this loop is the hot path
        thresholds, level_of, top = self.thresholds, bisect.bisect_right, len(self.thresholds)
        quantum = self.yield_after
        victims: list[tuple[float, int, RunningJob]] = []
        wake = float("inf")
        for r in running:
            if not r.preemptible or r.stopping:
                continue
            gpus = r.request.gpus
            held = max(0.0, now - r.started)
            attained = r.attained + gpus * held
            level = level_of(thresholds, attained)
            victims.append((-level, -_turn(r.seq, held, quantum), r))
            if level < top and gpus > 0:
                change = now + (thresholds[level] - attained) / gpus + 1e-6
                if change < wake:
                    wake = change
        return victims, (None if wake == float("inf") else wake)

    def running_ranks(self) -> RunningRanks | None:
        # a job's level changes only when its service crosses a threshold
        if self.promotes():
            return None
        levels = tuple(range(len(self.thresholds) + 1))
        return StepRanks(self, lambda job: (self.thresholds, levels))


def _turn(seq: int, held: float, quantum: float | None) -> int:
    """The order in which running jobs of one level are stopped, last first: by submit
    order, except that jobs that have run ``quantum`` seconds since they last started
    come after every other, the one that has run longest last (whole seconds, then
    submit order: exact integers, so equal turns never reach the job objects)."""
    if quantum is None or held < quantum:
        return seq
    return ((int(held) + 1) << 32) + seq

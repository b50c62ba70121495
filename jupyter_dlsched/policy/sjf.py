"""Shortest job first, with each job's ``time_limit`` as its length.

Two orders, named apart: ``sjf`` by declared duration (``time_limit``), and
``sjf-gputime`` by declared GPU-time (``time_limit`` × GPUs), the usual
definition for gangs of GPUs and the order ``srtf`` uses.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from .base import FinishedJob, PresortedQueue, QueuedJob
from .ranked import RankedPolicy
from .sizes import SizeModel


@dataclass
class SjfPolicy(RankedPolicy):
    """Shortest ``time_limit`` (else learnt size) first; jobs with neither go last.

    Parameters (defaults shown):

    * ``skip=True``: a job that fits starts even if a shorter one ahead does not;
    * ``by_gpu_time=False``: order by ``time_limit`` × GPUs instead of by ``time_limit``;
    * ``learn_sizes=True``: a job without a ``time_limit`` is as long as the
      median of the jobs of its owner, name and GPU count (else owner and name,
      owner and GPU count, owner, everyone) that finished before the decision
      (``SizeModel``); ``False``: it goes last;
    * ``window=2000``, ``group_min=3``: see ``SizeModel``.

    Never preempts: a running job always finishes.

    >>> SjfPolicy().name
    'sjf'
    """

    skip: bool = True
    by_gpu_time: bool = False
    learn_sizes: bool = True
    window: int = 2000
    group_min: int = 3
    name: str = "sjf"
    preempt = False
    #: it orders by declared time limits (the simulator says when those are the true durations)
    reads_time_limits = True
    #: how often what was learnt changed the order; the simulator re-sorts its queue
    model_version: int = field(default=0, init=False)
    _sizes: SizeModel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.by_gpu_time and self.name == "sjf":
            self.name = "sjf-gputime"
        self._sizes = SizeModel(self.window, self.group_min, 0.5)

    def learn(self, finished: list[FinishedJob], replace: bool = False) -> None:
        """Take in jobs that finished (each once): the sizes of jobs without a time limit."""
        if self.learn_sizes and self._sizes.learn(finished, replace=replace):
            self.model_version += 1

    def head(
        self, lanes: Mapping[Hashable, Sequence[QueuedJob]], now: float, k: int
    ) -> PresortedQueue | None:
        """The first ``k`` jobs by ``queue_key``. What it learnt is part of its
        ``lane_layout`` (``model_version`` is in its repr), so a caller keeping lanes
        sorts them again when the order changes."""
        return PresortedQueue(islice(lanes.get((), ()), k), key=self.queue_key, in_order=True)

    def queue_key(self, job: QueuedJob) -> tuple[float, int]:
        length: float | None = job.time_limit
        if length is None:
            length = self._sizes.estimate(job.owner, job.name, job.request.gpus)
        if length is None:
            length = math.inf
        if self.by_gpu_time:
            length *= max(job.request.gpus, 1.0)
        return (length, job.seq)

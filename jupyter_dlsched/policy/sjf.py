"""Shortest job first, with each job's ``time_limit`` as its length.

Two orders, named apart: ``sjf`` by declared duration (``time_limit``), and
``sjf-gputime`` by declared GPU-time (``time_limit`` × GPUs), the usual
definition for gangs of GPUs and the order ``srtf`` uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import QueuedJob
from .ranked import RankedPolicy


@dataclass
class SjfPolicy(RankedPolicy):
    """Shortest ``time_limit`` first; jobs without one go last, in submit order.

    Parameters (defaults shown):

    * ``skip=True``: a job that fits starts even if a shorter one ahead does not;
    * ``by_gpu_time=False``: order by ``time_limit`` × GPUs instead of by ``time_limit``.

    Never preempts: a running job always finishes.

    >>> SjfPolicy().name
    'sjf'
    """

    skip: bool = True
    by_gpu_time: bool = False
    name: str = "sjf"
    preempt = False
    #: it orders by declared time limits (the simulator says when those are the true durations)
    reads_time_limits = True

    def __post_init__(self) -> None:
        if self.by_gpu_time and self.name == "sjf":
            self.name = "sjf-gputime"

    def queue_key(self, job: QueuedJob) -> tuple[float, int]:
        length = math.inf if job.time_limit is None else job.time_limit
        if self.by_gpu_time:
            length *= max(job.request.gpus, 1.0)
        return (length, job.seq)

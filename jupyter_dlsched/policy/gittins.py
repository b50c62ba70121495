"""Gittins index: shortest-remaining-time without knowing any job's length.

Given only a distribution of job sizes (GPU-seconds) and how much service a
job has received so far, the Gittins index of that job is the best ratio, over
any further quantum Δ, of "chance it finishes within Δ more" to "expected
service it will use in that time". Serving the highest index first minimises
mean completion time among policies that do not know sizes (Gittins 1989;
used for GPU clusters by Tiresias, NSDI'19). For heavy-tailed sizes (typical
of deep-learning clusters) the index falls as a job ages, so young jobs run
first and old ones yield, much as shortest-remaining-time would have it.

The index is computed once, at construction, on a grid of attained-service
values; a running job is re-ranked when it crosses a grid point.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from .base import QueuedJob, RunningJob
from .ranked import RankedPolicy


def default_sizes(n: int = 400, median: float = 1800.0, sigma: float = 2.2) -> list[float]:
    """A heavy-tailed prior of job sizes in GPU-seconds: log-normal quantiles.

    Median 30 GPU-minutes with a long tail (the shape of public deep-learning
    cluster traces), used when no observed sizes are given.
    """
    normal = NormalDist(math.log(median), sigma)
    return [math.exp(normal.inv_cdf((i + 0.5) / n)) for i in range(n)]


def gittins_index(sizes: Sequence[float], attained: float, at_least: float = 0.0) -> float:
    """The Gittins index of a job that has received ``attained`` of service.

    ``sizes`` must be sorted. Only quanta of ``at_least`` or more count: a job
    is served at least until its next re-evaluation anyway, and shorter ones
    would let single sizes just ahead of a job look like certain completions.
    Jobs that outlived every size get index 0.

    >>> round(gittins_index([10.0, 20.0], 0.0), 4)  # certain to end within 20, at mean cost 15
    0.0667
    """
    start = bisect.bisect_right(sizes, attained)
    left = [s - attained for s in sizes[start:]]
    n = len(left)
    best = 0.0
    done_work = 0.0
    for j, delta in enumerate(left):
        # E[min(S - a, delta) | S > a] * n  =  work of those done by delta + delta for the rest
        expected = done_work + delta * (n - j)
        if expected > 0 and delta >= at_least:
            best = max(best, (j + 1) / expected)
        done_work += delta
    return best


@dataclass
class GittinsPolicy(RankedPolicy):
    """Highest Gittins index first (from attained GPU-service), preemptive.

    Parameters (defaults shown):

    * ``sizes=None``: observed job sizes in GPU-seconds to build the index from;
      ``None`` uses ``default_sizes()``, a log-normal prior (median 30 GPU-minutes);
    * ``quantum=300``: the index is re-evaluated as a job's service crosses a
      grid that starts at ``quantum`` GPU-seconds and grows by ``growth``;
    * ``growth=1.2``;
    * ``promote_after=None``: seconds after submission when a job jumps ahead
      of every younger one and can no longer be preempted (a starvation guard
      for the longest jobs); ``None``: never;
    * ``preempt=True``: a waiting job stops running jobs with a lower index
      (only jobs submitted with ``preemptible=True``);
    * ``preempt_grace=30``: seconds a preempted job gets to checkpoint;
    * ``skip=True``: a job that fits starts even if one ahead does not.

    >>> p = GittinsPolicy(sizes=[60.0, 60.0, 6000.0])
    >>> p.index(0.0) > p.index(600.0)
    True
    """

    sizes: Sequence[float] | None = None
    quantum: float = 300.0
    growth: float = 1.2
    promote_after: float | None = None
    preempt: bool = True
    preempt_grace: float = 30.0
    skip: bool = True
    name: str = "gittins"
    _grid: list[float] = field(default_factory=list, init=False, repr=False)
    _index: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        raw = default_sizes() if self.sizes is None else self.sizes
        sizes = sorted(float(s) for s in raw if s > 0)
        if len(sizes) > 2000:  # quantiles keep the index cheap and just as shaped
            step = len(sizes) / 2000
            sizes = [sizes[int(i * step)] for i in range(2000)]
        top = sizes[-1] if sizes else 0.0
        grid = [0.0]
        point = max(self.quantum, 1.0)
        while point < top:
            grid.append(point)
            point *= max(self.growth, 1.01)
        self._grid = grid
        steps = [b - a for a, b in zip(grid, grid[1:], strict=False)] + [self.quantum]
        self._index = [gittins_index(sizes, a, step) for a, step in zip(grid, steps, strict=True)]

    def index(self, attained: float) -> float:
        """The index of the grid cell that ``attained`` falls into."""
        return self._index[bisect.bisect_right(self._grid, attained) - 1]

    def queue_key(self, job: QueuedJob) -> tuple[float, int]:
        return (-self.index(job.attained), job.seq)

    def queued_rank(self, job: QueuedJob) -> float:
        return -self.index(job.attained)

    def running_rank(self, job: RunningJob, now: float) -> float:
        return -self.index(job.attained_at(now))

    def next_change(self, job: RunningJob, now: float) -> float | None:
        attained = job.attained_at(now)
        i = bisect.bisect_right(self._grid, attained)
        if i >= len(self._grid) or job.request.gpus <= 0:
            return None
        # a hair past the grid point, so that the job is in the next cell when asked again
        return now + (self._grid[i] - attained) / job.request.gpus + 1e-6

    def rank_running(
        self, running: Sequence[RunningJob], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        # running_rank and next_change in one pass: this loop is the hot path
        grid, index, cell_of, cells = self._grid, self._index, bisect.bisect_right, len(self._grid)
        victims: list[tuple[float, int, RunningJob]] = []
        wake = float("inf")
        for r in running:
            if not r.preemptible or r.stopping:
                continue
            gpus = r.request.gpus
            attained = r.attained + gpus * max(0.0, now - r.started)
            cell = cell_of(grid, attained)
            victims.append((index[cell - 1], -r.seq, r))
            if cell < cells and gpus > 0:
                change = now + (grid[cell] - attained) / gpus + 1e-6
                if change < wake:
                    wake = change
        return victims, (None if wake == float("inf") else wake)

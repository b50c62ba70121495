"""Gittins index: shortest-remaining-time without knowing any job's length.

Given only a distribution of job sizes (GPU-seconds) and how much service a
job has received so far, the Gittins index of that job is the best ratio, over
any further quantum Δ, of "chance it finishes within Δ more" to "expected
service it will use in that time". Serving the highest index first minimises
mean completion time among policies that do not know sizes (Gittins 1989;
used for GPU clusters by Tiresias, NSDI'19). For heavy-tailed sizes (typical
of deep-learning clusters) the index falls as a job ages, so young jobs run
first and old ones yield, much as shortest-remaining-time would have it.

The distribution is learnt online: it starts as a generic prior (or the sizes
you pass) and takes in every finished job the caller reports through
``learn``. Jobs of an owner, or of an owner and job name, that has finished
often enough get an index built from their own group's sizes (as Tiresias and
Helios' QSSF use a job's history). The index is recomputed on a grid of
attained-service values when enough new sizes came in; a running job is
re-ranked as it crosses the grid.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist

from .base import FinishedJob, QueuedJob, RunningJob
from .ranked import RankedPolicy
from .ranks import RunningRanks, StepRanks

# quantiles kept per index table: the index has the same shape, at a fraction of the cost
_QUANTILES = 400


def default_sizes(n: int = 400, median: float = 1800.0, sigma: float = 2.2) -> list[float]:
    """A heavy-tailed prior of job sizes in GPU-seconds: log-normal quantiles.

    Median 30 GPU-minutes with a long tail (the shape of public deep-learning
    cluster traces), used until observed sizes replace it.
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
    n = len(sizes) - start
    best = 0.0
    done_work = 0.0
    for j in range(n):
        delta = sizes[start + j] - attained
        # E[min(S - a, delta) | S > a] * n  =  work of those done by delta + delta for the rest
        expected = done_work + delta * (n - j)
        if expected > 0 and delta >= at_least:
            ratio = (j + 1) / expected
            if ratio > best:
                best = ratio
        done_work += delta
    return best


@lru_cache(maxsize=1)
def _prior_shape() -> tuple[float, ...]:
    return tuple(default_sizes(_QUANTILES))


def _quantiles(sizes: Iterable[float], k: int = _QUANTILES) -> list[float]:
    ordered = sorted(s for s in sizes if s > 0)
    if len(ordered) <= k:
        return ordered
    step = len(ordered) / k
    return [ordered[int(i * step)] for i in range(k)]


def weighted_index(items: Sequence[tuple[float, float]], attained: float, at_least: float) -> float:
    """``gittins_index`` over sizes that carry weights: ``(size, weight)`` sorted by size.

    >>> round(weighted_index([(10.0, 1.0), (20.0, 1.0)], 0.0, 0.0), 4)
    0.0667
    """
    start = bisect.bisect_right(items, (attained, math.inf))
    left = sum(w for _, w in items[start:])
    best = 0.0
    done_work = 0.0  # weighted service of those done by delta
    done = 0.0
    for size, weight in items[start:]:
        delta = size - attained
        done += weight
        left -= weight
        expected = done_work + delta * (weight + left)
        if expected > 0 and delta >= at_least:
            ratio = done / expected
            if ratio > best:
                best = ratio
        done_work += delta * weight
    return best


@dataclass
class _Table:
    """The index on a grid of attained service, built from one group's sizes."""

    grid: list[float]
    index: list[float]
    # the rank: 1 / index, GPU-seconds of service per completion (smaller first); in the
    # unit of the restart cost, so a preemption's gain can be weighed against it
    cost: list[float] = field(default_factory=list)
    mean: float = math.inf  # the mean size, GPU-seconds (what a fresh job is expected to use)

    def __post_init__(self) -> None:
        if not self.cost:
            self.cost = [1.0 / x if x > 0 else math.inf for x in self.index]

    @classmethod
    def build(
        cls, sizes: Iterable[float], quantum: float, growth: float, prior: float = 0.0
    ) -> _Table:
        """From observed ``sizes`` and, worth ``prior`` of them, the generic prior's shape."""
        ordered = _quantiles(sizes)
        n = len(sizes) if isinstance(sizes, Sequence | deque) else len(ordered)
        weight = n / len(ordered) if ordered else 0.0
        items = [(s, weight) for s in ordered]
        if prior > 0:
            shape = _prior_shape()
            items += [(s, prior / len(shape)) for s in shape]
        items.sort()
        top = items[-1][0] if items else 0.0
        grid = [0.0]
        point = max(quantum, 1.0)
        while point < top:
            grid.append(point)
            point *= max(growth, 1.01)
        steps = [b - a for a, b in zip(grid, grid[1:], strict=False)] + [quantum]
        index = [weighted_index(items, a, step) for a, step in zip(grid, steps, strict=True)]
        total = sum(w for _, w in items)
        mean = sum(s * w for s, w in items) / total if total else math.inf
        return cls(grid, index, mean=mean)

    def at(self, attained: float) -> float:
        return self.index[bisect.bisect_right(self.grid, attained) - 1]

    def rank_at(self, attained: float) -> float:
        return self.cost[bisect.bisect_right(self.grid, attained) - 1]


@lru_cache(maxsize=64)
def _cached_table(sizes: tuple[float, ...], quantum: float, growth: float, prior: float) -> _Table:
    # the live scheduler rebuilds its policy on every decision from the same history
    return _Table.build(sizes, quantum, growth, prior)


class _Group:
    """The most recent sizes of one group (everyone, an owner, an owner's job name)."""

    __slots__ = ("fresh", "sizes", "table")

    def __init__(self, window: int, sizes: Iterable[float] = ()) -> None:
        self.sizes: deque[float] = deque(sizes, maxlen=window)
        self.fresh = 0  # sizes added since the table was built
        self.table: _Table | None = None


@dataclass
class GittinsPolicy(RankedPolicy):
    """Highest Gittins index first (from attained GPU-service), preemptive, learning sizes.

    Parameters (defaults shown):

    * ``sizes=None``: job sizes in GPU-seconds to start from, e.g. last
      month's; ``None`` starts from ``default_sizes()``, a log-normal prior
      (median 30 GPU-minutes) that counts as ``prior_weight`` finished jobs;
    * ``learn_sizes=True``: take in the sizes of finished jobs passed to ``learn``
      (the live scheduler passes the ledger's, the simulator those that ended
      before each decision); ``False`` keeps the starting distribution;
    * ``window=2000``: sizes kept per group, the most recent;
    * ``group_min=50``: finished jobs an owner (or an owner's job name) needs
      before its jobs are ranked by its own sizes; ``0``: one distribution for all;
    * ``prior_weight=100``: how many finished jobs the prior counts as;
    * ``quantum=300``: the index is re-evaluated as a job's service crosses a
      grid that starts at ``quantum`` GPU-seconds and grows by ``growth``;
    * ``growth=1.41``: a cell's rank is the index at its start over quanta of at
      least its width, so coarser cells re-rank (and preempt) a long job less
      often but rank more jobs alike: with cells that double, jobs about to end
      and jobs that outlived every job like them shared a rank and waited in
      submit order;
    * ``promote_after=None``: seconds after submission when a job jumps ahead
      of every younger one and can no longer be preempted; ``None``: never;
    * ``promote_share=1.0``: the most of the GPUs promoted jobs may hold; below 1
      the oldest jobs get a lane of that share and the rest stays ranked;
    * ``preempt=True``: a waiting job stops running jobs with a lower index
      (only jobs submitted with ``preemptible=True``);
    * ``preempt_grace=30``: seconds a preempted job gets to checkpoint;
    * ``restart_cost=30``: seconds a job loses when it starts again; a waiting job
      stops a running one only when it ranks better by more than that on each of
      the victim's GPUs (the rank, ``1 / index``, is in GPU-seconds);
    * ``min_run=1800``: seconds a job runs before it can be preempted (a young
      job's index falls fast, so without it minute-long jobs take turns);
    * ``skip=True``: a job that fits starts even if one ahead does not.

    >>> p = GittinsPolicy(sizes=[60.0, 60.0, 6000.0])
    >>> p.index(0.0) > p.index(600.0)
    True
    >>> p.learn([FinishedJob("ana", "", 6000.0)] * 3); p.model_version
    1
    """

    sizes: Sequence[float] | None = None
    learn_sizes: bool = True
    window: int = 2000
    group_min: int = 50
    prior_weight: int = 100
    quantum: float = 300.0
    growth: float = 1.41
    promote_after: float | None = None
    promote_factor: float | None = None
    promote_share: float = 1.0
    preempt: bool = True
    preempt_grace: float = 30.0
    restart_cost: float = 30.0
    min_run: float = 1800.0
    skip: bool = True
    name: str = "gittins"
    #: how many times what was learnt changed the ranking; the simulator re-sorts its queue
    model_version: int = field(default=0, init=False)
    _groups: dict[tuple[str, ...], _Group] = field(default_factory=dict, init=False, repr=False)
    _tables: dict[tuple[str, str], _Table] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        start: list[float] = []
        if self.sizes is not None:
            start = [float(s) for s in self.sizes if s > 0]
            if len(start) > self.window:
                start = _quantiles(start, self.window)
        everyone = self._groups[()] = _Group(self.window, start)
        everyone.table = self._build(everyone, ())

    def _build(self, group: _Group, key: tuple[str, ...]) -> _Table:
        # finished jobs are biased short (long ones are still running): the prior's
        # tail, worth prior_weight jobs, keeps a long job from looking hopeless
        prior = self.prior_weight if self.sizes is None else 0.0
        return _cached_table(tuple(group.sizes), self.quantum, self.growth, prior)

    # -- learning ------------------------------------------------------------------------

    def learn(self, finished: Iterable[FinishedJob], replace: bool = False) -> None:
        """Take in the sizes of jobs that finished, each job once.

        With ``replace`` what was learnt before is forgotten first: the live
        scheduler passes the ledger's recent history on every decision this way.
        """
        if not self.learn_sizes:
            return
        if replace:
            everyone = self._groups[()]
            self._groups = {(): everyone}
            everyone.sizes = deque(maxlen=self.window)
            if self.sizes is not None:
                everyone.sizes.extend(_quantiles(self.sizes, self.window))
            everyone.fresh = 0
            everyone.table = None
        touched: set[tuple[str, ...]] = set()
        for job in finished:
            if not (job.size > 0 and math.isfinite(job.size)):
                continue
            keys: list[tuple[str, ...]] = [()]
            if self.group_min > 0:
                keys.append((job.owner,))
                if job.name:
                    keys.append((job.owner, job.name))
            for key in keys:
                group = self._groups.get(key)
                if group is None:
                    group = self._groups[key] = _Group(self.window)
                group.sizes.append(job.size)
                group.fresh += 1
                touched.add(key)
        changed = False
        for key in touched:
            group = self._groups[key]
            if key and len(group.sizes) < self.group_min:
                continue
            # rebuild when a quarter of the window is new: the first sizes count most
            if group.table is None or group.fresh * 4 >= len(group.sizes):
                group.table = self._build(group, key)
                group.fresh = 0
                changed = True
        everyone = self._groups[()]
        if everyone.table is None:
            everyone.table = self._build(everyone, ())
            changed = True
        if changed:
            self._tables.clear()
            self.model_version += 1

    def table_for(self, owner: str, name: str) -> _Table:
        """The index table a job of ``owner`` named ``name`` is ranked by."""
        key = (owner, name)
        table = self._tables.get(key)
        if table is None:
            table = None
            for group_key in ((owner, name), (owner,)):
                group = self._groups.get(group_key)
                if group is not None and group.table is not None:
                    table = group.table
                    break
            if table is None:
                table = self._groups[()].table
                assert table is not None
            self._tables[key] = table
        return table

    # -- ranking -------------------------------------------------------------------------

    def index(self, attained: float, owner: str = "", name: str = "") -> float:
        """The index of a job of ``owner``/``name`` that has received ``attained`` service."""
        return self.table_for(owner, name).at(attained)

    def queue_key(self, job: QueuedJob) -> tuple[float, int]:
        return (self.queued_rank(job), job.seq)

    def queued_rank(self, job: QueuedJob) -> float:
        return self.table_for(job.owner, job.name).rank_at(job.attained)

    def running_rank(self, job: RunningJob, now: float) -> float:
        return self.table_for(job.owner, job.name).rank_at(job.attained_at(now))

    def promote_at(self, job: QueuedJob | RunningJob) -> float:
        # Tiresias' starvation limit: waited a multiple of what such a job is expected to run
        at = super().promote_at(job)
        if self.promote_factor is not None:
            mean = self.table_for(job.owner, job.name).mean
            at = min(at, job.submitted + self.promote_factor * mean / max(job.request.gpus, 1.0))
        return at

    def rank_margin(self, job: RunningJob, delayed: float = 0.0) -> float:
        # ranks are GPU-seconds per completion: a restart costs restart_cost on each GPU
        return self.restart_cost * max(job.request.gpus, 1.0)

    def next_change(self, job: RunningJob, now: float) -> float | None:
        grid = self.table_for(job.owner, job.name).grid
        attained = job.attained_at(now)
        i = bisect.bisect_right(grid, attained)
        if i >= len(grid) or job.request.gpus <= 0:
            return None
        # a hair past the grid point, so that the job is in the next cell when asked again
        return now + (grid[i] - attained) / job.request.gpus + 1e-6

    def rank_running(
        self, running: Sequence[RunningJob], now: float
    ) -> tuple[list[tuple[float, int, RunningJob]], float | None]:
        # running_rank and next_change in one pass: this loop is the hot path
        cell_of, table_for = bisect.bisect_right, self.table_for
        victims: list[tuple[float, int, RunningJob]] = []
        wake = math.inf
        for r in running:
            if not r.preemptible or r.stopping:
                continue
            table = table_for(r.owner, r.name)
            grid = table.grid
            gpus = r.request.gpus
            attained = r.attained + gpus * max(0.0, now - r.started)
            cell = cell_of(grid, attained)
            victims.append((-table.cost[cell - 1], -r.seq, r))
            if cell < len(grid) and gpus > 0:
                change = now + (grid[cell] - attained) / gpus + 1e-6
                if change < wake:
                    wake = change
        return victims, (None if wake == math.inf else wake)

    def running_ranks(self) -> RunningRanks | None:
        # a job's index changes only when its service crosses a point of its table's grid;
        # a new index is needed whenever model_version changes
        if self.promotes():
            return None
        by_table: dict[int, tuple[_Table, list[float]]] = {}

        def steps(job: RunningJob) -> tuple[list[float], list[float]]:
            table = self.table_for(job.owner, job.name)
            found = by_table.get(id(table))
            if found is None:
                # rank in cell c (grid[c - 1] <= service < grid[c]) is cost[c - 1]
                ranks = [table.cost[0], *table.cost]
                found = by_table[id(table)] = (table, ranks)  # holding the table keeps its id
            return found[0].grid, found[1]

        return StepRanks(self, steps)

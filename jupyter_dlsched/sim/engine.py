"""Discrete-event replay of a trace through a policy, on a virtual clock.

The clock jumps from event to event (an arrival, a job ending, a preempted job
letting go of its GPUs, a time a policy asked to be woken at); at each moment
with events the policy is asked once, exactly as the live scheduler asks it,
and its decisions are applied. Nothing steps through idle seconds, so a
109-day trace replays in seconds.

Preemption: a preempted job keeps its GPUs for ``grace`` seconds (still
making progress, then checkpointing), goes back to the queue keeping its
progress, and pays ``restart_overhead`` seconds on its next start (reloading a
checkpoint, warming up).

Shares of a GPU (``TraceJob(gpus=0.5)``) are placed by the live scheduler's
own placement code on the simulated GPUs of ``jupyter_dlsched.sim.gpus``.

A policy that learns (has ``learn``) is told about each job when it finishes,
before the next decision; it never sees the size of a job still running. An
elastic job's size there is the GPU time it would have used on the GPUs it asked
for (the GPU time a sub-linear speedup spent beyond that is not part of it).

Elastic jobs (``TraceJob(elastic=(1, 4))``): the policy is wrapped in
``ElasticPolicy`` (``resize_every``) and offered to it at the size it asked for
(``QueuedJob.min_gpus`` says how narrow it may start; see
``jupyter_dlsched.policy.elastic_narrow``; under ``srtf`` at its minimum), a job
runs at the rate the ``speedup`` model gives its size relative to the size its
duration was measured at, and a resize restarts it at once on its new GPUs,
keeping its progress and paying ``restart_overhead`` (no grace period: a resize
is a checkpoint the job was asked for, not a preemption).

What a replay accepts is checked in ``jupyter_dlsched.sim.inputs``; what it
returns (``SimResult``, ``JobOutcome``) is in ``jupyter_dlsched.sim.results``.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..policy import FinishedJob, PresortedQueue, QueuedJob, RunningJob, get_policy, submit_order
from ..policy.base import Policy, Resize, RunningSet
from ..policy.elastic import RESIZE_EVERY, with_elastic
from ..policy.speedup import Speedup, parse_speedup
from ..vocab.resources import Capacity, Placement, Request
from .eta import StartCalibration
from .gpus import SimGpus
from .inputs import check_replay, declared_limits, elastic_range
from .results import JobOutcome, SimResult, SimulationError, label
from .trace import TraceJob

_FINISH, _RELEASE, _WAKE = 0, 1, 2


def simulate(
    jobs: Sequence[TraceJob],
    policy: str | Policy,
    gpus: int,
    *,
    nodes: int = 1,
    restart_overhead: float = 30.0,
    grace: float = 0.0,
    time_limits: str | float | None = None,
    preemptible: bool = True,
    resize_every: float = RESIZE_EVERY,
    speedup: str | Speedup = "linear",
    estimates: bool = False,
    **policy_params: Any,
) -> SimResult:
    """Replay ``jobs`` on ``gpus`` GPUs (split evenly over ``nodes``) under ``policy``.

    ``time_limits`` is what jobs declare as ``time_limit`` (the estimate ``sjf``
    and backfill use): ``None`` (none declared, as live users mostly do: those
    policies then learn sizes from finished jobs), ``"exact"`` (their true
    duration: an oracle, and the row says so) or a factor (``2.0``: twice it). ``preemptible`` is what every job
    declares. A policy given by name that weighs preemptions against their
    cost (``restart_cost``) is told ``restart_overhead``. With elastic jobs in
    ``jobs`` the policy is wrapped for them (``resize_every``, ``speedup``: see
    ``jupyter_dlsched.policy.elastic``). ``estimates``: also forecast each job's start
    when it arrives, as the live scheduler would, and score the forecasts against the
    replay (``SimResult.eta``; ``jupyter_dlsched.sim.eta``). Same inputs, same result.

        >>> from jupyter_dlsched.sim.trace import TraceJob
        >>> trace = [TraceJob("a", 0, 1, 10.0), TraceJob("b", 0, 1, 5.0)]
        >>> [j.finish for j in simulate(trace, "fifo", gpus=1).jobs]
        [10.0, 15.0]
    """
    chosen = get_policy(policy, **policy_params)
    if isinstance(policy, str) and "restart_cost" not in policy_params:
        # a policy named here weighs preemptions by this replay's restart cost
        if hasattr(chosen, "restart_cost"):
            chosen.restart_cost = restart_overhead
    if hasattr(chosen, "learn"):
        # learning policies keep what they learnt: each replay starts from a fresh copy
        chosen = copy.deepcopy(chosen)
    model = parse_speedup(speedup)
    if any(j.elastic for j in jobs):
        chosen = with_elastic(
            chosen, resize_every=resize_every, restart_cost=restart_overhead, speedup=model
        )
    replay = _Replay(jobs, chosen, gpus, nodes, restart_overhead, grace, time_limits, preemptible)
    replay.speedup = model
    if estimates:
        replay.calibration = StartCalibration(chosen)
    result = replay.run()
    if getattr(chosen, "elastic", False):
        result.policy += " (elastic)"
    return result


class _Replay:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: Policy,
        gpus: int,
        nodes: int,
        restart_overhead: float,
        grace: float,
        time_limits: str | float | None,
        preemptible: bool,
    ) -> None:
        check_replay(jobs, gpus, nodes, restart_overhead, grace, time_limits)
        self.policy = policy
        self.n_gpus = gpus
        self.overhead = restart_overhead
        self.grace = grace
        self.preemptible = preemptible
        self.trace = sorted(jobs, key=lambda j: j.submit)  # stable: ties keep trace order
        self.limits = declared_limits(self.trace, time_limits)
        self.pool = SimGpus(gpus, nodes)
        self.key: Callable[[QueuedJob], Any] = getattr(policy, "queue_key", submit_order)
        uniform = len({j.priority for j in self.trace}) <= 1
        self.sizes: dict[int, int] = {}
        # with shares of GPUs a partly used GPU still takes jobs: policies must look further
        whole = all(float(j.gpus).is_integer() for j in self.trace)
        self.queue = PresortedQueue(
            key=self.key, gpu_only=whole, uniform_priority=uniform, sizes=self.sizes
        )
        # running jobs kept by rank for a preemptive policy that offers an index
        self.ranks_factory = getattr(policy, "running_ranks", None) if whole else None
        self.ranks = self.ranks_factory() if callable(self.ranks_factory) else None
        self.requests: dict[float, Request] = {}
        self.learns = callable(getattr(policy, "learn", None))
        self.preemptive = bool(getattr(policy, "preempt", False))
        self.finished_now: list[FinishedJob] = []
        self.model_version = getattr(policy, "model_version", None)
        self.label = label(policy, time_limits)
        n = len(self.trace)
        self.seq_of = {j.id: i for i, j in enumerate(self.trace)}
        if len(self.seq_of) != n:
            raise SimulationError("job ids in the trace are not unique")
        self.remaining = [j.duration for j in self.trace]
        self.attained = [0.0] * n
        self.service = [0.0] * n  # what a learning policy is told a finished job used
        self.first_start = [math.nan] * n
        self.finish = [math.nan] * n
        self.preemptions = [0] * n
        self.token = [0] * n
        self.run_start = [0.0] * n
        self.run_overhead = [0.0] * n
        self.run_length = [0.0] * n
        self.run_rate = [1.0] * n  # work seconds (at the trace's size) per second of this run
        self.resizes = [0] * n
        self.resize_log: list[tuple[float, str, int, int]] = []
        self.speedup: Speedup = parse_speedup("linear")
        self.ranges = [elastic_range(j, gpus) for j in self.trace]
        self.as_asked = bool(getattr(policy, "as_asked", False))
        self.queued: dict[str, QueuedJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.heap: list[tuple[float, int, int, int]] = []
        self.wakes: set[float] = set()
        self.busy_seconds = 0.0
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)]
        self.held = [0.0] * n
        self.calls = 0
        self._capacity: Capacity | None = None
        self._running_list: RunningSet | None = None
        self.calibration: StartCalibration | None = None

    def run(self) -> SimResult:
        trace, heap = self.trace, self.heap
        n = len(trace)
        arrived = 0
        while arrived < n or heap:
            t = trace[arrived].submit if arrived < n else math.inf
            if heap and heap[0][0] < t:
                t = heap[0][0]
            while heap and heap[0][0] <= t:
                _, kind, seq, token = heapq.heappop(heap)
                if kind == _WAKE:
                    self.wakes.discard(t)
                elif token == self.token[seq]:
                    self._end_run(seq, t, finished=kind == _FINISH)
            first = arrived
            while arrived < n and trace[arrived].submit <= t:
                self._enqueue(arrived, preempted=False)
                arrived += 1
            if self.finished_now:
                self._teach()
            if self.calibration is not None and arrived > first:
                self._forecast([j.id for j in trace[first:arrived]], t)
            self._decide(t)
            busy = self.pool.busy
            if self.timeline[-1][1] != busy:
                self.timeline.append((t, busy))
            if arrived == n and not heap and self.queue:
                raise SimulationError(
                    f"{self.policy.name}: {len(self.queue)} jobs wait with nothing running "
                    f"and nothing left to arrive (first: {self.queue[0].id})"
                )
        outcomes = [
            JobOutcome(
                j.id,
                j.submit,
                j.gpus,
                j.duration,
                j.owner,
                self.first_start[i],
                self.finish[i],
                self.preemptions[i],
                self.held[i],
                self.resizes[i],
            )
            for i, j in enumerate(trace)
        ]
        eta = None
        if self.calibration is not None:
            eta = self.calibration.result
            eta.score((o.id, o.submit, o.first_start) for o in outcomes)
        return SimResult(
            self.label,
            self.n_gpus,
            outcomes,
            self.busy_seconds,
            self.timeline,
            self.calls,
            sum(j.gpus * j.duration for j in trace),
            self.resize_log,
            eta,
        )

    def _forecast(self, new: list[str], t: float) -> None:
        """Estimate when the jobs just submitted start, from the state the policy sees now."""
        assert self.calibration is not None
        capacity = self.pool.capacity()
        self.calibration.submitted(new, self.queue, list(self.running.values()), capacity, t)

    def _teach(self) -> None:
        """Tell a learning policy which jobs just finished; re-sort the queue if it re-ranks."""
        self.policy.learn(self.finished_now)  # type: ignore[attr-defined]
        self.finished_now = []
        version = getattr(self.policy, "model_version", None)
        if version != self.model_version:
            self.model_version = version
            self.queue.sort(key=self.key)
            if self.ranks is not None:
                self.ranks = self.ranks_factory()  # type: ignore[misc]
                for job in self.running.values():
                    self.ranks.add(job)
                self._running_list = None

    def _decide(self, t: float) -> None:
        for _ in range(16):  # released victims free room at once: ask again at the same moment
            if self._capacity is None:
                self._capacity = self.pool.capacity()
            if self._running_list is None:
                self._running_list = RunningSet(self.running.values(), self.ranks)
            decisions = self.policy(self.queue, self._running_list, self._capacity, t)
            self.calls += 1
            resizes = decisions.resizes
            for resize in resizes:  # shrinks first: they free what the starts may need
                if len(resize.placement.gpus) < self._size(resize.job_id):
                    self._resize(resize, t)
            for start in decisions.starts:
                self._start(start.job_id, start.placement, t)
            for resize in resizes:
                if len(resize.placement.gpus) > self._size(resize.job_id):
                    self._resize(resize, t)
            released = bool(resizes)
            for preempt in decisions.preempts:
                released |= self._preempt(preempt.job_id, t)
            wake = decisions.wake_at
            if wake is not None and wake > t and wake not in self.wakes:
                self.wakes.add(wake)
                heapq.heappush(self.heap, (wake, _WAKE, -1, 0))
            # a preemptive policy learns when the jobs it just started change rank or may
            # be stopped (wake_at) only once they are running: ask it again with them
            again = bool(decisions.starts) and self.queue and self.preemptive
            if not released and not again:
                return

    def _request(self, gpus: float) -> Request:
        request = self.requests.get(gpus)
        if request is None:
            request = self.requests[gpus] = Request(gpus=gpus, cpus=0.0)
        return request

    def _enqueue(self, seq: int, preempted: bool) -> None:
        job = self.trace[seq]
        span = self.ranges[seq]
        work = self.remaining[seq]
        gpus = job.gpus
        if span is not None:  # offered at the size it asked for, or its minimum (srtf)
            gpus = span[0]
            if self.as_asked:
                gpus = min(max(math.ceil(job.gpus), span[0]), span[1])
            work /= self.speedup.ratio(job.gpus, gpus)  # an oracle's run time there
        remaining = work + (self.overhead if preempted else 0.0)
        queued = QueuedJob(
            id=job.id,
            seq=seq,
            submitted=job.submit,
            request=self._request(gpus),
            priority=job.priority,
            owner=job.owner,
            time_limit=self.limits[seq],
            preemptible=self.preemptible,
            attained=self.attained[seq],
            preemptions=self.preemptions[seq],
            remaining=remaining,
            name=job.name,
            max_gpus=None if span is None else span[1],
            min_gpus=span[0] if span is not None and self.as_asked else None,
        )
        self.queued[job.id] = queued
        whole = queued.request.whole_gpus
        self.sizes[whole] = self.sizes.get(whole, 0) + 1
        key = self.key
        self.queue.insert(bisect.bisect_right(self.queue, key(queued), key=key), queued)

    def _start(self, job_id: str, placement: Placement, t: float) -> None:
        queued = self.queued.pop(job_id, None)
        if queued is None:
            raise SimulationError(f"{self.policy.name} started {job_id!r}, which is not queued")
        key, queue = self.key, self.queue
        pos = bisect.bisect_left(queue, key(queued), key=key)
        if pos >= len(queue) or queue[pos] is not queued:
            pos = next(i for i, q in enumerate(queue) if q is queued)
        del queue[pos]
        seq = queued.seq
        self.sizes[queued.request.whole_gpus] -= 1
        request = queued.request
        span = self.ranges[seq]
        if span is not None:
            n = len(placement.gpus)
            if not span[0] <= n <= span[1]:
                raise SimulationError(
                    f"{self.policy.name} started elastic job {job_id} on {n} GPUs, "
                    f"outside its range {span[0]}:{span[1]}"
                )
            request = self._request(float(n))
        restart = self.overhead if self.preemptions[seq] else 0.0
        self._run(queued, request, placement, t, restart)

    def _run(
        self,
        queued: QueuedJob | RunningJob,
        request: Request,
        placement: Placement,
        t: float,
        restart: float,
    ) -> None:
        """Start a run of ``queued`` on ``placement`` at ``t``, ``restart`` seconds lost first."""
        job_id, seq = queued.id, queued.seq
        self.pool.occupy(self.policy.name, job_id, request, placement)
        self._capacity = self._running_list = None
        span = self.ranges[seq]
        rate = 1.0
        if span is not None:
            rate = self.speedup.ratio(self.trace[seq].gpus, request.gpus)
        self.run_rate[seq] = rate
        length = self.remaining[seq] / rate + restart
        self.token[seq] += 1
        self.run_start[seq] = t
        self.run_overhead[seq] = restart
        self.run_length[seq] = length
        if math.isnan(self.first_start[seq]):
            self.first_start[seq] = t
        job = self.running[job_id] = RunningJob(
            id=job_id,
            seq=seq,
            submitted=queued.submitted,
            started=t,
            request=request,
            placement=placement,
            priority=queued.priority,
            owner=queued.owner,
            time_limit=queued.time_limit,
            deadline=queued.deadline,
            preemptible=queued.preemptible,
            attained=self.attained[seq],
            remaining=length,
            name=queued.name,
            min_gpus=None if span is None else span[0],
            max_gpus=None if span is None else span[1],
        )
        if self.ranks is not None:
            self.ranks.add(job)
        heapq.heappush(self.heap, (t + length, _FINISH, seq, self.token[seq]))

    def _size(self, job_id: str) -> int:
        job = self.running.get(job_id)
        if job is None:
            raise SimulationError(f"{self.policy.name} resized {job_id!r}, which is not running")
        return len(job.placement.gpus)

    def _resize(self, resize: Resize, t: float) -> None:
        """Checkpoint ``resize.job_id`` and restart it at once on ``resize.placement``."""
        job = self.running[resize.job_id]
        seq, n = job.seq, len(resize.placement.gpus)
        span = self.ranges[seq]
        if span is None or job.stopping or not span[0] <= n <= span[1]:
            why = "rigid" if span is None else f"elastic in {span[0]}:{span[1]}"
            raise SimulationError(
                f"{self.policy.name} resized {job.id} ({why}) to {n} GPUs, which it may not"
            )
        if t - job.started < getattr(self.policy, "resize_every", 0.0) - 1e-9:
            raise SimulationError(
                f"{self.policy.name} resized {job.id} {t - job.started:g} s after its last "
                "start or resize, inside resize_every"
            )
        self.running.pop(job.id)
        if self.ranks is not None:
            self.ranks.remove(job)
        self._account(seq, t, self.pool.release(job.request, job.placement))
        self.resizes[seq] += 1
        self.resize_log.append((t, job.id, len(job.placement.gpus), n))
        self._run(job, self._request(float(n)), resize.placement, t, self.overhead)

    def _account(self, seq: int, t: float, held: float) -> float:
        """Book the run of ``seq`` that ends at ``t`` on ``held`` GPUs; its seconds."""
        elapsed = t - self.run_start[seq]
        self.busy_seconds += held * elapsed
        self.attained[seq] += held * elapsed
        self.held[seq] += elapsed
        self.token[seq] += 1
        progress = max(0.0, elapsed - self.run_overhead[seq]) * self.run_rate[seq]
        if self.ranges[seq] is None:
            self.service[seq] += held * elapsed
        else:  # an elastic job's service as it would have been on the GPUs it asked for
            restart = min(elapsed, self.run_overhead[seq])
            self.service[seq] += self.trace[seq].gpus * (restart + progress)
        self.remaining[seq] = max(0.0, self.remaining[seq] - progress)
        return elapsed

    def _preempt(self, job_id: str, t: float) -> bool:
        """Ask ``job_id`` to stop; True when it let go of its GPUs at once."""
        job = self.running.get(job_id)
        if job is None or job.stopping:
            return False
        if not job.preemptible:
            raise SimulationError(
                f"{self.policy.name} preempted {job_id}, which is not preemptible"
            )
        if self.grace <= 0:
            self._end_run(job.seq, t, finished=False)
            return True
        stopping = self.running[job_id] = replace(job, stopping=True)
        if self.ranks is not None:
            self.ranks.remove(job)
            self.ranks.add(stopping)
        self._running_list = None
        if t + self.grace < self.run_start[job.seq] + self.run_length[job.seq]:
            heapq.heappush(self.heap, (t + self.grace, _RELEASE, job.seq, self.token[job.seq]))
        return False

    def _end_run(self, seq: int, t: float, finished: bool) -> None:
        job_id = self.trace[seq].id
        job = self.running.pop(job_id)
        if self.ranks is not None:
            self.ranks.remove(job)
        held = self.pool.release(job.request, job.placement)
        self._capacity = self._running_list = None
        self._account(seq, t, held)
        if finished:
            self.remaining[seq] = 0.0
            self.finish[seq] = t
            if self.calibration is not None:
                trace_job = self.trace[seq]
                self.calibration.finished(
                    trace_job.owner, trace_job.name, trace_job.gpus, self.held[seq]
                )
            if self.learns:
                trace_job = self.trace[seq]
                self.finished_now.append(
                    FinishedJob(
                        trace_job.owner, trace_job.name, self.service[seq], t, trace_job.gpus
                    )
                )
            return
        self.preemptions[seq] += 1
        self._enqueue(seq, preempted=True)

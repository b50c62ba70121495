"""When will a waiting job start: the live policy run forward from the live state.

``forecast`` asks the pool's own policy, on the pool's own capacity, what it
would decide as running jobs end, exactly as the simulator asks it during a
replay: from ``now`` the clock jumps to the next moment something changes (a
running job's expected end, a moment the policy asked to be woken at), the
policy decides, its starts take devices and its preemptions give them back.
Nothing arrives during the forecast, so a job submitted later with a better
rank can still overtake a waiting one; that is what the P80 bound's
calibration (``dlsched sim --eta``) measures.

How long a job runs comes from ``RunTimes``: the run times of jobs that
finished, by owner, name and GPUs (else broader groups, down to everyone),
and a job's time limit where it has one (it cannot run longer). A running job's elapsed time
counts: its end is a quantile of the run times *longer than what it has
already run*. Two passes give two figures per job: ``expected`` with median
run times, ``p80`` with 80th-percentile ones (each job at its 80th
percentile: a cautious bound, never before ``expected``).

The work is bounded for deep queues: at most ``max_jobs`` waiting jobs (the
first in the queue's order) are simulated, a pass makes at most
``max_calls`` policy calls, and both passes stop after ``budget_s`` seconds
(wall clock); jobs a pass did not see start get no estimate (``None``).
A job with more work ahead of it than ``AHEAD_LIMIT`` (the 80th-percentile run
times of the waiting jobs before it in line, times their GPUs, spread over the
pool's GPUs) is not simulated at all: its start is no promise, and its
estimate says so, ``StartEstimate(None, now + work ahead)`` ("start
uncertain: the queue ahead may take ~3 days", ``vocab.words.start_phrase``).
Without that a replay's forecasts cost the square of the queue's depth.

This module is pure apart from that time budget: no ledger, no pool.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from ..policy import Decisions, Policy, PresortedQueue, QueuedJob, RunningJob, submit_order
from ..policy.base import Room, RunningSet, nothing_fits
from ..vocab.resources import Capacity, Request
from .run_times import RunTimes as RunTimes

#: The quantiles of run times behind the two figures of every estimate.
EXPECTED = 0.5
BOUND = 0.8
#: Seconds of work ahead (``work_ahead``) beyond which a job's start is not simulated
#: but given as uncertain, with that work as the figure.
AHEAD_LIMIT = 400 * 3600.0
#: Estimated copies of waiting jobs kept between forecasts (``RunTimes.estimated``).
_ESTIMATED_KEPT = 100_000


@dataclass(frozen=True)
class StartEstimate:
    """When a waiting job should start (epoch seconds): ``expected`` and a cautious ``p80``;
    ``expected`` is ``None`` for a job too deep in line to simulate, whose ``p80`` is then
    the moment the work ahead of it would be done (``AHEAD_LIMIT``)."""

    expected: float | None
    p80: float


@dataclass
class Forecast:
    """Estimates by job id, and when they go stale with no event (``refresh_at``: the
    earliest moment a running job was assumed to end; if it runs on, the estimates behind
    it are too early)."""

    estimates: dict[str, StartEstimate] = field(default_factory=dict)
    refresh_at: float | None = None
    simulated: int = 0  # waiting jobs taken into the forecast
    calls: int = 0  # policy calls, both passes
    beyond: int = 0  # jobs given as uncertain for the work ahead of them, not simulated


def forecast(
    policy: Policy,
    queued: Sequence[QueuedJob],
    running: Sequence[RunningJob],
    capacity: Capacity,
    now: float,
    run_times: RunTimes,
    *,
    targets: Iterable[str] | None = None,
    max_jobs: int = 200,
    max_calls: int = 2000,
    budget_s: float = 0.05,
    ahead_limit: float | None = None,
) -> Forecast:
    """Expected and P80 start of each waiting job in ``queued`` (the first ``max_jobs`` of it,
    in the order given: put the queue's own order first).

    ``targets``: stop a pass once these jobs have started (the simulator asks
    about the jobs just submitted). A job with more than ``ahead_limit`` seconds
    of work ahead of it (default ``AHEAD_LIMIT``; ``math.inf``: none) is given as
    uncertain and not simulated; a pass stops
    once every other job it is asked about has started. See the module for what
    is assumed.

    >>> from jupyter_dlsched.policy import get_policy
    >>> from jupyter_dlsched.vocab.resources import Capacity, Placement, Request
    >>> times = RunTimes()
    >>> times.learn([("ana", "step", 1, 3.0)] * 3)
    >>> one = Request(gpus=1, cpus=0)
    >>> held = Placement(gpus=(0,), gpu_mem=(2**30,))
    >>> step = RunningJob("s", 1, 0.0, 100.0, one, held, owner="ana", name="step")
    >>> wait = QueuedJob("w", 2, 100.5, one, owner="ana")
    >>> pool = Capacity.empty(1, 2**30, 1, 2**30).take(step.placement)
    >>> forecast(get_policy("fifo"), [wait], [step], pool, 101.0, times).estimates["w"]
    StartEstimate(expected=103.0, p80=103.0)
    """
    while getattr(policy, "does_io", False):  # a gate that reads the ledger: use what it wraps
        policy = policy._policy  # type: ignore[attr-defined]
    chosen = list(queued[: max(0, max_jobs)])
    result = Forecast(simulated=len(chosen))
    if not chosen:
        return result
    wanted = set(targets) if targets is not None else None
    limit = AHEAD_LIMIT if ahead_limit is None else ahead_limit
    beyond = _beyond(chosen, capacity, run_times, limit, wanted)
    if beyond:
        for job_id, ahead in beyond.items():
            result.estimates[job_id] = StartEstimate(None, now + ahead)
        result.beyond = len(beyond)
        # the passes need only run until the other jobs asked about have started: the
        # same passes, stopped earlier, so their estimates are those of a full run
        if wanted is None:
            wanted = {job.id for job in chosen if job.id not in beyond}
        else:
            wanted -= beyond.keys()
        if not wanted:
            return result
    deadline = time.perf_counter() + budget_s / 2
    expected, refresh, calls = _pass(
        policy,
        chosen,
        queued,
        running,
        capacity,
        now,
        run_times,
        EXPECTED,
        wanted,
        max_calls,
        deadline,
    )
    deadline = time.perf_counter() + budget_s / 2
    bound, _, more = _pass(
        policy,
        chosen,
        queued,
        running,
        capacity,
        now,
        run_times,
        BOUND,
        wanted,
        max_calls,
        deadline,
    )
    result.calls = calls + more
    result.refresh_at = refresh
    for job_id, start in expected.items():
        late = bound.get(job_id)
        if late is not None and job_id not in beyond:
            result.estimates[job_id] = StartEstimate(start, max(start, late))
    return result


def work_ahead(
    chosen: Iterable[QueuedJob], capacity: Capacity, run_times: RunTimes
) -> Iterator[float]:
    """Seconds of work ahead of each job in ``chosen`` (in line order), one by one: the
    80th-percentile run times of the jobs before it, times their GPUs, over the pool's GPUs
    (a job whose run time is not known counts nothing).

    >>> times = RunTimes()
    >>> times.learn([("ana", "step", 1, 3600.0)] * 3)
    >>> one = Request(gpus=1, cpus=0)
    >>> line = [QueuedJob(f"w{i}", i, 0.0, one, owner="ana", name="step") for i in range(3)]
    >>> list(work_ahead(line, Capacity.empty(2, 2**30, 1, 2**30), times))
    [0.0, 1800.0, 3600.0]
    """
    pool = len(capacity.gpus)
    done = 0.0
    for job in chosen:
        yield done / pool if pool else 0.0
        gpus = job.request.gpus
        if gpus > 0:
            before = _seconds_before(job)
            total = run_times.total(job.owner, job.name, BOUND, before, job.time_limit, gpus)
            if total is not None and math.isfinite(total):
                done += gpus * max(0.0, total - before)


def _beyond(
    chosen: Sequence[QueuedJob],
    capacity: Capacity,
    run_times: RunTimes,
    limit: float,
    wanted: set[str] | None,
) -> dict[str, float]:
    """The jobs of ``chosen`` (of ``wanted`` only, if given) with more than ``limit`` seconds
    of work ahead of them, with that work."""
    if math.isinf(limit) or not capacity.gpus:
        return {}
    found: dict[str, float] = {}
    left = None if wanted is None else len(wanted)
    for job, ahead in zip(chosen, work_ahead(chosen, capacity, run_times), strict=True):
        if wanted is not None and job.id not in wanted:
            continue
        if ahead > limit:
            found[job.id] = ahead
        if left is not None:
            left -= 1
            if not left:
                break
    return found


def _pass(
    policy: Policy,
    queued: list[QueuedJob],
    queued_as: Sequence[QueuedJob],
    running: Sequence[RunningJob],
    capacity: Capacity,
    now: float,
    run_times: RunTimes,
    q: float,
    targets: set[str] | None,
    max_calls: int,
    deadline: float,
) -> tuple[dict[str, float], float | None, int]:
    """One forward run with every job at its ``q``-quantile run time: start times by id,
    the earliest assumed end of a job running now, and the policy calls made.

    ``queued_as``: the queue as the caller had it; a ``PresortedQueue`` (the
    simulator's) is kept sorted by its key and passed on as one, so a policy
    need not sort or explain every job at every step."""
    grace = float(getattr(policy, "preempt_grace", 0.0) or 0.0)
    restart = float(getattr(policy, "restart_cost", 0.0) or 0.0)
    ends: dict[str, float] = {}
    live: dict[str, RunningJob] = {}
    stopping: set[str] = set()
    for held in running:
        elapsed = max(0.0, now - held.started)
        total = run_times.total(
            held.owner,
            held.name,
            q,
            _seconds_before(held) + elapsed,
            held.time_limit,
            held.request.gpus,
        )
        end = math.inf if total is None else held.started + max(0.0, total - _seconds_before(held))
        if held.stopping:
            end = min(end, now + grace)
            stopping.add(held.id)
        end = max(end, now)
        ends[held.id] = end
        live[held.id] = (
            _with_remaining(held, end - held.started) if held.remaining is not None else held
        )
    refresh = min((e for e in ends.values() if e > now), default=None)
    if refresh is not None and math.isinf(refresh):
        refresh = None
    presorted = queued_as if isinstance(queued_as, PresortedQueue) else None
    # kept in the policy's own order, so that it need not sort at every step
    key: Callable[[QueuedJob], Any] = (
        presorted.key if presorted is not None else getattr(policy, "queue_key", submit_order)
    )
    # each key computed once (a learnt rank is not free), sorted stably as ``sort(key=key)``
    ranked = sorted(
        (
            (key(estimated), estimated)
            for estimated in (
                _estimated(job, run_times, q) if job.remaining is not None else job
                for job in queued
            )
        ),
        key=itemgetter(0),
    )
    waiting = [job for _, job in ranked]
    keys = [k for k, _ in ranked]
    sizes: dict[int, int] = {}
    counts: dict[Request, int] = {}
    for job in waiting:
        sizes[job.request.whole_gpus] = sizes.get(job.request.whole_gpus, 0) + 1
        counts[job.request] = counts.get(job.request, 0) + 1
    shapes: frozenset[Request] | None = None
    # one priority and no deadlines (a map's jobs): a priority policy keeps submit order
    # as they age, so it need not sort the forecast queue at every step
    uniform = (
        presorted.uniform_priority
        if presorted is not None
        else len({j.priority for j in waiting}) <= 1 and all(j.deadline is None for j in waiting)
    )
    by_id = {j.id: j for j in waiting}
    # running jobs kept by rank, as the simulator keeps them, for a preemptive policy that
    # offers an index: it need not rank every running job at every step
    ranks = _ranks_for(policy, presorted, running)
    if ranks is not None:
        for held in live.values():
            ranks.add(held)
    started: dict[str, float] = {}
    left = set(targets) if targets is not None else None
    preemptive = bool(getattr(policy, "preempt", False))
    t, calls, again = now, 0, 0
    while waiting and calls < max_calls and time.perf_counter() < deadline:
        if shapes is None:
            shapes = frozenset(counts)
        if not preemptive and nothing_fits(Room(capacity), shapes):
            decisions = Decisions()  # no waiting job fits: only an end can change that
        else:
            # the whole forecast queue, in order, with its requests: a policy stops as soon
            # as none of them fits, and explains nothing it did not look at
            offered = PresortedQueue(
                waiting,
                key=key,
                gpu_only=presorted is not None and presorted.gpu_only,
                uniform_priority=uniform,
                sizes=sizes,
                shapes=shapes,
            )
            holding = list(live.values()) if ranks is None else RunningSet(live.values(), ranks)
            decisions = policy(offered, holding, capacity, t)
            calls += 1
        for start in decisions.starts:
            if start.job_id not in by_id:
                continue
            job = by_id.pop(start.job_id)
            i = bisect.bisect_left(keys, key(job))
            while waiting[i] is not job:
                i += 1
            del waiting[i], keys[i]
            sizes[job.request.whole_gpus] -= 1
            counts[job.request] -= 1
            if not counts[job.request]:
                del counts[job.request]
                shapes = None
            started.setdefault(job.id, t)
            if left is not None:
                left.discard(job.id)
            placement = start.placement
            capacity = capacity.take(placement)
            before = _seconds_before(job)
            total = run_times.total(
                job.owner, job.name, q, before, job.time_limit, job.request.gpus
            )
            length = math.inf if total is None else max(0.0, total - before)
            if job.preemptions:
                length += restart
            live[job.id] = RunningJob(
                id=job.id,
                seq=job.seq,
                submitted=job.submitted,
                started=t,
                request=job.request,
                placement=placement,
                priority=job.priority,
                owner=job.owner,
                time_limit=job.time_limit,
                deadline=job.deadline,
                preemptible=job.preemptible,
                attained=job.attained,
                remaining=None if job.remaining is None else length,
                name=job.name,
            )
            ends[job.id] = t + length
            if ranks is not None:
                ranks.add(live[job.id])
        for preempt in decisions.preempts:
            victim = live.get(preempt.job_id)
            if victim is None or preempt.job_id in stopping:
                continue
            stopping.add(victim.id)
            ends[victim.id] = min(ends[victim.id], t + grace)
            live[victim.id] = replace(victim, stopping=True)
            if ranks is not None:
                ranks.remove(victim)
                ranks.add(live[victim.id])
        if left is not None and not left:
            break
        if decisions.starts and preemptive and waiting and again < 16:
            again += 1  # as the simulator does: ask again once the started jobs are running
            continue
        again = 0
        wake = (
            decisions.wake_at
            if decisions.wake_at is not None and decisions.wake_at > t
            else math.inf
        )
        t_next = min(min(ends.values(), default=math.inf), wake)
        if math.isinf(t_next):
            break  # nothing known will ever change: the rest get no estimate
        t = max(t, t_next)
        for job_id in [j for j, e in ends.items() if e <= t]:
            ended = live.pop(job_id)
            del ends[job_id]
            if ranks is not None:
                ranks.remove(ended)
            capacity = capacity.give_back(ended.placement)
            if job_id in stopping:
                stopping.discard(job_id)
                if _finished_by(ended, t, run_times, q):
                    continue
                back = _requeued(ended, t)
                k = key(back)
                i = bisect.bisect_right(keys, k)
                keys.insert(i, k)
                waiting.insert(i, back)
                by_id[back.id] = back
                sizes[back.request.whole_gpus] = sizes.get(back.request.whole_gpus, 0) + 1
                if back.request not in counts:
                    shapes = None
                counts[back.request] = counts.get(back.request, 0) + 1
    return started, refresh, calls


def _ranks_for(policy: Policy, queue: PresortedQueue | None, running: Sequence[RunningJob]) -> Any:
    """A fresh index of running jobs by rank (``policy.running_ranks``), where the simulator
    would keep one: a queue of whole GPUs only, and running jobs on whole GPUs; else None."""
    factory = getattr(policy, "running_ranks", None)
    if not callable(factory) or queue is None or not queue.gpu_only:
        return None
    if any(r.placement.shared or not float(r.request.gpus).is_integer() for r in running):
        return None
    return factory()


def _seconds_before(job: QueuedJob | RunningJob) -> float:
    """Seconds a job ran before this run (its service over its GPUs)."""
    gpus = job.request.gpus
    return job.attained / gpus if gpus > 0 else 0.0


def _finished_by(job: RunningJob, t: float, run_times: RunTimes, q: float) -> bool:
    before = _seconds_before(job)
    total = run_times.total(job.owner, job.name, q, before, job.time_limit, job.request.gpus)
    return total is not None and before + (t - job.started) >= total


def _requeued(job: RunningJob, t: float) -> QueuedJob:
    """A preempted job back in the queue, keeping its service."""
    return QueuedJob(
        id=job.id,
        seq=job.seq,
        submitted=job.submitted,
        request=job.request,
        priority=job.priority,
        owner=job.owner,
        time_limit=job.time_limit,
        preemptible=job.preemptible,
        attained=job.attained_at(t),
        preemptions=1,
        remaining=job.remaining_at(t),
        name=job.name,
    )


def _estimated(job: QueuedJob, run_times: RunTimes, q: float) -> QueuedJob:
    """A job whose true remaining time is known (a replay) with the estimate instead, so a
    policy that reads it (``srtf``) ranks by what the forecast assumes, not by the truth."""
    before = _seconds_before(job)
    total = run_times.total(job.owner, job.name, q, before, job.time_limit, job.request.gpus)
    remaining = math.inf if total is None else max(0.0, total - before)
    kept = run_times.estimated.get((job.id, q))
    if kept is not None and kept[0] is job and kept[1].remaining == remaining:
        return kept[1]  # the same job with the same estimate: equal to a fresh copy
    if len(run_times.estimated) >= _ESTIMATED_KEPT:
        run_times.estimated.clear()
    made = replace(job, remaining=remaining)
    run_times.estimated[(job.id, q)] = (job, made)
    return made


def _with_remaining(job: RunningJob, remaining: float) -> RunningJob:
    return replace(job, remaining=remaining)

"""Elastic jobs: grow into idle GPUs, shrink first when others wait.

An elastic job asks for a range of whole GPUs (``gpus="1:4"``): it starts with
what is free (at least its minimum), and may be resized — by checkpoint and
restart — up to its maximum and back down. ``ElasticPolicy`` wraps any policy
(the same object in the live scheduler and the simulator) and adds that:

1. **Borrowed GPUs count as free.** The GPUs an elastic job holds beyond its
   minimum are *borrowed*: the wrapped policy sees the job at its minimum and
   those GPUs as free. So every policy — fair share included, which then
   counts only the minimum as the job's share — starts waiting work on them
   before it would preempt anything, and elastic jobs shrink first.
2. **Shrink for waiting work.** A start that lands on borrowed GPUs becomes a
   ``Resize`` of their holder down to the GPUs it keeps; the start waits until
   the holder has let go (the simulator's restart is instant, a live job's is
   a checkpoint), and the next decision places it.
3. **Grow into idle GPUs.** Whole GPUs still free after every start go to
   elastic jobs, one at a time to the smallest (water-filling, oldest first on
   ties), up to their maximum. A job starting now takes them for free; a
   running job only when the time it saves beats ``margin`` × its restart
   cost (a blind estimate: a job is expected to run at least as long again as
   it has run, and at least ``resize_every``; an oracle's true remaining time).
   Under a policy that ranks by remaining work (``srtf``) idle GPUs go in its
   rank order instead, and borrowed GPUs are lent only to a better-ranked job
   (``jupyter_dlsched.policy.elastic_ranks``).
4. **Hysteresis.** No job is resized within ``resize_every`` seconds of its
   last start or resize: its borrowed GPUs are not lent and it does not grow
   until then, and the policy asks to be woken when that time comes.
5. **Decided at the size it asked for.** A waiting job that says how narrow it
   may start (``QueuedJob.min_gpus``, a replay's job: its trace says what it
   asked for) is offered at the size it asked for, so the policy decides as for
   the rigid job, backfill included; it starts narrower only at the head of the
   line on GPUs the policy left idle (``jupyter_dlsched.policy.elastic_narrow``).
   Not under a policy that grows by rank (``srtf``): its rules weigh every
   waiting job at its minimum. A running job seen at its minimum keeps the
   service it had at the GPUs it really holds (``las`` and ``gittins`` rank by it).

>>> from jupyter_dlsched.policy import get_policy
>>> from jupyter_dlsched.policy.base import QueuedJob
>>> from jupyter_dlsched.vocab.resources import Capacity, Request
>>> policy = ElasticPolicy(get_policy("fifo"))
>>> job = QueuedJob("e", 0, 0.0, Request(gpus=1, cpus=0), max_gpus=2)
>>> cap = Capacity.empty(n_gpus=2, gpu_mem=1000, cpus=0, mem=0)
>>> [s.placement.gpus for s in policy([job], [], cap, 0.0).starts]
[(0, 1)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..vocab.resources import Capacity, Placement
from .base import (
    Decisions,
    Policy,
    PolicyGate,
    QueuedJob,
    Resize,
    RunningJob,
    Start,
    narrowed,
    passes_through,
)
from .elastic_narrow import start_narrow
from .elastic_ranks import Grower, RankedGrowth, placed
from .speedup import Speedup, parse_speedup

RESIZE_EVERY = 300.0


class ElasticPolicy(RankedGrowth, PolicyGate):
    """``policy`` with elastic jobs handled (see the module's docstring).

    ``resize_every``: seconds between two resizes of one job (default 300);
    ``restart_cost``: seconds a resize costs the job (also told to the wrapped
    policy, which weighs preemptions by it); ``speedup``: the model a growth
    is weighed with (``"linear"``, ``"amdahl:0.05"``, a table; see
    ``jupyter_dlsched.policy.speedup``); ``margin``: how many restart costs a
    growth must save.
    """

    def __init__(
        self,
        policy: Policy,
        resize_every: float = RESIZE_EVERY,
        restart_cost: float = 30.0,
        speedup: str | Speedup = "linear",
        margin: float = 2.0,
    ) -> None:
        super().__init__(policy)
        if not (math.isfinite(resize_every) and resize_every >= 0):
            raise ValueError(f"resize_every={resize_every!r}: expected seconds >= 0")
        self.resize_every = float(resize_every)
        self._restart_cost = float(restart_cost)
        self.speedup = parse_speedup(speedup)
        self.margin = float(margin)
        self.elastic = True
        # a replay offers its queued elastic jobs at the size they asked for (see
        # ``elastic_narrow``); a policy that grows by rank weighs them at their minimum
        self.as_asked = not getattr(policy, "grows_by_rank", False)

    @property
    def restart_cost(self) -> float:
        return self._restart_cost

    @restart_cost.setter
    def restart_cost(self, seconds: float) -> None:
        self._restart_cost = float(seconds)
        if hasattr(self._policy, "restart_cost"):
            self._policy.restart_cost = seconds

    def passes_through(
        self,
        decisions: Decisions,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
    ) -> bool:
        """No elastic job runs, none started, none waits to resume: the wrapped policy's
        decisions, on the capacity it was given (see ``PolicyGate.passes_through``)."""
        if any(j.min_gpus is not None for j in running):
            return False
        if any(j.max_gpus is not None or j.resume_on is not None for j in queued):
            return False
        return passes_through(self._policy, decisions, queued, running)

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        resumed, queued, capacity = _resume(queued, capacity)
        decisions = self._decide(queued, running, capacity, now)
        decisions.starts[:0] = resumed
        return decisions

    def _decide(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        lent: dict[int, RunningJob] = {}  # borrowed GPU -> the elastic job holding it
        unlock = math.inf  # when the next locked elastic job may be resized
        elastic_running = [j for j in running if j.min_gpus is not None]
        ranks = None
        if elastic_running or any(q.max_gpus is not None for q in queued):
            ranks = self._ranks(queued, elastic_running)
        claimed: list[Grower] = []
        if ranks is not None:
            claimed = self._claim(queued, ranks, elastic_running, capacity, now)
        for grower in claimed:  # held for the growth: the wrapped policy does not see them
            assert grower.running is not None
            held = set(grower.placement.gpus) - set(grower.running.placement.gpus)
            capacity = capacity.take(_part(grower.placement, held))
        view = capacity
        for job in elastic_running:
            low, size = int(job.min_gpus or 1), len(job.placement.gpus)
            if job.stopping or size <= low and size >= int(job.max_gpus or size):
                continue
            if any(g.id == job.id for g in claimed) or not self._lends(job, ranks, now):
                continue
            if now - job.started < self.resize_every:
                unlock = min(unlock, job.started + self.resize_every)
                continue
            if size > low:
                extra = Placement(
                    gpus=job.placement.gpus[low:], gpu_mem=job.placement.gpu_mem[low:]
                )
                view = view.give_back(extra)
                for g in extra.gpus:
                    lent[g] = job
        offered = running
        if lent:
            holders = {j.id for j in lent.values()}
            offered = [self._at_minimum(j, now) if j.id in holders else j for j in running]
        decisions = self._policy(queued, offered, view, now)
        starting = _starting(queued, decisions.starts)
        if (
            not lent
            and not claimed
            and not elastic_running
            and not any(q.max_gpus is not None for q in starting.values())
            and not any(q.min_gpus is not None for q in queued)
        ):
            return decisions
        room, starts, taken = self._place_starts(decisions, capacity, lent)
        stopped = {p.job_id for p in decisions.preempts}
        for job_id, gpus in taken.items():
            if job_id in stopped:
                continue
            job = next(j for j in lent.values() if j.id == job_id)
            keep = [i for i, g in enumerate(job.placement.gpus) if g not in gpus]
            placement = replace(
                job.placement,
                gpus=tuple(job.placement.gpus[i] for i in keep),
                gpu_mem=tuple(job.placement.gpu_mem[i] for i in keep),
            )
            decisions.resizes.append(
                Resize(job_id, placement, f"shrunk to {_gpus(len(keep))} for waiting work")
            )
        if room.free_whole_gpus and any(q.min_gpus is not None for q in queued):
            owners: dict[str, float] = {}
            for s in starts:
                owner = starting[s.job_id].owner
                owners[owner] = owners.get(owner, 0.0) + len(s.placement.gpus)
            budget = _gpu_budget(self._policy, running, owners)
            narrow, room = start_narrow(queued, decisions, starts, room, budget)
            starting.update({job_id: q for job_id, (q, _) in narrow.items()})
            starts += [Start(job_id, placement) for job_id, (_, placement) in narrow.items()]
        by_rank = ranks is not None
        policy = self._policy
        growers = [
            Grower(
                s.job_id,
                q.seq,
                len(s.placement.gpus),
                q.max_gpus,
                s.placement,
                None,
                q.owner,
                policy.queued_rank(q) if by_rank else 0.0,  # type: ignore[attr-defined]
                q.remaining if by_rank else None,
            )
            for s in starts
            if (q := starting[s.job_id]).max_gpus is not None
        ]
        for job in elastic_running:
            if (
                job.id in taken
                or job.id in stopped
                or any(g.id == job.id for g in claimed)
                or job.stopping
                or now - job.started < self.resize_every
                or len(job.placement.gpus) >= int(job.max_gpus or 0)
            ):
                continue
            size = len(job.placement.gpus)
            growers.append(
                Grower(
                    job.id,
                    job.seq,
                    size,
                    int(job.max_gpus or size),
                    job.placement,
                    job,
                    job.owner,
                    policy.running_rank(job, now) if by_rank else 0.0,  # type: ignore[attr-defined]
                    job.remaining_at(now) if by_rank else None,
                )
            )
        starting_gpus: dict[str, float] = {}
        for s in starts:
            owner = starting[s.job_id].owner if s.job_id in starting else ""
            starting_gpus[owner] = starting_gpus.get(owner, 0.0) + len(s.placement.gpus)
        budget = _gpu_budget(self._policy, running, starting_gpus)
        deferred: set[str] = set()
        if ranks is not None:
            grown, deferred = self._grow_by_rank(growers, room, ranks, now, budget)
            grown += claimed
        else:
            grown = self._grow(growers, room, now, budget)
        by_id = {grower.id: grower for grower in grown}
        decisions.starts = [
            Start(s.job_id, by_id[s.job_id].placement) if s.job_id in by_id else s
            for s in starts
            if s.job_id not in deferred
        ]
        for job_id in deferred:
            decisions.waiting[job_id] = "waiting: its GPUs go to elastic jobs with less work left"
        for grower in grown:
            if grower.running is not None:
                decisions.resizes.append(
                    Resize(
                        grower.id, grower.placement, f"grown to {_gpus(grower.size)} into idle GPUs"
                    )
                )
        if unlock < math.inf and (room.free_whole_gpus or decisions.waiting):
            wake = decisions.wake_at
            decisions.wake_at = unlock if wake is None else min(wake, unlock)
        return decisions

    def _place_starts(
        self, decisions: Decisions, capacity: Capacity, lent: dict[int, RunningJob]
    ) -> tuple[Capacity, list[Start], dict[str, set[int]]]:
        """Move starts off borrowed GPUs where free ones are left; the rest wait for shrinks.

        Returns the capacity left, the starts that go ahead, and for each elastic
        job the borrowed GPUs that waiting starts need from it.
        """
        room = capacity
        for start in decisions.starts:  # first what needs no borrowed GPU, held for its start
            room = room.take(_part(start.placement, set(start.placement.gpus) - lent.keys()))
        starts: list[Start] = []
        taken: dict[str, set[int]] = {}
        for start in decisions.starts:
            placement = start.placement
            if any(g in lent for g in placement.gpus):
                moved = _off_borrowed(placement, room, lent)
                room = room.take(_part(moved, set(moved.gpus) - set(placement.gpus)))
                placement = moved
            if not any(g in lent for g in placement.gpus):
                starts.append(Start(start.job_id, placement))
                continue
            holders = sorted({lent[g].id for g in placement.gpus if g in lent})
            for g in placement.gpus:
                if g in lent:
                    taken.setdefault(lent[g].id, set()).add(g)
            # its other GPUs stay held for it until the shrink lets go of the rest
            decisions.waiting[start.job_id] = (
                f"waiting for elastic job{'s' if len(holders) > 1 else ''} "
                f"{', '.join(holders)} to shrink"
            )
        return room, starts, taken

    def _grow(
        self,
        growers: list[Grower],
        room: Capacity,
        now: float,
        budget: dict[str, float] | None = None,
    ) -> list[Grower]:
        """Share the whole GPUs free in ``room`` among ``growers``; those that grew.

        ``budget``: the GPUs each owner with a per-user limit may still take (a shared
        pool's ``max_gpus``): growing never puts an owner over it."""
        free = [g for g in room.gpus if g.jobs == 0]
        while growers and free:
            sizes = {g.id: g.size for g in growers}
            left_to = dict(budget or {})
            left = len(free)
            while left:
                open_ = [
                    g
                    for g in growers
                    if sizes[g.id] < g.most and left_to.get(g.owner, math.inf) >= 1
                ]
                if not open_:
                    break
                pick = min(open_, key=lambda g: (sizes[g.id], g.seq))
                sizes[pick.id] += 1
                if pick.owner in left_to:
                    left_to[pick.owner] -= 1
                left -= 1
            unworthy = [
                g
                for g in growers
                if g.running is not None
                and sizes[g.id] > g.size
                and not self._worth(g.running, g.size, sizes[g.id], now)
            ]
            if unworthy:
                growers = [g for g in growers if g not in unworthy]
                continue
            return placed(growers, sizes, room, free)
        return []

    def _at_minimum(self, job: RunningJob, now: float) -> RunningJob:
        """``job`` as the wrapped policy sees it: holding only its minimum (and, for an
        oracle, needing as long as it would there)."""
        low, size = int(job.min_gpus or 1), len(job.placement.gpus)
        remaining = job.remaining
        if remaining is not None:
            left = job.remaining_at(now) or 0.0
            remaining = (now - job.started) + left * self.speedup.ratio(low, size)
        # the service it has had in this run is at the GPUs it really holds
        attained = job.attained + (size - low) * max(0.0, now - job.started)
        return replace(
            job,
            attained=attained,
            request=replace(job.request, gpus=float(low)),
            placement=replace(
                job.placement, gpus=job.placement.gpus[:low], gpu_mem=job.placement.gpu_mem[:low]
            ),
            remaining=remaining,
        )

    def _worth(self, job: RunningJob, old: int, new: int, now: float) -> bool:
        """Whether growing ``job`` from ``old`` to ``new`` GPUs saves more than it costs."""
        # an oracle's remaining time where the policy reads it; else the blind estimate
        left = job.remaining_at(now) if getattr(self._policy, "oracle", False) else None
        if left is None:
            age = job.attained_at(now) / max(1, old)
            left = max(self.resize_every, age)  # seconds still to run at ``old`` GPUs
        expected = left
        saved = expected * (1.0 - 1.0 / self.speedup.ratio(old, new))
        return saved > self.margin * self._restart_cost


def _part(placement: Placement, keep: set[int]) -> Placement:
    """``placement`` with only the GPUs in ``keep`` (cores and memory dropped)."""
    chosen = [i for i, g in enumerate(placement.gpus) if g in keep]
    return Placement(
        gpus=tuple(placement.gpus[i] for i in chosen),
        gpu_mem=tuple(placement.gpu_mem[i] for i in chosen),
        shared=placement.shared,
    )


def _off_borrowed(placement: Placement, room: Capacity, lent: dict[int, RunningJob]) -> Placement:
    """``placement`` with its borrowed GPUs swapped for free ones of the same kind, where any."""
    used = set(placement.gpus)
    gpus, mems = list(placement.gpus), list(placement.gpu_mem)
    for i, g in enumerate(gpus):
        if g not in lent:
            continue
        want = room.gpus[g] if g < len(room.gpus) and room.gpus[g].index == g else None
        for card in room.gpus:
            if (
                card.jobs == 0
                and card.index not in used
                and card.index not in lent
                and (want is None or (card.mem_total, card.group) == (want.mem_total, want.group))
            ):
                used.add(card.index)
                gpus[i] = card.index
                if not placement.shared:
                    mems[i] = card.mem_free
                break
    return replace(placement, gpus=tuple(gpus), gpu_mem=tuple(mems))


def _resume(
    queued: Sequence[QueuedJob], capacity: Capacity
) -> tuple[list[Start], Sequence[QueuedJob], Capacity]:
    """Start again at once the elastic jobs that stopped for a resize, where their new GPUs
    are free; the rest of the queue and what is left for it."""
    resuming = [q for q in queued if q.resume_on is not None]
    if not resuming:
        return [], queued, capacity
    cards = {g.index: g for g in capacity.gpus}
    starts: list[Start] = []
    for job in resuming:
        placement = job.resume_on
        assert placement is not None
        if all(g in cards and cards[g].jobs == 0 for g in placement.gpus):
            starts.append(Start(job.id, placement))
            capacity = capacity.take(placement)
            cards = {g.index: g for g in capacity.gpus}
    if not starts:
        return [], queued, capacity
    ids = {s.job_id for s in starts}
    return starts, narrowed(queued, [q for q in queued if q.id not in ids]), capacity


def _starting(queued: Sequence[QueuedJob], starts: list[Start]) -> dict[str, QueuedJob]:
    """The queued jobs that ``starts`` start, by id."""
    wanted = {s.job_id for s in starts}
    found: dict[str, QueuedJob] = {}
    if not wanted:
        return found
    for job in queued:
        if job.id in wanted:
            found[job.id] = job
            if len(found) == len(wanted):
                break
    return found


def _gpu_budget(
    policy: Policy, running: Sequence[RunningJob], starting: dict[str, float]
) -> dict[str, float]:
    """What the first gate in ``policy``'s chain that limits GPUs per owner (a shared
    pool's ``LimitsGate``) lets each owner still take; empty when none limits them."""
    while policy is not None:
        budget = getattr(policy, "gpu_budget", None)
        if callable(budget):
            return dict(budget(running, starting))
        policy = getattr(policy, "_policy", None)  # type: ignore[assignment]
    return {}


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def with_elastic(policy: Policy, **params: float | str | Speedup) -> ElasticPolicy:
    """``policy`` wrapped for elastic jobs, unless it already is."""
    if isinstance(policy, ElasticPolicy):
        return policy
    return ElasticPolicy(policy, **params)  # type: ignore[arg-type]

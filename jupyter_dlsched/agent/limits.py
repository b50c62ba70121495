"""Per-user limits of a shared pool: a policy wrapper that holds back jobs over a limit.

Like the staging gate, ``LimitsGate`` wraps the pool's policy for one tick:
jobs whose owner is at a limit are not offered to the policy, and a decision
that would start several jobs of one owner keeps only those within the limit.
A held job's waiting reason names the limit: ``"ana holds 4 GPUs, the limit
per user is 4"``. ``ScheduleRuns`` counts the runs each user's schedules make, and
turns a tick past ``max_schedule_runs_per_hour`` into a skip.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..policy import Decisions, Policy, QueuedJob, RunningJob
from ..policy.base import PolicyGate, narrowed
from ..vocab.resources import Capacity
from ..vocab.schedule_info import ScheduleInfo
from .config import Limits, ServiceConfig

#: The window ``max_schedule_runs_per_hour`` counts runs in, in seconds.
HOUR = 3600.0


class LimitsGate(PolicyGate):
    """``policy`` with each user's ``max_gpus`` and ``max_running`` applied."""

    def __init__(self, policy: Policy, config: ServiceConfig) -> None:
        super().__init__(policy)
        self._config = config

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        gpus: dict[str, float] = {}
        count: dict[str, int] = {}
        for active in running:
            gpus[active.owner] = gpus.get(active.owner, 0.0) + active.request.gpus
            count[active.owner] = count.get(active.owner, 0) + 1
        held: dict[str, str] = {}
        offered: list[QueuedJob] = []
        for job in queued:
            why = _over(job, self._config.limits_for(job.owner), gpus, count)
            if why:
                held[job.id] = why
            else:
                offered.append(job)
        if not held and not any(_limited(self._config.limits_for(j.owner)) for j in queued):
            return self._policy(queued, running, capacity, now)
        decisions = self._policy(narrowed(queued, offered), running, capacity, now)
        by_id = {j.id: j for j in offered}
        kept = []
        for start in decisions.starts:
            chosen = by_id.get(start.job_id)
            if chosen is None:
                kept.append(start)
                continue
            why = _over(chosen, self._config.limits_for(chosen.owner), gpus, count)
            if why:
                held[start.job_id] = why
                continue
            kept.append(start)
            gpus[chosen.owner] = gpus.get(chosen.owner, 0.0) + chosen.request.gpus
            count[chosen.owner] = count.get(chosen.owner, 0) + 1
        decisions.starts = kept
        decisions.waiting.update(held)
        decisions.order = list(decisions.order) + [j.id for j in queued if j.id in held]
        return decisions

    def gpu_budget(
        self, running: Sequence[RunningJob], starting: dict[str, float]
    ) -> dict[str, float]:
        """GPUs each owner with a ``max_gpus`` may still take: the limit less what their
        running jobs hold (an elastic job all the GPUs it holds now) and ``starting``
        (owner -> GPUs of this decision's starts). Elastic jobs grow only within it."""
        held: dict[str, float] = dict(starting)
        for job in running:
            size = float(len(job.placement.gpus)) if job.min_gpus is not None else job.request.gpus
            held[job.owner] = held.get(job.owner, 0.0) + size
        budget = {}
        for owner, gpus in held.items():
            cap = self._config.limits_for(owner).max_gpus
            if cap is not None:
                budget[owner] = cap - gpus
        return budget


def _limited(limits: Limits) -> bool:
    return limits.max_gpus is not None or limits.max_running is not None


def _over(
    job: QueuedJob, limits: Limits, gpus: dict[str, float], count: dict[str, int]
) -> str | None:
    """Why starting ``job`` would put its owner over a limit, or None."""
    owner = job.owner
    if limits.max_running is not None and count.get(owner, 0) + 1 > limits.max_running:
        n = count.get(owner, 0)
        return (
            f"{owner} has {n} job{'s' if n != 1 else ''} running, "
            f"the limit per user is {limits.max_running}"
        )
    held = gpus.get(owner, 0.0)
    if (
        limits.max_gpus is not None
        and job.request.gpus
        and held + job.request.gpus > limits.max_gpus
    ):
        return (
            f"{owner} holds {held:g} GPU{'s' if held != 1 else ''}, "
            f"the limit per user is {limits.max_gpus:g}"
        )
    return None


class ScheduleRuns:
    """Whether a schedule's tick may make its run: its owner's schedules made fewer than
    ``max_schedule_runs_per_hour`` in the last hour (the engine's ``fire_gate``).

    The runs a schedule makes end at once and so never count in ``max_queued``; this is
    what bounds the jobs a user's schedules add to every decision. The count lives in
    the service (a restart forgets an hour at most)."""

    def __init__(self, config: ServiceConfig) -> None:
        self._config = config
        self._runs: dict[int, deque[float]] = {}

    def __call__(self, schedule: ScheduleInfo, now: float) -> bool:
        cap = self._config.limits_for(schedule.owner).max_schedule_runs_per_hour
        if cap is None:
            return True
        runs = self._runs.setdefault(schedule.uid, deque())
        while runs and runs[0] <= now - HOUR:
            runs.popleft()
        if len(runs) >= cap:
            return False
        runs.append(now)
        return True

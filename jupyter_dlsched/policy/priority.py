"""The default policy: priority with aging, deadline tie-break, EASY backfill.

Order: effective priority (base priority plus ``aging_step`` points for every
``aging_interval`` seconds waited, so nothing starves), then earliest deadline,
then submit order. Jobs start in that order while they fit. The first job that
does not fit gets a reservation: the devices it will take when running jobs
end (their ``time_limit`` tells when). Jobs behind it may still start
(backfill) if they end before that moment, or if they only use what the
reservation leaves free, so a blocked big job is never delayed by small ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..placement import place
from ..resources import EPS, Capacity, Placement, Request
from .base import Decisions, QueuedJob, RunningJob, Start, describe_shortfall


@dataclass
class PriorityPolicy:
    """Priority + aging + deadline + EASY backfill.

    Parameters (all configuration, defaults shown):

    * ``aging_step=10``, ``aging_interval=600``: +10 priority per 10 minutes waited;
    * ``backfill=True``: let later jobs use resources a blocked job cannot use yet.
    """

    aging_step: float = 10.0
    aging_interval: float = 600.0
    backfill: bool = True
    name: str = "priority"

    def effective_priority(self, job: QueuedJob, now: float) -> float:
        if self.aging_interval <= 0:
            return float(job.priority)
        waited = max(0.0, now - job.submitted)
        return job.priority + self.aging_step * math.floor(waited / self.aging_interval)

    def sort_key(self, job: QueuedJob, now: float) -> tuple:
        deadline = job.deadline if job.deadline is not None else math.inf
        return (-self.effective_priority(job, now), deadline, job.seq)

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        out = Decisions()
        ordered = sorted(queued, key=lambda j: self.sort_key(j, now))
        out.order = [j.id for j in ordered]
        holders: list[tuple[float | None, Placement]] = [
            (r.expected_end, r.placement) for r in running
        ]
        head: QueuedJob | None = None
        shadow: float | None = None
        protected = capacity
        for job in ordered:
            if head is None:
                placement = place(job.request, capacity)
                if placement is not None:
                    capacity = capacity.take(placement)
                    out.starts.append(Start(job.id, placement))
                    holders.append((_end(now, job.time_limit), placement))
                    continue
                head = job
                out.waiting[job.id] = describe_shortfall(job.request, capacity)
                if not self.backfill:
                    continue
                shadow, reserved = _reservation(job.request, capacity, holders)
                protected = _protect(capacity, job.request, reserved)
                continue
            if not self.backfill:
                out.waiting[job.id] = f"behind {head.id} (higher in line)"
                continue
            ends_in_time = (
                shadow is not None
                and job.time_limit is not None
                and now + job.time_limit <= shadow + EPS
            )
            placement = place(job.request, capacity if ends_in_time else protected)
            if placement is None:
                if place(job.request, capacity) is None:
                    out.waiting[job.id] = describe_shortfall(job.request, capacity)
                else:
                    out.waiting[job.id] = f"resources held for {head.id} (ahead in line)"
                continue
            capacity = capacity.take(placement)
            protected = _take_clamped(protected, placement)
            out.starts.append(Start(job.id, placement))
        return out


def _end(now: float, time_limit: float | None) -> float | None:
    return None if time_limit is None else now + time_limit


def _reservation(
    request: Request,
    capacity: Capacity,
    holders: list[tuple[float | None, Placement]],
) -> tuple[float | None, Placement | None]:
    """When and where ``request`` could start as known-ending jobs finish."""
    future = capacity
    for end, placement in sorted(
        ((e, p) for e, p in holders if e is not None), key=lambda item: item[0]
    ):
        future = future.give_back(placement)
        spot = place(request, future)
        if spot is not None:
            return end, spot
    return None, None


def _protect(capacity: Capacity, request: Request, reserved: Placement | None) -> Capacity:
    """Capacity left for jobs that may run past the reservation: the head's share withheld.

    With a known reservation the reserved devices are withheld; without one
    (running jobs have no time limit) the head keeps first claim on whatever
    it could use of what is free now.
    """
    if reserved is not None:
        gpu_ids = set(reserved.gpus)
    elif request.whole_gpus:
        gpu_ids = {g.index for g in capacity.gpus if g.whole_free}
        gpu_ids = set(sorted(gpu_ids)[: request.whole_gpus])
    elif request.shared:
        roomiest = max(capacity.gpus, key=lambda g: g.mem_free, default=None)
        gpu_ids = {roomiest.index} if roomiest is not None else set()
    else:
        gpu_ids = set()
    gpus = tuple(
        replace(
            g,
            jobs=g.jobs + 1,
            mem_free=(
                max(0, g.mem_free - request.gpu_mem_on(g.mem_total)) if request.shared else 0
            ),
        )
        if g.index in gpu_ids
        else g
        for g in capacity.gpus
    )
    withheld = Placement(
        cpus=tuple(range(len(capacity.cpu_load))),
        cpu_share=min(request.cpus, capacity.cpus_free),
        mem=min(request.mem, capacity.mem_free),
    )
    return _take_clamped(replace(capacity, gpus=gpus), withheld)


def _take_clamped(capacity: Capacity, placement: Placement) -> Capacity:
    taken = capacity.take(placement)
    return replace(
        taken,
        gpus=tuple(replace(g, mem_free=max(0, g.mem_free)) for g in taken.gpus),
        mem_free=max(0, taken.mem_free),
    )

"""First in, first out: the head of the queue blocks everything behind it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..placement import place
from ..resources import Capacity
from .base import Decisions, QueuedJob, RunningJob, Start, describe_shortfall


@dataclass
class FifoPolicy:
    """Strict submit order; with ``skip=True`` jobs that fit jump a blocked head (first fit)."""

    skip: bool = False
    name: str = "fifo"

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions:
        out = Decisions()
        blocked: QueuedJob | None = None
        for job in sorted(queued, key=lambda j: j.seq):
            out.order.append(job.id)
            if blocked is not None and not self.skip:
                out.waiting[job.id] = f"behind {blocked.id} (first in line)"
                continue
            placement = place(job.request, capacity)
            if placement is None:
                out.waiting[job.id] = describe_shortfall(job.request, capacity)
                blocked = blocked or job
                continue
            capacity = capacity.take(placement)
            out.starts.append(Start(job.id, placement))
        return out

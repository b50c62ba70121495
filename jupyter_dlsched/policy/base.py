"""The policy interface: ``(queued, running, capacity, now) -> Decisions``.

A policy is a pure function of plain data: no I/O, no clock, no randomness.
The live scheduler and the simulator call the very same objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..resources import Capacity, Placement, Request


@dataclass(frozen=True)
class QueuedJob:
    """A job waiting to start (state ``queued`` or ``preempted``) whose dependencies are met."""

    id: str
    seq: int  # submit order
    submitted: float
    request: Request
    priority: int = 50
    owner: str = ""
    deadline: float | None = None
    time_limit: float | None = None  # also the duration estimate for backfill and sjf
    preemptible: bool = False
    attained: float = 0.0  # GPU-seconds of service received so far (las, gittins)
    preemptions: int = 0


@dataclass(frozen=True)
class RunningJob:
    """A job holding resources now."""

    id: str
    seq: int
    submitted: float
    started: float
    request: Request
    placement: Placement
    priority: int = 50
    owner: str = ""
    time_limit: float | None = None
    preemptible: bool = False
    attained: float = 0.0  # GPU-seconds before this run started

    @property
    def expected_end(self) -> float | None:
        return None if self.time_limit is None else self.started + self.time_limit


@dataclass(frozen=True)
class Start:
    """Start ``job_id`` on ``placement``."""

    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    """Stop ``job_id`` (SIGTERM, grace, requeue as ``preempted``)."""

    job_id: str
    reason: str


@dataclass
class Decisions:
    """What a policy decided in one tick.

    ``waiting`` says, for each job left in the queue, why it waits (the one
    question every queue user asks); ``order`` is the queue order (position 1
    starts next).
    """

    starts: list[Start] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


class Policy(Protocol):
    """Anything with a ``name`` that maps a snapshot to decisions."""

    name: str

    def __call__(
        self,
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> Decisions: ...


def describe_shortfall(request: Request, capacity: Capacity) -> str:
    """Words for why a request does not fit now: ``"waiting for 2 GPUs"``."""
    from ..units import format_size

    if request.whole_gpus and capacity.free_whole_gpus < request.whole_gpus:
        n = request.whole_gpus
        return f"waiting for {n} GPU{'s' if n > 1 else ''}"
    if request.shared:
        return "waiting for GPU memory" + (
            f" ({format_size(request.gpu_mem)})" if request.gpu_mem else ""
        )
    if request.cpus > capacity.cpus_free:
        return f"waiting for {request.cpus:g} CPU{'s' if request.cpus != 1 else ''}"
    if request.mem > capacity.mem_free:
        return f"waiting for {format_size(request.mem)} of memory"
    return "waiting for resources"

"""What a replay gives back: a ``JobOutcome`` per job inside a ``SimResult``, or a
``SimulationError`` when it cannot go on.

These are what ``jupyter_dlsched.sim.metrics`` summarises and
``jupyter_dlsched.sim.report`` tabulates and plots; the replay that fills them is
``jupyter_dlsched.sim.engine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..vocab.errors import DlschedError

if TYPE_CHECKING:  # annotations only: ``dlsched`` reads this module on every run (``gpus.py``)
    from ..policy.base import Policy
    from .eta import EtaCalibration


class SimulationError(DlschedError, RuntimeError):
    """The replay cannot go on: a policy broke a rule or left jobs waiting forever."""


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one job in a replay (times in seconds from the trace start).

    ``held`` is the time it held GPUs over all its runs (restart overhead and
    grace periods included), so ``queueing_delay`` (JCT − held) counts every
    wait: before the first start and after each preemption.
    """

    id: str
    submit: float
    gpus: float
    duration: float
    owner: str
    first_start: float
    finish: float
    preemptions: int
    held: float = math.nan
    resizes: int = 0

    @property
    def jct(self) -> float:
        return self.finish - self.submit

    @property
    def queueing_delay(self) -> float:
        """Seconds spent waiting in all, after preemptions too."""
        held = self.duration if math.isnan(self.held) else self.held
        return max(0.0, self.jct - held)

    @property
    def first_wait(self) -> float:
        """Seconds from submission to the first start."""
        return self.first_start - self.submit


@dataclass
class SimResult:
    """A replay's outcome: per-job records, GPU busy time and the busy-GPU timeline.

    ``busy_gpu_seconds`` is GPU time held (restart overhead included);
    ``work_gpu_seconds`` the useful part (GPUs × duration of every job).
    ``policy`` is the label of the row (``label``): the policy's name, with
    ``(oracle)`` when it read true remaining times, or time limits that were the
    jobs' true durations.
    """

    policy: str
    gpus: int
    jobs: list[JobOutcome]
    busy_gpu_seconds: float
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (time, busy GPUs)
    policy_calls: int = 0
    work_gpu_seconds: float = math.nan
    # every resize of an elastic job: (time, job id, GPUs before, GPUs after)
    resize_log: list[tuple[float, str, int, int]] = field(default_factory=list)
    # start estimates made at each submission and how they came true (``estimates=True``)
    eta: EtaCalibration | None = None


def label(policy: Policy, time_limits: str | float | None) -> str:
    """The policy's name, saying when it read what only a replay knows."""
    name = policy.name
    if getattr(policy, "oracle", False) and "oracle" not in name:
        return f"{name} (oracle)"
    if getattr(policy, "reads_time_limits", False) and time_limits == "exact":
        return f"{name} (oracle)"
    return name

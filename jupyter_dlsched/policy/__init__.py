"""Scheduling policies: pure functions from a snapshot to decisions.

Built in (``POLICIES``): ``priority`` (default), ``fifo``, ``fifo-ff``,
``sjf`` (by declared duration), ``sjf-gputime`` (by declared GPU-time),
``fair``, ``las``, ``gittins`` (learns job sizes online) and the
simulator-only oracle ``srtf``. ``docs/policies.md`` says when to pick which.

>>> policy = get_policy("priority")
>>> policy.name
'priority'
>>> get_policy("las", thresholds=[600, 6000]).thresholds
(600.0, 6000.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import (
    Decisions,
    FinishedJob,
    Policy,
    Preempt,
    PresortedQueue,
    QueuedJob,
    Room,
    RunningJob,
    Start,
    submit_order,
)
from .fair import FairPolicy
from .fifo import FifoPolicy
from .gittins import GittinsPolicy
from .las import LasPolicy
from .priority import PriorityPolicy
from .shortfall import describe_shortfall
from .sjf import SjfPolicy
from .srtf import SrtfPolicy


def _sjf_gputime(**params: Any) -> SjfPolicy:
    params.setdefault("by_gpu_time", True)
    return SjfPolicy(**params)


def _fifo_ff(**params: Any) -> FifoPolicy:
    params.setdefault("skip", True)
    params.setdefault("name", "fifo-ff")
    return FifoPolicy(**params)


POLICIES: dict[str, Callable[..., Policy]] = {
    "priority": PriorityPolicy,
    "fifo": FifoPolicy,
    "fifo-ff": _fifo_ff,
    "sjf": SjfPolicy,
    "sjf-gputime": _sjf_gputime,
    "fair": FairPolicy,
    "las": LasPolicy,
    "gittins": GittinsPolicy,
    "srtf": SrtfPolicy,
}


def get_policy(name: str | Policy = "priority", **params: Any) -> Policy:
    """The policy called ``name``, built with ``params``; a policy object passes through."""
    from ..vocab.errors import SpecError

    if not isinstance(name, str):
        return name
    try:
        factory = POLICIES[name]
    except KeyError:
        raise SpecError("policy", name, "one of " + ", ".join(sorted(POLICIES))) from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise SpecError(f"{name} policy parameters", params, f"valid parameters ({exc})") from None


__all__ = [
    "POLICIES",
    "Decisions",
    "FairPolicy",
    "FifoPolicy",
    "FinishedJob",
    "GittinsPolicy",
    "LasPolicy",
    "Policy",
    "Preempt",
    "PresortedQueue",
    "PriorityPolicy",
    "QueuedJob",
    "Room",
    "RunningJob",
    "SjfPolicy",
    "SrtfPolicy",
    "Start",
    "describe_shortfall",
    "get_policy",
    "submit_order",
]

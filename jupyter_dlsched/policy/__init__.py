"""Scheduling policies: pure functions from a snapshot to decisions.

>>> policy = get_policy("priority")
>>> policy.name
'priority'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Decisions, Policy, Preempt, QueuedJob, RunningJob, Start, describe_shortfall
from .fifo import FifoPolicy
from .priority import PriorityPolicy

POLICIES: dict[str, Callable[..., Policy]] = {
    "priority": PriorityPolicy,
    "fifo": FifoPolicy,
    "fifo-ff": lambda **kw: FifoPolicy(skip=True, name="fifo-ff", **kw),
}


def get_policy(name: str | Policy = "priority", **params: Any) -> Policy:
    """The policy called ``name``, built with ``params``; a policy object passes through."""
    from ..errors import SpecError

    if not isinstance(name, str):
        return name
    try:
        factory = POLICIES[name]
    except KeyError:
        raise SpecError("policy", name, "one of " + ", ".join(sorted(POLICIES))) from None
    return factory(**params)


__all__ = [
    "POLICIES",
    "Decisions",
    "FifoPolicy",
    "Policy",
    "Preempt",
    "PriorityPolicy",
    "QueuedJob",
    "RunningJob",
    "Start",
    "describe_shortfall",
    "get_policy",
]

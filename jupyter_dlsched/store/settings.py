"""Ledger-wide settings every participant reads: policy, lease length, grace period."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import Store


@dataclass
class Settings:
    """Ledger-wide settings every participant reads (``meta`` key ``settings``)."""

    lease_ttl: float = 10.0
    grace: float = 10.0
    policy: str = "priority"
    policy_params: dict[str, Any] | None = None
    # seconds between two resizes of one elastic job (``jupyter_dlsched.policy.elastic``)
    resize_every: float = 300.0
    # seconds one resize is assumed to cost a job (checkpoint, restart, warm-up): a running
    # elastic job grows only when that saves more than twice this
    resize_cost: float = 30.0
    # seconds at least between two ticks of a schedule (``--every``): each tick makes a job
    min_schedule_interval: float = 60.0

    def preempt_grace(self) -> float:
        """Seconds a preempted job gets to checkpoint: the policy's ``preempt_grace``."""
        from ..policy import get_policy

        try:
            policy = get_policy(self.policy, **(self.policy_params or {}))
        except Exception:
            return self.grace
        return float(getattr(policy, "preempt_grace", self.grace))

    @classmethod
    def load(cls, store: Store) -> Settings:
        data = store.get_meta("settings", {}) or {}
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def check_resize_every(value: object, name: str = "resize_every") -> float | None:
    """``value`` as seconds between two resizes of one elastic job (``None`` passes).

    >>> check_resize_every("60")
    60.0
    """
    if value is None:
        return None
    from ..vocab.errors import SpecError
    from ..vocab.units import parse_duration

    allowed = "a duration of 0 seconds or more, such as 300 or '5m'"
    if isinstance(value, bool):
        raise SpecError(name, value, allowed)
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        try:
            seconds = parse_duration(value, name)
        except SpecError:
            raise SpecError(name, value, allowed) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SpecError(name, value, allowed)
    return seconds

"""Ledger-wide settings every participant reads: policy, lease length, grace period."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .store import Store


@dataclass
class Settings:
    """Ledger-wide settings every participant reads (``meta`` key ``settings``)."""

    lease_ttl: float = 10.0
    grace: float = 10.0
    policy: str = "priority"
    policy_params: dict[str, Any] | None = None

    def preempt_grace(self) -> float:
        """Seconds a preempted job gets to checkpoint: the policy's ``preempt_grace``."""
        from .policy import get_policy

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

"""``ScheduleInfo``: one schedule as callers see it (the ledger's ``schedules`` part reads
these; the client, the agent and ``dlsched schedules`` pass them on)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule: ``dlsched schedules`` lists these."""

    id: str
    owner: str
    uid: int
    every: str
    template: str
    name: str
    created: float
    next_run: float
    last_job: str | None
    last_state: str | None
    runs: int
    skipped: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

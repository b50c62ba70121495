"""How the pool agent decides: the direct path's ``Scheduler`` with the agent's hooks.

``AgentScheduler`` ticks on the ledger like any direct-path scheduler, with the
service's per-user limits around the policy, every user's jobs launched (in a shared
pool) by forking their supervisors from the agent (``ForkingBackend``), stagers
forked the same way, and places in line written at most once a second when many
moved. It knows of the agent only what ``AgentSide`` names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

from ..backends.local import LocalBackend
from ..policy import Policy
from ..scheduler import Scheduler
from ..schema import JobInfo
from .config import ServiceConfig
from .limits import LimitsGate


class AgentSide(Protocol):
    """What the agent's decider uses of the agent: its configuration, whether it serves
    everyone, the flag that asks for a decision, and its forks."""

    shared: bool
    config: ServiceConfig | None
    _dirty: bool

    def fork_supervisor(self, job: JobInfo) -> None: ...

    def fork_stager(self, source_id: str) -> None: ...


#: Waiting jobs whose place in line changed that are written at once; more wait up to 1 s.
POSITIONS_AT_ONCE = 200

#: Seconds before an allocated job nobody claimed is launched again.
RELAUNCH_AFTER = 5.0


class ForkingBackend(LocalBackend):
    """The local backend as the agent runs it: supervisors are forked by the agent itself."""

    def __init__(self, agent: AgentSide) -> None:
        super().__init__(None)
        self.agent = agent

    def launch(self, job: JobInfo) -> None:
        self.agent.fork_supervisor(job)


class AgentScheduler(Scheduler):
    """The scheduler inside the agent: the service's limits, and every user's jobs launched."""

    def __init__(self, agent: AgentSide, home: str | os.PathLike[str], **options: Any) -> None:
        self.agent = agent
        self._tried: dict[str, float] = {}
        self._positions: dict[str, tuple[int | None, str | None]] = {}
        self._positions_at = 0.0
        super().__init__(home, backend=ForkingBackend(agent), loop=False, agent=False, **options)
        from ..tick import QueueIndex

        self._index = QueueIndex()

    def tick(self, now: float | None = None) -> Any:
        try:
            return super().tick(now)
        except BaseException:
            from ..tick import QueueIndex

            self._index = QueueIndex()  # read everything again after a failed decision
            raise

    def policy(self) -> Policy:
        policy = super().policy()
        if self.agent.config is not None:
            return LimitsGate(policy, self.agent.config)
        return policy

    def wake(self) -> None:
        """Decide at the end of this loop turn, not in the middle of a request."""
        self.agent._dirty = True

    @property
    def stager_uid(self) -> int | None:
        # a shared pool stages every user's inputs, each read as its owner (staging/owner.py)
        return None if self.agent.shared else int(self.uid)

    def _launch_stager(self, source_id: str) -> None:
        self.agent.fork_stager(source_id)

    def _queue_positions(self, changed: list[tuple[int | None, str | None, str]]) -> None:
        """Places in line, written at most once a second when many moved (a deep queue moves
        every job up at each start: written every time, that would be most of a decision)."""
        self._positions.update((job_id, (pos, why)) for pos, why, job_id in changed)
        if len(self._positions) <= POSITIONS_AT_ONCE:
            self.flush_positions(force=True)

    def flush_positions(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._positions and (force or now - self._positions_at >= 1.0):
            rows = [(pos, why, job_id) for job_id, (pos, why) in self._positions.items()]
            super()._queue_positions(rows)  # kept for the next try if the disk is full
            self._positions = {}
            self._positions_at = now

    def _launch_mine(self, now: float, just_started: Iterable[str]) -> None:
        """Launch every allocated job nobody claimed (a user's own, or all in a shared pool)."""
        fresh = set(just_started)
        uid = None if self.agent.shared else self.uid
        for job_id, started, inline in self.store.unlaunched(uid, self.backend.name):
            if inline:
                continue  # runs in the thread of the kernel that holds the cell
            if job_id not in fresh and now - self._tried.get(job_id, 0.0) < RELAUNCH_AFTER:
                continue
            if job_id not in fresh and started is not None and now - started < 1.0:
                continue  # a supervisor is claiming it right now
            self._tried[job_id] = now
            self.backend.launch(self.store.get(job_id))
        if len(self._tried) > 10_000:
            self._tried = {k: v for k, v in self._tried.items() if now - v < 60.0}

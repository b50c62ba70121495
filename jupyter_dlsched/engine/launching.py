"""Who starts what an engine's tick allocated: the jobs, and the stagers it armed.

``Launching`` is the engine's door for it. ``OwnJobs`` is a pool without an agent's:
each participant launches its own user's jobs, and steps in for an orphan another
participant allocated but did not launch. The pool agent's (every user's jobs, forked
from the agent) is ``agent.deciding.AgentLaunching``. Inline jobs (``--inline``) are
never launched here: only the process that holds the cell can run it, and its
``Scheduler`` does after each decision.
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..local import launcher

if TYPE_CHECKING:
    from ..backends import Backend
    from ..store import Store

#: Seconds an allocated job may wait for the participant that allocated it to launch it.
UNLAUNCHED_GRACE = 2.0


class Launcher(Protocol):
    """What launching uses of the engine it launches for."""

    store: Store
    backend: Backend
    home: Path


class Launching(Protocol):
    """How an engine starts what its tick allocated."""

    @property
    def stager_uid(self) -> int | None:
        """Whose stagings are started (None: everyone's)."""

    def launch_jobs(self, engine: Launcher, now: float, started: Set[str]) -> None:
        """Start the jobs allocated and not launched yet; ``started`` are this tick's."""

    def launch_stager(self, engine: Launcher, source_id: str) -> None:
        """Start the stager of a staging this tick armed."""


class OwnJobs:
    """This user's jobs and stagings, each started through this user's launcher."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self._orphan_tries: dict[str, float] = {}

    @property
    def stager_uid(self) -> int | None:
        return self.uid

    def launch_jobs(self, engine: Launcher, now: float, started: Set[str]) -> None:
        for job_id, allocated, inline in engine.store.queue.unlaunched(
            self.uid, engine.backend.name
        ):
            if inline:
                continue  # the kernel that holds the cell runs it; the lease reaps the rest
            if job_id not in started:
                # allocated by another participant, which launches it; step in if it did not
                if allocated is None or now - allocated < UNLAUNCHED_GRACE:
                    continue
                if now - self._orphan_tries.get(job_id, 0.0) < UNLAUNCHED_GRACE:
                    continue
                self._orphan_tries[job_id] = now
            engine.backend.launch(engine.store.get(job_id))

    def launch_stager(self, engine: Launcher, source_id: str) -> None:
        launcher.launch_stager(engine.home, source_id)

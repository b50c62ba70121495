"""How the pool agent decides: an ``Engine`` with the agent's limits, forks and loop.

The agent composes an engine (``engine/``) like every other decider, and plugs
into it what is its own: the service's per-user limits around the policy
(``LimitsGate``), every user's jobs launched (in a shared pool) by forking their
supervisors from the agent (``ForkingBackend``, ``AgentLaunching``), stagers
forked the same way, its loop as the wake-up, the waiting jobs kept in memory
between decisions (it is the ledger's one decider), and places in line written at
most once a second when many moved. It knows of the agent only what ``AgentSide``
names.
"""

from __future__ import annotations

import os
from collections.abc import Set
from typing import Any, Protocol

from ..backends.local import LocalBackend
from ..engine import Engine
from ..engine.launching import Launcher
from ..policy import Policy
from ..store import Store
from ..vocab.schema import JobInfo
from .config import ServiceConfig
from .limits import LimitsGate, ScheduleRuns


class AgentSide(Protocol):
    """What the agent's engine uses of the agent: its configuration, whether it serves
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


class AgentLaunching:
    """Every allocated job nobody claimed (a user's own, or all in a shared pool), and
    every user's stagings in a shared pool (each read as its owner, ``staging/owner.py``)."""

    def __init__(self, agent: AgentSide) -> None:
        self.agent = agent
        self.uid = os.getuid()
        self._tried: dict[str, float] = {}

    @property
    def stager_uid(self) -> int | None:
        return None if self.agent.shared else self.uid

    def launch_jobs(self, engine: Launcher, now: float, started: Set[str]) -> None:
        uid = None if self.agent.shared else self.uid
        for job_id, allocated, inline in engine.store.queue.unlaunched(uid, engine.backend.name):
            if inline:
                continue  # runs in the thread of the kernel that holds the cell
            if job_id not in started and now - self._tried.get(job_id, 0.0) < RELAUNCH_AFTER:
                continue
            if job_id not in started and allocated is not None and now - allocated < 1.0:
                continue  # a supervisor is claiming it right now
            self._tried[job_id] = now
            engine.backend.launch(engine.store.get(job_id))
        if len(self._tried) > 10_000:
            self._tried = {k: v for k, v in self._tried.items() if now - v < 60.0}

    def launch_stager(self, engine: Launcher, source_id: str) -> None:
        self.agent.fork_stager(source_id)


def agent_engine(agent: AgentSide, home: str | os.PathLike[str], **settings: Any) -> Engine:
    """The agent's engine on the ledger of ``home``, with ``settings`` written to it."""

    def gate(policy: Policy) -> Policy:
        return LimitsGate(policy, agent.config) if agent.config is not None else policy

    def wake() -> None:
        agent._dirty = True  # decide at the end of this loop turn, not in a request

    engine = Engine(
        Store(home),
        ForkingBackend(agent),
        launching=AgentLaunching(agent),
        gate=gate,
        wake=wake,
        keep_index=True,
        positions_at_once=POSITIONS_AT_ONCE,
        probe_pool=False,
    )
    if agent.config is not None:
        engine.fire_gate = ScheduleRuns(agent.config)
    engine.write_settings(**settings)
    engine.refresh_inventory()
    return engine

"""``after`` chains: a dependency that fails fails every job after it in one decision.

A chain of jobs each ``after`` the one before used to fail one link per decision, so
a failure took minutes to reach the end of a long chain while its jobs still showed as
waiting. Both deciders are held to it: a ``Scheduler`` without an agent (the engine
reads the waiting jobs afresh each decision) and an engine that keeps them between
decisions, as the pool agent does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.engine import Engine
from jupyter_dlsched.store import Store

CHAIN = 50


@pytest.fixture(params=["fresh", "kept"])
def deciding(request: pytest.FixtureRequest, home) -> Iterator[tuple[Scheduler, list[int]]]:
    """A scheduler that decides in this process, and the count of its decisions."""
    if request.param == "fresh":
        sched = Scheduler(home, agent=False, loop=False)
        engine = sched.link.engine  # type: ignore[attr-defined]
    else:
        engine = Engine(Store(home), keep_index=True)
        sched = Scheduler.of_engine(engine)
    ticks = [0]
    tick = engine.tick

    def counted(now: float | None = None):
        ticks[0] += 1
        return tick(now)

    engine.tick = counted
    with sched:
        yield sched, ticks


def test_a_failed_head_fails_a_chain_of_50_in_one_decision(deciding):
    sched, ticks = deciding
    head = sched.submit(os.getpid, cpus=0.25, begin="now+1h", name="head")
    chain = [head.id]
    for _ in range(CHAIN):
        chain.append(sched.submit(os.getpid, cpus=0.25, after=chain[-1], name="link").id)
    assert [sched.get(j).info().state for j in chain[1:]] == ["queued"] * CHAIN
    ticks[0] = 0
    sched.cancel(head.id)  # its dependents' dependency failed
    if ticks[0] == 0:
        sched.tick()
    assert ticks[0] <= 1, ticks
    infos = [sched.get(j).info() for j in chain]
    assert infos[0].state == "cancelled"
    assert [i.state for i in infos[1:]] == ["failed"] * CHAIN, [i.state for i in infos]
    for before, info in zip(infos, infos[1:], strict=False):
        assert info.reason == f"dependency {before.id} {before.state}", info.reason

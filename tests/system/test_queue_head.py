"""Deciding on the head of a deep queue: the same starts as deciding on the whole queue.

The pool agent keeps its waiting jobs in each policy's lanes and, with a deep
queue, offers the policy only the first jobs in its order plus the requests
of all (``PresortedQueue.shapes``). A decision the policy calls ``settled``
must start exactly what the whole queue would have started; these tests
check that over random queues, pools and policies, then through the agent's
own scheduler on a real ledger.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queue_cases import GIB, POLICIES, SHAPES, head_of, index_of, numbered, places, queues

from jupyter_dlsched.agent.config import Limits, ServiceConfig
from jupyter_dlsched.agent.limits import LimitsGate
from jupyter_dlsched.engine.queue_index import QueueIndex
from jupyter_dlsched.policy import (
    Decisions,
    QueuedJob,
    RunningJob,
    get_policy,
)
from jupyter_dlsched.policy.elastic import with_elastic
from jupyter_dlsched.vocab.placement import place
from jupyter_dlsched.vocab.resources import Capacity, Request

if TYPE_CHECKING:
    from jupyter_dlsched.agent.service import Agent
    from jupyter_dlsched.client.scheduler import Scheduler


def starts(decisions: Decisions) -> list[tuple[str, Any]]:
    return [(s.job_id, s.placement) for s in decisions.starts]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=queues(), which=st.sampled_from(POLICIES), k=st.integers(1, 8))
def test_a_settled_decision_on_the_head_starts_what_the_whole_queue_would(
    case: tuple[list[QueuedJob], list[RunningJob], Capacity, float],
    which: tuple[str, dict[str, Any]],
    k: int,
) -> None:
    jobs, running, capacity, now = case
    policy = get_policy(which[0], **which[1])
    whole = policy(list(jobs), running, capacity, now)
    head = head_of(policy, jobs, now, k)
    quick = policy(head, running, capacity, now)
    assert not whole.settled  # only a head decision may say so
    if quick.settled:
        assert starts(quick) == starts(whole)
    # the head is the whole queue's order, cut short
    if not quick.settled and len(head) == len(jobs):
        assert starts(quick) == starts(whole)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=queues(),
    which=st.sampled_from([("fair", {}), ("priority", {}), ("fifo-ff", {})]),
    k=st.integers(1, 6),
    max_gpus=st.sampled_from([None, 1, 2]),
    max_running=st.sampled_from([None, 1, 3]),
)
def test_per_user_limits_keep_a_settled_head_decision_exact(
    case: tuple[list[QueuedJob], list[RunningJob], Capacity, float],
    which: tuple[str, dict[str, Any]],
    k: int,
    max_gpus: int | None,
    max_running: int | None,
) -> None:
    jobs, running, capacity, now = case
    config = ServiceConfig(limits=Limits(max_gpus=max_gpus, max_running=max_running))
    policy = LimitsGate(get_policy(which[0], **which[1]), config)
    whole = policy(list(jobs), running, capacity, now)
    quick = policy(head_of(policy, jobs, now, k), running, capacity, now)
    if quick.settled:
        assert starts(quick) == starts(whole)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=queues(),
    which=st.sampled_from(POLICIES),
    k=st.integers(1, 8),
    elastic=st.booleans(),
)
def test_places_read_from_the_lanes_are_those_of_a_decision_over_the_whole_queue(
    case: tuple[list[QueuedJob], list[RunningJob], Capacity, float],
    which: tuple[str, dict[str, Any]],
    k: int,
    elastic: bool,
) -> None:
    jobs, running, capacity, now = case
    policy = get_policy(which[0], **which[1])
    if elastic:  # as the local pool runs every policy
        policy = with_elastic(policy)
    whole = policy(sorted(jobs, key=lambda j: j.seq), running, capacity, now)
    index = index_of(jobs, k)
    head = index.head(policy, now)
    assert head is not None
    quick = policy(head, running, capacity, now)
    line = index.line(policy, quick, head, running, capacity, now)
    if not quick.settled:
        assert line is None  # only a settled decision tells the rest of the line
        return
    assert line is not None
    index.places_from(*line, quick, {})
    assert numbered(index, quick) == places(whole)
    # a second decision with nothing changed writes nothing
    assert index.places_from(*line, quick, {}) == []
    # one on a longer head looks at other jobs: what it keeps still matches the whole queue
    index.HEAD = k + 3
    longer = index.head(policy, now)
    assert longer is not None
    again = policy(longer, running, capacity, now)
    more = index.line(policy, again, longer, running, capacity, now)
    if more is not None:
        index.places_from(*more, again, {})
        assert numbered(index, again) == places(whole)


def test_a_gate_that_may_hold_jobs_back_leaves_places_to_the_whole_queue() -> None:
    config = ServiceConfig(limits=Limits(max_gpus=1))
    policy = LimitsGate(get_policy("priority"), config)
    now = 10_000.0
    capacity = Capacity.empty(n_gpus=1, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    held, capacity = _running_on(capacity, "r", "ana")
    jobs = [QueuedJob(f"j{i}", i, now, SHAPES[0], owner="ana") for i in range(10)]
    index = index_of(jobs, 3)
    head = index.head(policy, now)
    assert head is not None
    quick = policy(head, [held], capacity, now)
    assert quick.settled and index.line(policy, quick, head, [held], capacity, now) is None


def test_an_owner_whose_head_jobs_are_all_held_back_keeps_a_fair_head_from_settling() -> None:
    # bo's first jobs ask for more GPUs than bo may hold; the one behind them does not
    config = ServiceConfig(limits=Limits(max_gpus=2))
    policy = LimitsGate(get_policy("fair"), config)
    now = 10_000.0
    capacity = Capacity.empty(n_gpus=4, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    ana_running, capacity = _running_on(capacity, "ana-r", "ana")
    jobs = [QueuedJob(f"ana{i}", 100 + i, now, SHAPES[0], owner="ana") for i in range(6)]
    jobs += [QueuedJob(f"bo{i}", 200 + i, now, SHAPES[2], owner="bo") for i in range(4)]
    jobs.append(QueuedJob("bo-small", 300, now, SHAPES[0], owner="bo"))
    whole = policy(list(jobs), [ana_running], capacity, now)
    assert [s.job_id for s in whole.starts][0] == "bo-small"  # bo holds less: bo first
    quick = policy(head_of(policy, jobs, now, 4), [ana_running], capacity, now)
    assert not quick.settled


def _running_on(capacity: Capacity, job_id: str, owner: str) -> tuple[RunningJob, Capacity]:
    spot = place(SHAPES[0], capacity)
    assert spot is not None
    job = RunningJob(job_id, 1, 0.0, 0.0, SHAPES[0], spot, owner=owner)
    return job, capacity.take(spot)


def test_the_head_is_the_first_jobs_of_the_policys_own_order() -> None:
    policy = get_policy("priority")
    now = 10_000.0
    jobs = [
        QueuedJob("old-low", 1, submitted=now - 3000, request=SHAPES[0], priority=25),
        QueuedJob("normal", 2, submitted=now - 10, request=SHAPES[0], priority=50),
        QueuedJob("due", 3, submitted=now - 5, request=SHAPES[0], priority=50, deadline=now),
        QueuedJob("high", 4, submitted=now - 1, request=SHAPES[0], priority=75),
    ]
    whole = sorted(jobs, key=lambda j: policy.sort_key(j, now))
    head = head_of(policy, jobs, now, 3)
    # 3000 s of aging lifts old-low from 25 to 75: ahead of "high" (submitted later)
    assert [j.id for j in head] == [j.id for j in whole][:3] == ["old-low", "high", "due"]


def test_a_head_decision_settles_when_nothing_left_fits_and_not_before() -> None:
    policy = get_policy("priority")
    now = 10_000.0
    capacity = Capacity.empty(n_gpus=2, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    jobs = [QueuedJob(f"j{i}", i, submitted=now - 100 + i, request=SHAPES[0]) for i in range(50)]
    quick = policy(head_of(policy, jobs, now, 8), [], capacity, now)
    assert quick.settled and [s.job_id for s in quick.starts] == ["j0", "j1"]
    # a pool where the head's jobs all fit: the policy runs out of jobs, not of room
    big = Capacity.empty(n_gpus=8, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    assert not policy(head_of(policy, jobs, now, 3), [], big, now).settled
    # nothing fits at all: settled at once, nothing looked at
    full = big.take(place(Request(gpus=8, cpus=8), big))  # type: ignore[arg-type]
    nothing = policy(head_of(policy, jobs, now, 3), [], full, now)
    assert nothing.settled and not nothing.starts and not nothing.waiting


def test_a_policy_that_preempts_or_learns_offers_no_head() -> None:
    for name, params in [("priority", {"preempt": True}), ("las", {}), ("gittins", {})]:
        policy = get_policy(name, **params)
        assert policy.head({}, 0.0, 8) is None, name  # type: ignore[attr-defined]


def test_per_user_limits_keep_a_head_decision_exact() -> None:
    config = ServiceConfig(limits=Limits(max_gpus=1))
    policy = LimitsGate(get_policy("fair"), config)
    now = 10_000.0
    capacity = Capacity.empty(n_gpus=4, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    jobs = [
        QueuedJob(f"{owner}{i}", 10 * i + n, submitted=now, request=SHAPES[0], owner=owner)
        for i in range(30)
        for n, owner in enumerate(["ana", "bo"])
    ]
    whole = policy(list(jobs), [], capacity, now)
    quick = policy(head_of(policy, jobs, now, 4), [], capacity, now)
    # the policy fills the pool from the head, the limit keeps one job per user
    assert [s.job_id for s in whole.starts] == ["ana0", "bo0"]
    assert quick.settled and starts(quick) == starts(whole)


# -- through the agent's scheduler, on a real ledger ------------------------------------------


def noop(x: int) -> int:
    return x


@pytest.fixture
def small_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decide on heads from 30 waiting jobs, 4 at a time; whole-queue decisions (places in
    line) whenever they are due."""
    monkeypatch.setattr(QueueIndex, "HEAD_FROM", 30)
    monkeypatch.setattr(QueueIndex, "HEAD", 4)
    monkeypatch.setattr(QueueIndex, "PLACES_EVERY", 0.0)
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")


def _until_places_due(agent: Agent) -> None:
    """Wait until a whole-queue decision is due: ten times as long as the last one took,
    which on a loaded machine is more than any fixed pause."""
    index = agent.sched._index if agent.sched is not None else None
    if index is not None:
        time.sleep(max(0.0, index.places_due_monotonic() - time.monotonic()) + 0.01)


def test_the_agent_decides_on_the_head_and_places_catch_up(
    tmp_path: Path, small_head: None
) -> None:
    from jupyter_dlsched.agent.service import Agent
    from jupyter_dlsched.client.scheduler import Scheduler

    agent = Agent(tmp_path / "home")
    agent.open()
    assert agent.sched is not None
    s = Scheduler.of_engine(agent.sched)  # a client of the agent's own engine
    try:
        holders = [s.submit_command(["sleep", "600"], gpus=1, cpus=1) for _ in range(2)]
        s.tick(now=time.time())
        low = s.map(noop, range(40), gpus=1, cpus=1, priority="low")
        urgent = s.submit(noop, -1, gpus=1, cpus=1, priority="high")
        _until_places_due(agent)  # ten times the last whole-queue decision's time
        first = s.tick(now=time.time())  # places are out of date and due: the whole queue
        assert first is not None and first.placed and not first.starts
        places = {j.id: j.position for j in s.jobs(state="queued")}
        assert places[urgent.id] == 1 and places[low[0].id] == 2
        assert sorted(places.values()) == list(range(1, 42))

        # a GPU frees: a head decision starts the job first in line, nothing else
        QueueIndex.PLACES_EVERY = 3600.0
        s.cancel(holders[0].id)
        _until_free(s, holders[0].id)
        decision = s.tick(now=time.time())
        assert decision is not None and decision.settled and not decision.placed
        assert [d.job_id for d in decision.starts] == [urgent.id]
        # the places read move up at once: they are numbered from ranks as they are read
        assert s.info(low[0].id).position == 1

        # once due, a whole-queue decision writes every place again
        QueueIndex.PLACES_EVERY = 0.0
        _until_places_due(agent)
        again = s.tick(now=time.time())
        assert again is not None and again.placed
        # (the urgent job may have ended meanwhile and the next low one started)
        places = {j.id: j.position for j in s.jobs(state="queued")}
        waiting = [h.id for h in low if h.id in places]
        assert [places[job_id] for job_id in waiting] == list(range(1, len(waiting) + 1))
        assert len(waiting) >= 39
    finally:
        leave_nothing_running(s, agent)


def test_a_start_rewrites_no_place_behind_it_and_the_places_read_stay_1_to_n(
    tmp_path: Path, small_head: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each start moves every waiting job up one place; the ledger keeps ranks, so only
    jobs whose order changed (none here) or that are new are written."""
    from jupyter_dlsched.agent.service import Agent
    from jupyter_dlsched.client.scheduler import Scheduler

    agent = Agent(tmp_path / "home")
    agent.open()
    engine = agent.sched
    assert engine is not None
    s = Scheduler.of_engine(engine)
    write = engine.store.queue.set_queue_positions
    written: list[str] = []

    def counted(db: Any, rows: Any) -> None:
        rows = list(rows)
        written.extend(job_id for _, _, job_id in rows)
        write(db, rows)

    monkeypatch.setattr(engine.store.queue, "set_queue_positions", counted)

    def ranks() -> dict[str, float]:
        rows = s.store.db.execute(
            "SELECT id, position FROM jobs WHERE state='queued' AND position IS NOT NULL"
        )
        return {job_id: rank for job_id, rank in rows}

    def line() -> list[str]:
        queued = sorted((j for j in s.jobs(state="queued") if j.position), key=_place)
        assert [j.position for j in queued] == list(range(1, len(queued) + 1))
        return [j.id for j in queued]

    try:
        holders = [s.submit_command(["sleep", "600"], gpus=1, cpus=1) for _ in range(2)]
        s.tick(now=time.time())
        low = s.map(nap, range(40), gpus=1, cpus=1, priority="low")
        _until_places_due(agent)  # so that this tick places the whole line
        first = s.tick(now=time.time())
        assert first is not None and first.placed
        engine.flush_positions(force=True)
        assert sorted(written) == sorted(h.id for h in low)  # a new line: every job ranked
        assert line() == [h.id for h in low]

        written.clear()
        before = ranks()
        s.cancel(holders[0].id)
        _until_free(s, holders[0].id)
        _until_places_due(agent)  # so that this tick places the whole line
        started = s.tick(now=time.time())  # the first in line starts; every place moves up
        assert started is not None and started.placed
        assert s.info(low[0].id).state == "running"
        engine.flush_positions(force=True)
        assert written == []
        assert ranks() == {job_id: rank for job_id, rank in before.items() if job_id != low[0].id}
        assert line() == [h.id for h in low[1:]]
        assert s.info(low[1].id).position == 1

        kept = ranks()
        later = s.map(nap, range(3), gpus=1, cpus=1, priority="low")
        urgent = s.submit(nap, -1, gpus=1, cpus=1, priority="high")
        _until_places_due(agent)  # so that this tick places the whole line
        placed = s.tick(now=time.time())
        assert placed is not None and placed.placed and not placed.starts
        engine.flush_positions(force=True)
        # the new jobs are ranked, at the end and at the front; nobody else is written
        # (asked of the ledger: a supervisor here, with no agent serving, may decide too)
        assert set(written) <= {h.id for h in [*later, urgent]}
        assert {job_id: rank for job_id, rank in ranks().items() if job_id in kept} == kept
        assert line() == [urgent.id, *(h.id for h in low[1:]), *(h.id for h in later)]
    finally:
        leave_nothing_running(s, agent)


def leave_nothing_running(s: Scheduler, agent: Agent) -> None:
    """End a test's queue at once (the waiting jobs marked cancelled in one statement,
    the running ones cancelled) and close its agent."""
    with s.store.transaction() as db:
        db.execute("UPDATE jobs SET state='cancelled' WHERE state='queued'")
    for job in s.jobs(state="running"):
        s.cancel(job.id)
    agent.close()


def nap(x: int) -> None:
    time.sleep(600)


def _place(job: Any) -> int:
    return int(job.position)


def test_places_kept_back_are_written_in_parts_and_a_failed_part_is_tried_again(
    tmp_path: Path, small_head: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deep queue's places are written a few transactions at a time (others may write
    between them); when one fails (a full disk), what it did not write waits for the next
    flush instead of being lost."""
    from jupyter_dlsched.agent.service import Agent
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.engine import core

    monkeypatch.setattr(core, "POSITIONS_PER_WRITE", 7)
    agent = Agent(tmp_path / "home")
    agent.open()
    engine = agent.sched
    assert engine is not None
    engine._positions_at_once = 0  # every moved place waits for flush_positions
    s = Scheduler.of_engine(engine)
    write = engine.store.queue.set_queue_positions
    parts: list[int] = []

    def failing_second(db: Any, rows: Any) -> None:
        parts.append(len(rows))
        if len(parts) == 2:
            raise OSError("no space left on device")
        write(db, rows)

    try:
        for _ in range(2):  # both GPUs held: nothing below starts
            s.submit_command(["sleep", "600"], gpus=1, cpus=1)
        s.tick(now=time.time())
        low = s.map(noop, range(40), gpus=1, cpus=1, priority="low")
        time.sleep(0.2)
        decided = s.tick(now=time.time())
        assert decided is not None and decided.placed
        assert len(engine._positions) == 40  # kept back, none written yet
        assert {s.info(h.id).position for h in low} == {None}

        monkeypatch.setattr(engine.store.queue, "set_queue_positions", failing_second)
        with pytest.raises(OSError):
            engine.flush_positions(force=True)
        assert parts == [7, 7]
        assert len(engine._positions) == 33  # the first part written, the rest kept
        written = [s.info(h.id).position for h in low]
        assert sum(p is not None for p in written) == 7

        engine.flush_positions(force=True)
        assert parts[2:] == [7, 7, 7, 7, 5]
        assert not engine._positions
        assert [s.info(h.id).position for h in low] == list(range(1, 41))
    finally:
        monkeypatch.setattr(engine.store.queue, "set_queue_positions", write)
        leave_nothing_running(s, agent)


def _until_free(s: Any, job_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while s.info(job_id).state == "running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} still running")
        s.tick()
        time.sleep(0.05)


def test_submit_times_follow_submit_order_even_when_the_clock_steps_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The priority policy's lanes keep each priority's jobs in submit-time order, which
    must then be submit order: a clock read before the write lock (or stepped back) must
    not give a later job an earlier time."""
    import jupyter_dlsched.store.jobs as store_module
    from jupyter_dlsched.store import Store
    from jupyter_dlsched.vocab.spec import build_spec

    store = Store(tmp_path / "ledger")
    capacity = Capacity.empty(n_gpus=1, gpu_mem=16 * GIB, cpus=4, mem=64 * GIB)
    spec = build_spec(capacity=capacity, kind="command", default_name="job")
    clock = iter([1000.5, 999.6, 1001.0])
    monkeypatch.setattr(store_module.time, "time", lambda: next(clock))
    ids = [store.insert_job(spec, {}, owner="ana", uid=0).id for _ in range(3)]
    monkeypatch.undo()
    submitted = [store.get(job_id).submitted for job_id in ids]
    assert submitted == [1000.5, 1000.5, 1001.0]

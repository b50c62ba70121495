"""Places in line read from the policy's lanes (``LaneLine``, ``QueueIndex.places_from``).

A policy that orders its queue in lanes tells its whole line as stretches of them, and
the index keeps each job's rank in line beside it in the lane, so a decision reads the
line's ranks without touching every job. What it keeps and writes must be what the same
placement over the line as a plain list of jobs keeps and writes, as the queue changes
between decisions: jobs start, leave, come in, and time passes (aging moves one lane's
jobs past another's).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queue_cases import POLICIES, SHAPES, index_of, numbered, places, queues, rows_of

from jupyter_dlsched.engine.queue_index import QueueIndex
from jupyter_dlsched.policy import Decisions, QueuedJob, RunningJob, get_policy
from jupyter_dlsched.policy.lane_line import LaneLine, Stretch
from jupyter_dlsched.vocab.resources import Capacity

GIB = 2**30


def test_a_lane_line_reads_its_stretches_and_loose_jobs_in_turn() -> None:
    lanes: dict[Any, list[str]] = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2"]}
    line = LaneLine(lanes, [Stretch("a", 1, 3), ["x"], Stretch("b", 0, 0), Stretch("b", 0, 2)])
    assert list(line) == ["a2", "a3", "x", "b1", "b2"]
    assert len(line) == 5
    assert line[:2] == ["a2", "a3"] and line[1:4] == ["a3", "x", "b1"]
    assert line[3] == "b1" and line[-1] == "b2" and line[::-2] == ["b2", "x", "a2"]
    assert len(line.pieces) == 3  # the empty stretch is left out


def _decide(
    index: QueueIndex, policy: Any, running: list[RunningJob], capacity: Capacity, now: float
) -> tuple[Decisions, Any] | None:
    head = index.head(policy, now)
    assert head is not None
    quick = policy(head, running, capacity, now)
    line = index.line(policy, quick, head, running, capacity, now)
    return None if line is None else (quick, line)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=queues(),
    which=st.sampled_from([p for p in POLICIES if p[0] != "fair"]),
    k=st.integers(1, 8),
    data=st.data(),
)
def test_places_read_from_the_lanes_match_those_read_from_the_line_as_the_queue_changes(
    case: tuple[list[QueuedJob], list[RunningJob], Capacity, float],
    which: tuple[str, dict[str, Any]],
    k: int,
    data: Any,
) -> None:
    jobs, running, capacity, now = case
    policy = get_policy(which[0], **which[1])
    lanes, flat = index_of(jobs, k), index_of(jobs, k)
    waiting = list(jobs)
    for step in range(3):
        decided = _decide(lanes, policy, running, capacity, now)
        if decided is None:
            return
        quick, line = decided
        assert isinstance(line[0], LaneLine)
        from_lanes = lanes.places_from(line[0], line[1], quick, {})
        from_list = flat.places_from(list(line[0]), line[1], quick, {})
        assert from_lanes == from_list
        assert lanes.ranks == flat.ranks and lanes.reasons == flat.reasons
        assert lane_ranks(lanes) == dict_ranks(lanes)
        whole = policy(sorted(waiting, key=lambda j: j.seq), running, capacity, now)
        assert numbered(lanes, quick) == places(whole)
        # between decisions: what started runs and ends at once (the pool is as it was),
        # some jobs leave, new ones come in, time passes
        gone = {s.job_id for s in quick.starts}
        gone |= set(data.draw(st.sets(st.sampled_from([j.id for j in waiting]), max_size=3)))
        seq = max(j.seq for j in jobs) + 100 * (step + 1)
        # the ledger keeps submit times in submit order (the drawn queue's may be ahead)
        at = max(now, *(j.submitted for j in waiting))
        new = [
            QueuedJob(
                f"n{step}-{i}",
                seq + i,
                submitted=at,
                request=data.draw(st.sampled_from(SHAPES)),
                priority=data.draw(st.sampled_from([25, 50, 75])),
            )
            for i in range(data.draw(st.integers(0, 3)))
        ]
        waiting = [j for j in waiting if j.id not in gone] + new
        if not waiting:
            return
        # and some are read again with the rank and reason the ledger has for them (an
        # event of theirs: a priority set to what it was, a staged input bound)
        kept = [j for j in waiting if j not in new]
        again = data.draw(st.lists(st.sampled_from(kept), max_size=2, unique=True)) if kept else []
        for index in (lanes, flat):
            rows = rows_of(again)
            for row in rows:
                row["position"], row["waiting"] = index.ranks[row["id"]], index.reasons[row["id"]]
            index._forget(gone | {j.id for j in again})
            index._add(sorted(rows + rows_of(new), key=lambda r: r["seq"]))  # type: ignore[arg-type]
        assert lane_ranks(lanes) == dict_ranks(lanes)
        now += data.draw(st.sampled_from([0.0, 1.0, 700.0, 3000.0]))


def lane_ranks(index: QueueIndex) -> dict[str, float | None]:
    """Each job's rank as its lane's array keeps it (``None`` for ``nan``)."""
    assert index._lanes is not None
    return {
        job.id: None if rank != rank else rank
        for lane in index._lanes._lanes.values()
        for job, rank in zip(lane.jobs, lane.ranks, strict=True)
    }


def dict_ranks(index: QueueIndex) -> dict[str, float | None]:
    """The ranks of the jobs in lanes as the index's dict keeps them."""
    return {job_id: index.ranks.get(job_id) for job_id in lane_ranks(index)}


@pytest.mark.parametrize("moved", ["all", "one"])
def test_ranks_set_outside_the_lanes_reach_the_lanes_before_a_line_from_them(moved: str) -> None:
    policy = get_policy("priority", aging_interval=0)
    now = 10_000.0
    capacity = Capacity.empty(n_gpus=1, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    jobs = [QueuedJob(f"j{i}", i, now - 100 + i, SHAPES[1]) for i in range(12)]
    index = index_of(jobs, 3)
    for _ in range(2):  # the first placement ranks everyone; the second reads the lanes
        decided = _decide(index, policy, [], capacity, now)
        assert decided is not None
        index.places_from(decided[1][0], decided[1][1], decided[0], {})
    ids = [j.id for j in jobs]
    ranks = index.ranks
    # a placement over the line as a list of jobs (fair's, say) ranks them the other way
    # (every lane array read again), or puts the last job first (one rank written in its lane)
    other = ids[::-1] if moved == "all" else ids[-1:] + ids[:-1]
    index.take_places(other, {}, {})
    assert lane_ranks(index) == dict_ranks(index)
    assert all(ranks[a] < ranks[b] for a, b in zip(other, other[1:], strict=False))  # type: ignore[operator]
    decided = _decide(index, policy, [], capacity, now)
    assert decided is not None
    quick, line = decided
    changed = index.places_from(line[0], line[1], quick, {})
    # all but the one kept of the reversed line; the one put first, back to the end
    assert len(changed) == (len(jobs) - 1 if moved == "all" else 1)
    assert numbered(index, quick) == places(policy(jobs, [], capacity, now))

"""A plan by rank on a pool of whole GPUs changed in place (``GangRoom``) decides as one on
``Room``: the shortcuts of the first (holders that never let go, holders that stay held
until a planned job takes their GPUs, a trial that returns only the worst-ranked ones it
needs) change no decision."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_dlsched.policy.base import Decisions, GangRoom, QueuedJob, Room, RunningJob
from jupyter_dlsched.policy.las import LasPolicy
from jupyter_dlsched.vocab.placement import place
from jupyter_dlsched.vocab.resources import Capacity, GpuFree, Request

GIB = 2**30
# attained GPU-seconds spread over the three levels of LasPolicy(thresholds=(100, 1000))
_attained = st.sampled_from([0.0, 50.0, 150.0, 900.0, 2000.0])


def _pool(
    n_gpus: int, running_rows: list[tuple[int, float, bool]], island: int | None = None
) -> tuple[Capacity, list]:
    capacity = Capacity.empty(n_gpus=n_gpus, gpu_mem=16 * GIB, cpus=0, mem=0)
    if island is not None:  # islands of ``island`` GPUs (NVLink), every other one of 32 GiB
        capacity = Capacity(
            tuple(_card(g.index, island) for g in capacity.gpus),
            capacity.cpu_load, capacity.mem_free, capacity.mem_total,
        )  # fmt: skip
    running = []
    for seq, (gpus, attained, stopping) in enumerate(running_rows):
        request = Request(gpus=gpus, cpus=0)
        placement = place(request, capacity)
        if placement is None:
            continue
        capacity = capacity.take(placement)
        running.append(
            RunningJob(
                f"r{seq}", seq, 0.0, 0.0, request, placement,
                preemptible=True, attained=attained, stopping=stopping,
            )
        )  # fmt: skip
    return capacity, running


def _card(index: int, island: int) -> GpuFree:
    mem = (32 if index // island % 2 == 0 else 16) * GIB
    return GpuFree(index, mem, mem, 0, index // island)


def _decide(policy: LasPolicy, queued, running, capacity, room) -> Decisions:
    out = Decisions()
    victims, _ = policy.rank_running(running, 10.0)
    ordered = sorted(queued, key=policy.queue_key)
    smallest = min(j.request.whole_gpus for j in queued)
    policy._plan_by_rank(ordered, running, victims, capacity, out, set(), smallest, room)
    return out


def _assert_plans_agree(queued, running, capacity, skip) -> None:
    """A plan by rank on whole GPUs in place (``GangRoom``, ``HeldPlan``) decides as one on
    ``Room``: the same starts, preemptions and waiting reasons."""
    policy = LasPolicy(thresholds=(100.0, 1000.0), min_run=0.0, skip=skip)
    gang = _decide(policy, queued, running, capacity, GangRoom)
    room = _decide(policy, queued, running, capacity, Room)
    assert gang.starts == room.starts
    assert gang.preempts == room.preempts
    assert gang.waiting == room.waiting


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_gpus=st.sampled_from([4, 8, 16]),
    running_rows=st.lists(st.tuples(st.sampled_from([1, 1, 2, 4]), _attained), max_size=16),
    stopping=st.lists(st.integers(0, 15), max_size=2),
    queued_rows=st.lists(st.tuples(st.sampled_from([1, 1, 2, 4, 8]), _attained), min_size=1),
    skip=st.booleans(),
)
def test_a_plan_on_whole_gpus_changed_in_place_decides_as_one_on_room(
    n_gpus, running_rows, stopping, queued_rows, skip
):
    rows = [(g, a, i in stopping) for i, (g, a) in enumerate(running_rows)]
    capacity, running = _pool(n_gpus, rows)
    queued = [
        QueuedJob(f"q{i}", 100 + i, 5.0, Request(gpus=g, cpus=0), preemptible=True, attained=a)
        for i, (g, a) in enumerate(queued_rows)
    ]
    _assert_plans_agree(queued, running, capacity, skip)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    islands=st.sampled_from([2, 4]),
    running_rows=st.lists(st.tuples(st.sampled_from([1, 1, 2, 3, 4]), _attained), max_size=20),
    stopping=st.lists(st.integers(0, 19), max_size=2),
    queued_rows=st.lists(
        st.tuples(st.sampled_from([1, 2, 3, 4, 6]), _attained, st.sampled_from([None, 32 * GIB])),
        min_size=1,
    ),
    skip=st.booleans(),
)
def test_a_plan_that_keeps_holders_until_displaced_decides_as_one_on_room_on_islands(
    islands, running_rows, stopping, queued_rows, skip
):
    # GPUs in islands, half of them with more memory: a job planned over holders may not
    # fit on the GPUs of the fewest worst-ranked ones, so more of them let go
    # (``HeldPlan.place_sparing``), and where it lands depends on the islands
    rows = [(g, a, i in stopping) for i, (g, a) in enumerate(running_rows)]
    capacity, running = _pool(12, rows, island=islands)
    queued = [
        QueuedJob(
            f"q{i}", 100 + i, 5.0, Request(gpus=g, cpus=0, gpu_mem=mem), preemptible=True,
            attained=a,
        )
        for i, (g, a, mem) in enumerate(queued_rows)
    ]  # fmt: skip
    _assert_plans_agree(queued, running, capacity, skip)

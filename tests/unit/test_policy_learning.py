"""Honest policies: sizes are learnt only from jobs that finished, and ranks plan the pool."""

from __future__ import annotations

from typing import ClassVar

import pytest
from policy_cases import pool, queued, running_on

from jupyter_dlsched.engine import tick
from jupyter_dlsched.policy import (
    FinishedJob,
    GittinsPolicy,
    LasPolicy,
    SrtfPolicy,
    get_policy,
)
from jupyter_dlsched.policy.gittins import gittins_index, weighted_index
from jupyter_dlsched.sim import TraceJob, compare, simulate
from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.spec import build_spec

GIB = 2**30


# textbook srtf: plan by rank
#
# 2 GPUs, no restart cost. r (1 GPU, 100 s) arrives at 0; a (2 GPUs, 10 s: 20 GPU-s)
# and b (1 GPU, 50 s) at 1. At 1 the ranks are a 20 < b 50 < r 99: a gets both GPUs,
# so r is stopped and b, ranked below a, may not take the free GPU a needs.
# a runs 1-11; then b and r share the pool: b 11-61, r 11-110.
PLAN = [TraceJob("r", 0, 1, 100.0), TraceJob("a", 1, 2, 10.0), TraceJob("b", 1, 1, 50.0)]


def test_srtf_plans_by_rank_so_a_lower_ranked_job_never_takes_gpus_a_higher_one_needs():
    result = simulate(PLAN, "srtf", gpus=2, restart_overhead=0)
    assert {j.id: j.finish for j in result.jobs} == {"a": 11.0, "b": 61.0, "r": 110.0}


def test_srtf_stops_a_victim_and_starts_nothing_that_the_better_job_needs():
    capacity = pool(2)
    r, capacity = running_on(capacity, "r", 0, remaining=100.0, preemptible=True)
    waiting = [queued("a", 1, gpus=2, remaining=10.0), queued("b", 2, remaining=50.0)]
    decisions = SrtfPolicy()(waiting, [r], capacity, now=1.0)
    assert decisions.starts == []
    assert [p.job_id for p in decisions.preempts] == ["r"]
    assert decisions.waiting["a"] == "waiting for preempted jobs to stop"


def test_srtf_never_stops_a_job_for_one_that_is_not_strictly_shorter():
    capacity = pool(1)
    r, capacity = running_on(capacity, "r", 0, remaining=10.0, preemptible=True)
    decisions = SrtfPolicy()([queued("q", 1, remaining=10.0)], [r], capacity, now=0.0)
    assert decisions.preempts == []


def test_las_equals_on_one_level_never_stop_each_other_but_a_lower_level_does():
    capacity = pool(1)
    old, capacity = running_on(capacity, "old", 0, attained=5000.0, preemptible=True)
    policy = LasPolicy(thresholds=(3600,), min_run=0.0)
    same = policy([queued("same", 1, attained=4000.0)], [old], capacity, now=0.0)
    fresh = policy([queued("fresh", 1)], [old], capacity, now=0.0)
    assert same.preempts == []
    assert [p.job_id for p in fresh.preempts] == ["old"]


def test_sjf_by_duration_and_by_gpu_time_are_named_apart():
    jobs = [queued("wide", 0, gpus=2, time_limit=10.0), queued("narrow", 1, time_limit=15.0)]
    by_duration = get_policy("sjf")(jobs, [], pool(2), now=0.0)
    by_gpu_time = get_policy("sjf-gputime")(jobs, [], pool(2), now=0.0)
    assert get_policy("sjf-gputime").name == "sjf-gputime"
    assert [s.job_id for s in by_duration.starts] == ["wide"]
    assert [s.job_id for s in by_gpu_time.starts] == ["narrow"]


# learning sizes online


class Spy(GittinsPolicy):
    """A gittins policy that records what it learnt and when it was asked.

    The records live on the class: a replay works on a copy of the policy.
    """

    learnt: ClassVar[list[FinishedJob]] = []
    asked: ClassVar[list[tuple[float, int]]] = []

    def learn(self, finished, replace=False):
        finished = list(finished)
        Spy.learnt.extend(finished)
        super().learn(finished, replace=replace)

    def __call__(self, queued, running, capacity, now):
        Spy.asked.append((now, len(Spy.learnt)))
        return super().__call__(queued, running, capacity, now)


@pytest.fixture
def spy():
    Spy.learnt.clear()
    Spy.asked.clear()
    yield Spy
    Spy.learnt.clear()
    Spy.asked.clear()


def test_a_replay_teaches_a_size_only_after_the_job_finished(spy):
    trace = [TraceJob(f"j{i}", float(i), 1, 10.0 * (i + 1)) for i in range(6)]
    policy = spy()
    result = simulate(trace, policy, gpus=2, restart_overhead=0)
    assert sorted(j.size for j in spy.learnt) == sorted(j.gpu_time for j in trace)
    for now, known in spy.asked:
        assert all(job.finished <= now for job in spy.learnt[:known])
    finished_at = [j.finish for j in result.jobs]
    for now, known in spy.asked:  # and everything that had finished was known
        assert known == sum(1 for t in finished_at if t <= now)
    assert policy.model_version == 0  # the caller's object is left as it was


def test_gittins_learns_sizes_per_owner_and_job_name():
    policy = GittinsPolicy(group_min=10)
    policy.learn(
        [FinishedJob("ana", "probe", 60.0)] * 20 + [FinishedJob("bob", "train", 360000.0)] * 20
    )
    probe = queued("p", 2, owner="ana", name="probe")
    train = queued("t", 1, owner="bob", name="train")
    decisions = policy([train, probe], [], pool(1), now=0.0)
    assert [s.job_id for s in decisions.starts] == ["p"]
    assert policy.index(0.0, "ana", "probe") > policy.index(0.0, "carl", "new")


def test_gittins_learns_nothing_when_told_not_to_and_the_oracle_is_named():
    fixed = GittinsPolicy(learn_sizes=False)
    fixed.learn([FinishedJob("ana", "", 60.0)] * 100)
    assert fixed.model_version == 0
    trace = [TraceJob("a", 0, 1, 30.0), TraceJob("b", 0, 1, 10.0)]
    oracle = GittinsPolicy(
        sizes=[j.gpu_time for j in trace], learn_sizes=False, name="gittins-oracle"
    )
    assert [r["policy"] for r in compare(trace, [oracle, "srtf"], gpus=1).rows] == [
        "gittins-oracle",
        "srtf (oracle)",
    ]


def test_weighted_index_equals_the_plain_index_with_unit_weights():
    sizes = [5.0, 10.0, 40.0, 300.0, 3000.0]
    items = [(s, 1.0) for s in sizes]
    for attained in (0.0, 7.0, 50.0):
        assert weighted_index(items, attained, 0.0) == pytest.approx(gittins_index(sizes, attained))


def test_the_live_tick_passes_the_ledgers_finished_jobs_to_a_learning_policy(tmp_path, spy):
    store = Store(tmp_path)
    capacity = pool(1)

    def insert(name: str):
        spec = build_spec(capacity=capacity, name=name, gpus=1)
        return store.insert_job(spec, {"payload.pkl": b"x"}, owner="anna", uid=1000)

    done = insert("probe")
    store.transition(done.id, "running", started=1.0)
    store.transition(done.id, "succeeded", finished=61.0, attained=60.0)
    dropped = insert("probe")
    store.transition(dropped.id, "cancelled", finished=2.0)
    waiting = insert("train")
    policy = spy(group_min=1)
    inventory = {"gpus": [{"index": 0, "mem_total": 16 * GIB}], "cpus": 4, "mem_total": 8 * GIB}
    with store.transaction() as db:
        decisions = tick.decide(
            store,
            db,
            backend="local",
            policy=policy,
            inventory=inventory,
            external_gpu_mem={},
            lease_ttl=30.0,
            now=100.0,
        )
    # with its GPUs: run times are learnt by GPU count too (sjf, priority's estimates)
    assert spy.learnt == [FinishedJob("anna", "probe", 60.0, 61.0, gpus=1.0)]
    assert [s.job_id for s in decisions.starts] == [waiting.id]

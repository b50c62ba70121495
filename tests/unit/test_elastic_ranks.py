"""Elastic jobs under a policy that ranks by remaining work (``srtf``): growth in rank order.

Water-filling idle GPUs among elastic jobs shares them like processor sharing, which
an oracle that serves the shortest job first should never do: with linear speedup two
equal jobs on half the GPUs each both finish when the second would have, rigid. Here the
best-ranked job takes every GPU that pays, a worse-ranked one waits for it, and a job
lends the GPUs it borrowed only to a waiting job that ranks ahead of it.
"""

from __future__ import annotations

from jupyter_dlsched.policy import get_policy
from jupyter_dlsched.policy.base import QueuedJob, RunningJob
from jupyter_dlsched.policy.elastic import ElasticPolicy
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request

H = 3600.0
UNIT = 1000


def pool(n: int, *held: Placement) -> Capacity:
    capacity = Capacity.empty(n_gpus=n, gpu_mem=UNIT, cpus=0, mem=0)
    for placement in held:
        capacity = capacity.take(placement)
    return capacity


def on(*gpus: int) -> Placement:
    return Placement(gpus=gpus, gpu_mem=(UNIT,) * len(gpus))


def running(job_id: str, gpus: tuple[int, ...], remaining: float, top: int = 4) -> RunningJob:
    """An elastic job (1 to ``top`` GPUs) started at 600 with ``remaining`` seconds left at 1000."""
    return RunningJob(
        job_id,
        0,
        0.0,
        600.0,
        Request(gpus=len(gpus), cpus=0),
        on(*gpus),
        preemptible=True,
        remaining=remaining + 400.0,
        min_gpus=1,
        max_gpus=top,
    )


def waiting(job_id: str, seq: int, remaining: float, top: int | None = None) -> QueuedJob:
    return QueuedJob(
        job_id,
        seq,
        0.0,
        Request(gpus=1, cpus=0),
        preemptible=True,
        remaining=remaining,
        max_gpus=top,
    )


def avg_jct(jobs: list[TraceJob]) -> float:
    result = simulate(jobs, "srtf", 4)
    return sum(o.finish - o.submit for o in result.jobs) / len(jobs)


def test_two_equal_elastic_jobs_run_one_after_the_other_not_side_by_side():
    rigid = [TraceJob("a", 0, 4, 10 * H), TraceJob("b", 0, 4, 10 * H)]
    elastic = [TraceJob(j.id, 0, 4, 10 * H, elastic=(1, 4)) for j in rigid]
    assert avg_jct(rigid) == 15 * H
    # side by side on 2 GPUs each both would end at 20 h: 20 h on average
    result = simulate(elastic, "srtf", 4)
    assert [(o.first_start, o.finish) for o in result.jobs] == [(0.0, 10 * H), (10 * H, 20 * H)]
    assert avg_jct(elastic) <= avg_jct(rigid)


def test_a_short_elastic_job_among_long_ones_never_makes_the_average_worse():
    rigid = [
        TraceJob("long", 0, 2, 8 * H),
        TraceJob("mid", 60, 2, 4 * H),
        TraceJob("short", 1 * H, 1, 0.5 * H),
    ]
    elastic = [TraceJob(j.id, j.submit, j.gpus, j.duration, elastic=(1, 4)) for j in rigid]
    assert avg_jct(elastic) <= avg_jct(rigid)


def test_borrowed_gpus_are_lent_only_to_a_job_ranked_ahead():
    policy = ElasticPolicy(get_policy("srtf"), resize_every=300)
    e = running("e", (0, 1), remaining=100.0)  # 200 GPU-seconds left
    longer = waiting("l", 1, remaining=10 * H)
    d = policy([longer], [e], pool(2, e.placement), 1000.0)
    assert d.resizes == [] and d.starts == []
    shorter = waiting("s", 1, remaining=10.0)
    d = policy([shorter], [e], pool(2, e.placement), 1000.0)
    assert [(r.job_id, len(r.placement.gpus)) for r in d.resizes] == [("e", 1)]


def test_a_better_ranked_running_job_grows_before_a_worse_ranked_one_starts():
    policy = ElasticPolicy(get_policy("srtf"), resize_every=300)
    e = running("e", (0,), remaining=2 * H)  # 2 GPU-hours left on 1 GPU
    longer = waiting("l", 1, remaining=10 * H)
    d = policy([longer], [e], pool(2, e.placement), 1000.0)
    assert d.starts == []
    assert [(r.job_id, r.placement.gpus) for r in d.resizes] == [("e", (0, 1))]
    # a shorter waiting job starts on the idle GPU instead
    d = policy([waiting("s", 1, remaining=600.0)], [e], pool(2, e.placement), 1000.0)
    assert [s.job_id for s in d.starts] == ["s"] and d.resizes == []


def test_without_remaining_times_srtf_shares_idle_gpus_as_every_policy_does():
    # live jobs: nothing knows how long they run, so idle GPUs are water-filled
    policy = ElasticPolicy(get_policy("srtf"))
    jobs = [
        QueuedJob("a", 0, 0.0, Request(gpus=1, cpus=0), max_gpus=8),
        QueuedJob("b", 1, 0.0, Request(gpus=1, cpus=0), max_gpus=8),
    ]
    d = policy(jobs, [], pool(4), 0.0)
    assert {s.job_id: len(s.placement.gpus) for s in d.starts} == {"a": 2, "b": 2}

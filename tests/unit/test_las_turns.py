"""las: which of the running jobs of one level a better-level job stops (#52).

Choosing victims worst rank first made the newest job of a level the one stopped.
In the last level that is first come, first served: a job of weeks that started
first is never stopped, and the jobs of a day or two that reach the level after it
are stopped each time (on Philly cluster 7f04ca, 4-GPU jobs of 20 h waited 1,500 h
behind 8-GPU jobs of 600 h; las was 6-7 % worse on average on 32 and 48 GPUs than
when victims were taken in device order). A job that has run ``yield_after``
seconds since it last started is now stopped first.
"""

from __future__ import annotations

from jupyter_dlsched.policy import LasPolicy, QueuedJob, RunningJob
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request

DAY = 86400.0

# 2 GPUs, restarts free. giant (30 days) and two_days (2 days) start at 0 and 1 s and
# pass the 1 GPU-hour threshold together; late (2 days) comes at 1.5 days, on the
# level below, and stops one of them. Before, the newer one was stopped: two_days
# waited for late (to 3.5 days) and ended at 4 days. Now the giant, which has run
# 1.5 days since it started, is stopped: two_days ends at 2 days, the giant takes its
# GPU then and ends half a day late (30.5 days); late ends at 3.5 days either way.
TRACE = [
    TraceJob("giant", 0.0, 1, 30 * DAY),
    TraceJob("two_days", 1.0, 1, 2 * DAY),
    TraceJob("late", 1.5 * DAY, 1, 2 * DAY),
]


def finishes(policy: LasPolicy) -> dict[str, float]:
    result = simulate(TRACE, policy, gpus=2, restart_overhead=0.0)
    return {j.id: round(j.finish / DAY, 4) for j in result.jobs}


def test_the_job_that_has_run_longest_is_stopped_first_in_its_level():
    policy = LasPolicy(thresholds=(3600.0,))
    assert finishes(policy) == {"giant": 30.5, "two_days": 2.0, "late": 3.5}


def test_without_turns_the_newest_of_the_level_is_stopped():
    policy = LasPolicy(thresholds=(3600.0,), yield_after=None)
    assert finishes(policy) == {"giant": 30.0, "two_days": 4.0, "late": 3.5}


def test_within_yield_after_the_newest_is_stopped():
    # one decision: two jobs of the last level on a full 2-GPU pool, a waiting job of
    # the first level. Neither has run a day: the newer is stopped (Tiresias' order);
    # once the older has run a day, it is
    capacity = Capacity.empty(n_gpus=2, gpu_mem=16 * 2**30, cpus=0, mem=0)
    capacity = capacity.take(Placement(gpus=(0,), gpu_mem=(16 * 2**30,)))
    capacity = capacity.take(Placement(gpus=(1,), gpu_mem=(16 * 2**30,)))

    def running(job_id: str, seq: int, started: float, gpu: int) -> RunningJob:
        placement = Placement(gpus=(gpu,), gpu_mem=(16 * 2**30,))
        return RunningJob(
            job_id, seq, 0.0, started, Request(gpus=1, cpus=0), placement, preemptible=True
        )

    waiting = QueuedJob("short", 3, 0.0, Request(gpus=1, cpus=0))
    policy = LasPolicy(thresholds=(3600.0,))
    for now, stopped in ((20000.0, "newer"), (DAY + 10, "older")):
        jobs = [running("older", 1, 0.0, 0), running("newer", 2, 10.0, 1)]
        decision = policy([waiting], jobs, capacity, now)
        assert [p.job_id for p in decision.preempts] == [stopped]

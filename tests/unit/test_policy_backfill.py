"""The default's backfill never makes a queue of equals slower than fifo (#52).

Replayed through the simulator: jobs declare no time limit, so ``priority``
backfills with run times learnt from the jobs that finished first.
"""

from __future__ import annotations

from jupyter_dlsched.policy import PriorityPolicy
from jupyter_dlsched.sim import TraceJob, simulate


def finishes(jobs: list[TraceJob], policy: str | PriorityPolicy, gpus: int) -> dict[str, float]:
    return {j.id: j.finish for j in simulate(jobs, policy, gpus=gpus).jobs}


# 4 GPUs. Three 1-GPU jobs of 50, 100 and 400 s finish first: the learnt median is
# 100 s, the cautious estimate (0.8 quantile) 400 s. Then, one a second: w (3 GPUs,
# 50 s) starts; a (3 GPUs) waits for it, b (4 GPUs) behind a, and c (1 GPU, 10,000 s)
# last. A reservation for a alone left GPU 3 to c, which then held b back for
# 10,000 s: a queue of equals was slower than fifo by the length of c.
WIDE_BEHIND_WIDE = [
    TraceJob("p0", 0.0, 1, 50.0),
    TraceJob("p1", 0.0, 1, 100.0),
    TraceJob("p2", 0.0, 1, 400.0),
    TraceJob("w", 1000.0, 3, 50.0),
    TraceJob("a", 1001.0, 3, 50.0),
    TraceJob("b", 1002.0, 4, 50.0),
    TraceJob("c", 1003.0, 1, 10_000.0),
]


def test_a_long_job_does_not_take_what_the_next_wide_job_in_line_needs():
    fifo = finishes(WIDE_BEHIND_WIDE, "fifo", gpus=4)
    assert (fifo["w"], fifo["a"], fifo["b"], fifo["c"]) == (1050.0, 1100.0, 1150.0, 11_150.0)
    assert finishes(WIDE_BEHIND_WIDE, "priority", gpus=4) == fifo


def test_each_of_the_two_rules_alone_still_lets_the_long_job_in():
    # plain EASY (only a holds a claim): c takes GPU 3 at 1003 and b waits for it
    assert finishes(WIDE_BEHIND_WIDE, PriorityPolicy(reserve_depth=1), gpus=4)["b"] == 11_053.0
    # holders' ends at the cautious estimate: once a runs (from 1050, to 1450 by that
    # estimate), c's estimate (400 s) ends "in time" for b's reservation and c starts
    late = finishes(WIDE_BEHIND_WIDE, PriorityPolicy(end_quantile=0.8), gpus=4)
    assert (late["c"], late["b"]) == (11_050.0, 11_100.0)


# 4 GPUs. w (3 GPUs, 200 s) runs; a (4 GPUs) waits for it. bo's jobs are known to be
# short (5 s), so c ends long before w's likely end and backfills on the free GPU,
# without delaying a.
def test_backfill_still_starts_a_job_known_to_end_before_the_reservation():
    jobs = [
        TraceJob("p0", 0.0, 1, 50.0, owner="ana"),
        TraceJob("p1", 0.0, 1, 100.0, owner="ana"),
        TraceJob("p2", 0.0, 1, 400.0, owner="ana"),
        TraceJob("q0", 0.0, 1, 5.0, owner="bo"),
        TraceJob("q1", 0.0, 1, 5.0, owner="bo"),
        TraceJob("q2", 0.0, 1, 5.0, owner="bo"),
        TraceJob("w", 1000.0, 3, 200.0, owner="ana"),
        TraceJob("a", 1001.0, 4, 50.0, owner="ana"),
        TraceJob("c", 1002.0, 1, 5.0, owner="bo"),
    ]
    got = finishes(jobs, "priority", gpus=4)
    assert got["c"] == 1007.0  # backfilled on the free GPU, ahead of a
    assert got["a"] == 1250.0  # and a is not delayed: w ends at 1200

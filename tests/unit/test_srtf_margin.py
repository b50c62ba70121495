"""srtf's restart margin weighs the JCT a preemption saves against what the restart costs (#52).

The simulator's default 30 s restart. A preemption saves the waiting job the time the
victim had left and costs the victim the waiting job's run and a restart; the restart
also holds back every job waiting behind the victim (by the victim's share of the
pool). The old margin counted the victim alone.
"""

from __future__ import annotations

import pytest

from jupyter_dlsched.sim import TraceJob, simulate, summarize


def replay(jobs: list[TraceJob], policy: str, gpus: int) -> tuple[dict[str, float], float]:
    result = simulate(jobs, policy, gpus=gpus)
    return {j.id: j.finish for j in result.jobs}, summarize(result)["avg_jct"]


# 2 GPUs. a (2 GPUs, 100 s) runs from 0; c (1 GPU, 200 s) comes at 5 and waits behind it
# (200 GPU-s against a's 190); b (1 GPU, 100 s) comes at 10: 100 GPU-s against a's 180,
# better by more than a's restart (60 GPU-s). Stopping a for b let c take the other GPU,
# and a waited for both: avg JCT 211.7 s against fifo's 195.0 s.
WIDE_VICTIM = [
    TraceJob("a", 0.0, 2, 100.0),
    TraceJob("c", 5.0, 1, 200.0),
    TraceJob("b", 10.0, 1, 100.0),
]


def test_srtf_does_not_stop_a_job_when_the_restart_costs_more_jct_than_it_saves():
    finish, avg = replay(WIDE_VICTIM, "srtf", gpus=2)
    assert finish == {"a": 100.0, "b": 200.0, "c": 300.0}
    assert avg == replay(WIDE_VICTIM, "fifo", gpus=2)[1] == 195.0


def one_gpu(b_seconds: float) -> list[TraceJob]:
    # a (100 s) runs from 0; c (200 s) comes at 5 and waits behind it; b comes at 10
    return [TraceJob("a", 0.0, 1, 100.0), TraceJob("c", 5.0, 1, 200.0)] + [
        TraceJob("b", 10.0, 1, b_seconds)
    ]


def test_srtf_counts_the_jobs_waiting_behind_the_victim():
    # b (55 s): 35 s better than a's 90 s left, more than one restart (30 s) but less
    # than the restart for a and for c (60 s): stopping a would save b 90 s and cost a
    # 85 s and c 30 s. Before, it was stopped: avg JCT 206.7 s, now 198.3 s
    finish, avg = replay(one_gpu(55.0), "srtf", gpus=1)
    assert finish == {"a": 100.0, "b": 155.0, "c": 355.0}
    assert avg == pytest.approx(595 / 3)


def test_srtf_still_preempts_when_that_saves_more_than_the_restart_costs():
    # b (20 s): 70 s better than a's 90 s left, more than 60 s. b runs 10-30, a 30-150
    # (90 s + 30 s restart), c 150-350: 10 s of JCT saved in all against not stopping a
    finish, avg = replay(one_gpu(20.0), "srtf", gpus=1)
    assert finish == {"a": 150.0, "b": 30.0, "c": 350.0}
    assert avg == pytest.approx(515 / 3)

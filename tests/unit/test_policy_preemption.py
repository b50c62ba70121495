"""Preemptive policies stop only what a decision must stop, and only when it pays;
fair share remembers past use, decayed.

Replays by hand: every figure below is worked out in the comments.
"""

from __future__ import annotations

import random

import pytest

from jupyter_dlsched.policy import (
    FairPolicy,
    FinishedJob,
    GittinsPolicy,
    LasPolicy,
    QueuedJob,
    SrtfPolicy,
)
from jupyter_dlsched.sim import TraceJob, simulate, summarize
from jupyter_dlsched.vocab.resources import Capacity, Request

# 3 GPUs. a (1 GPU, 11 s) at 0, b (2 GPUs, 24 s) at 2, c (1 GPU, 6 s) at 3.
THREE = [TraceJob("a", 0, 1, 11.0), TraceJob("b", 2, 2, 24.0), TraceJob("c", 3, 1, 6.0)]


def outcomes(result) -> dict[str, tuple[float, int]]:
    return {j.id: (j.jct, j.preemptions) for j in result.jobs}


def test_srtf_without_restart_cost_stops_only_the_job_that_loses_its_rank():
    # At 3 remaining GPU-times are c 6, a 8, b 23 x 2 = 46: c and a hold the pool, b
    # is stopped. a keeps its GPU (before the fix c was planned onto a's GPU, so a
    # was stopped and restarted too). c runs 3-9; b restarts at 9 with 23 s left: 32.
    policy = SrtfPolicy(restart_cost=0.0)
    result = simulate(THREE, policy, gpus=3, restart_overhead=0.0)
    assert outcomes(result) == {"a": (11.0, 0), "b": (30.0, 1), "c": (6.0, 0)}


def test_srtf_does_not_preempt_when_the_restart_costs_more_than_it_gains():
    # With a 30 s restart, stopping b (23 s left, 2 GPUs: 46 GPU-s) for c (6 GPU-s)
    # saves c 8 s and costs b 30 s on each GPU: nobody is stopped. c starts when a
    # ends at 11: JCT 14; b runs 2-26.
    result = simulate(THREE, "srtf", gpus=3)  # restart overhead and cost 30 s, the defaults
    assert outcomes(result) == {"a": (11.0, 0), "b": (24.0, 0), "c": (14.0, 0)}


def test_las_waits_for_the_minimum_run_time_before_preempting():
    # 1 GPU. long (1000 s) at 0 passes the 5 GPU-s threshold at 5; short (10 s)
    # arrives at 20 on a lower level but long has run only 20 of its 50 s minimum:
    # short waits until 50, runs 50-60; long restarts at 60 (restart cost 0).
    jobs = [TraceJob("long", 0, 1, 1000.0), TraceJob("short", 20, 1, 10.0)]
    policy = LasPolicy(thresholds=(5.0,), min_run=50.0)
    result = simulate(jobs, policy, gpus=1, restart_overhead=0.0)
    starts = {j.id: j.first_start for j in result.jobs}
    assert starts["short"] == pytest.approx(50.0, abs=1e-3)
    assert outcomes(result)["long"] == (pytest.approx(1010.0, abs=1e-3), 1)
    # without the minimum short preempts at once
    eager = simulate(jobs, LasPolicy(thresholds=(5.0,), min_run=0.0), gpus=1, restart_overhead=0)
    assert {j.id: j.first_start for j in eager.jobs}["short"] == 20.0


def minute_jobs(seed: int = 3) -> list[TraceJob]:
    # 60 jobs of one to five minutes, 1-4 GPUs, arriving over 10 minutes on 16 GPUs
    rng = random.Random(seed)
    return [
        TraceJob(f"j{i}", rng.uniform(0, 600), rng.choice([1, 1, 2, 4]), rng.uniform(60, 300))
        for i in range(60)
    ]


def test_gittins_does_not_lose_to_fifo_on_minute_long_jobs():
    jobs = minute_jobs()
    fifo = summarize(simulate(jobs, "fifo", gpus=16))
    gittins = summarize(simulate(jobs, "gittins", gpus=16))
    assert gittins["avg_jct"] <= fifo["avg_jct"]
    assert gittins["preemptions_per_job"] <= 1.0
    # the guard is what does it: without it the same replay thrashes
    eager = summarize(simulate(jobs, GittinsPolicy(restart_cost=0.0, min_run=0.0), gpus=16))
    assert eager["preemptions_per_job"] > gittins["preemptions_per_job"]


def test_fair_share_forgets_old_usage_with_its_half_life():
    # one GPU free; bob used 10 GPU-hours a month ago, carl as much an hour ago. carl
    # submitted first, but his recent use counts almost whole, bob's a month-old use
    # at 2^-30/7 (5 %): bob goes first. Without memory submit order decides.
    capacity = Capacity.empty(n_gpus=1, gpu_mem=16 * 2**30, cpus=0, mem=0)
    now = 40 * 86400.0
    carl = QueuedJob("carl-job", 1, now - 10, Request(gpus=1, cpus=0), owner="carl")
    bob = QueuedJob("bob-job", 2, now - 5, Request(gpus=1, cpus=0), owner="bob")
    history = [
        FinishedJob("bob", "", 36000.0, now - 30 * 86400),
        FinishedJob("carl", "", 36000.0, now - 3600),
    ]
    fair = FairPolicy()
    fair.learn(history, replace=True)
    assert [s.job_id for s in fair([carl, bob], [], capacity, now).starts] == ["bob-job"]
    assert fair.used("bob", now) == pytest.approx(36000 * 0.5 ** (30 / 7))
    forgetful = FairPolicy(half_life=None)
    forgetful.learn(history, replace=True)
    assert [s.job_id for s in forgetful([carl, bob], [], capacity, now).starts] == ["carl-job"]
    # a replay teaches it as jobs finish: the same order comes out of the simulator
    jobs = [
        TraceJob("bob-old", 0, 1, 36000.0, "bob"),
        TraceJob("carl-old", 29 * 86400, 1, 36000.0, "carl"),
        TraceJob("blocker", 30 * 86400 - 100, 1, 200.0, "dan"),
        TraceJob("carl-new", 30 * 86400 - 50, 1, 10.0, "carl"),
        TraceJob("bob-new", 30 * 86400 - 40, 1, 10.0, "bob"),
    ]
    first = {j.id: j.first_start for j in simulate(jobs, "fair", gpus=1).jobs}
    assert first["bob-new"] < first["carl-new"]


def test_the_tail_guard_promotes_a_job_that_waited_a_multiple_of_its_expected_size():
    # 4 GPUs kept busy by a stream of 1-GPU jobs of 100 s (one every 25 s); a 4-GPU job
    # arriving at 1 never finds 4 GPUs free: first fit gives every freed GPU to the
    # stream. Expected size 100 GPU-s, so 25 s on 4 GPUs: with promote_factor 2 it goes
    # first after waiting 50 s, at 51, stopping what holds its GPUs.
    jobs = [TraceJob(f"s{i}", i * 25.0, 1, 100.0) for i in range(80)]
    jobs.append(TraceJob("wide", 1.0, 4, 100.0))
    known = {"sizes": [100.0] * 10, "learn_sizes": False, "min_run": 0.0, "restart_cost": 0.0}
    starved = simulate(jobs, GittinsPolicy(**known), gpus=4, restart_overhead=0)
    guarded = simulate(jobs, GittinsPolicy(promote_factor=2.0, **known), gpus=4, restart_overhead=0)
    first = {j.id: j.first_start for j in guarded.jobs}
    assert first["wide"] == pytest.approx(51.0)
    assert {j.id: j.first_start for j in starved.jobs}["wide"] > 1900

"""Every policy on plain data: who starts, who waits, who is preempted, and why."""

from __future__ import annotations

import pytest
from policy_cases import pool, preempted, queued, running_on, started

from jupyter_dlsched.policy import (
    POLICIES,
    FairPolicy,
    GittinsPolicy,
    LasPolicy,
    PresortedQueue,
    PriorityPolicy,
    SjfPolicy,
    SrtfPolicy,
    get_policy,
    submit_order,
)
from jupyter_dlsched.vocab.errors import SpecError

# registry


def test_every_policy_is_registered_and_built_by_name():
    assert set(POLICIES) == {
        "priority",
        "fifo",
        "fifo-ff",
        "sjf",
        "sjf-gputime",
        "fair",
        "las",
        "gittins",
        "srtf",
    }
    for name in POLICIES:
        assert get_policy(name).name == name


def test_dlsched_sims_help_lists_every_registered_policy_in_order():
    from jupyter_dlsched.sim.cli import POLICY_NAMES

    # the help keeps its own list, so that building the parser loads no policy
    assert POLICY_NAMES == tuple(POLICIES)


def test_unknown_policy_or_parameter_is_a_spec_error_naming_it():
    with pytest.raises(SpecError, match="one of"):
        get_policy("lottery")
    with pytest.raises(SpecError, match="las policy parameters"):
        get_policy("las", treshold=3)


def test_preemptive_policies_expose_their_grace_period():
    assert get_policy("priority", preempt=True, preempt_grace=12).preempt_grace == 12
    for name in ("las", "gittins", "srtf"):
        assert get_policy(name).preempt_grace == 30.0


# fifo


def test_fifo_head_of_line_blocks_a_job_that_would_fit():
    jobs = [queued("big", 0, gpus=2), queued("small", 1)]
    _, cap = running_on(pool(2), "r", 9)
    d = get_policy("fifo")(jobs, [], cap, now=10)
    assert started(d) == []
    assert d.waiting["small"] == "behind big (first in line)"
    assert d.order == ["big", "small"]


def test_fifo_first_fit_lets_a_fitting_job_jump_a_blocked_head():
    jobs = [queued("big", 0, gpus=2), queued("small", 1)]
    _, cap = running_on(pool(2), "r", 9)
    d = get_policy("fifo-ff")(jobs, [], cap, now=10)
    assert started(d) == ["small"]
    assert d.waiting["big"] == "waiting for 2 GPUs"


def test_fifo_orders_by_submit_order_not_by_list_order():
    jobs = [queued("second", 2), queued("first", 1)]
    d = get_policy("fifo")(jobs, [], pool(1), now=0)
    assert started(d) == ["first"]


# sjf


def test_sjf_starts_the_shortest_time_limit_and_leaves_unlimited_jobs_last():
    jobs = [
        queued("none", 0, time_limit=None),
        queued("long", 1, time_limit=3600),
        queued("short", 2, time_limit=60),
    ]
    d = SjfPolicy()(jobs, [], pool(2), now=0)
    assert started(d) == ["short", "long"]
    assert d.order == ["short", "long", "none"]


def test_sjf_never_preempts():
    r, cap = running_on(pool(1), "r", 0, time_limit=10**6, preemptible=True)
    d = SjfPolicy()([queued("q", 1, time_limit=1)], [r], cap, now=5)
    assert (started(d), preempted(d)) == ([], [])


# fair


def test_fair_serves_the_owner_with_the_smaller_dominant_share_first():
    r, cap = running_on(pool(3), "ana-running", 0, owner="ana")
    jobs = [queued("ana-2", 1, owner="ana"), queued("bo-1", 2, owner="bo")]
    d = FairPolicy()(jobs, [r], cap, now=0)
    assert started(d)[0] == "bo-1"


def test_fair_weights_entitle_an_owner_to_a_larger_share():
    jobs = [queued(f"ana-{i}", i, owner="ana") for i in range(4)]
    jobs += [queued(f"bo-{i}", 10 + i, owner="bo") for i in range(4)]
    d = FairPolicy(weights={"ana": 3})(jobs, [], pool(4), now=0)
    assert sorted(started(d)) == ["ana-0", "ana-1", "ana-2", "bo-0"]


def test_fair_alone_is_first_come_first_served():
    jobs = [queued("a", 0, gpus=2), queued("b", 1), queued("c", 2)]
    d = FairPolicy()(jobs, [], pool(3), now=0)
    assert started(d) == ["a", "b"]
    assert d.waiting == {"c": "waiting for 1 GPU"}


# priority with preemption


def test_priority_preempts_a_preemptible_lower_priority_job_to_start_a_higher_one():
    low, cap = running_on(pool(1), "low", 0, priority=10, preemptible=True)
    d = PriorityPolicy(preempt=True)([queued("urgent", 1, priority=1000)], [low], cap, now=5)
    assert preempted(d) == ["low"]
    assert started(d) == []  # it starts once the victim has let go of the GPU
    assert d.waiting["urgent"] == "waiting for preempted jobs to stop"


def test_priority_preemption_is_opt_in():
    low, cap = running_on(pool(1), "low", 0, priority=10, preemptible=True)
    d = PriorityPolicy()([queued("urgent", 1, priority=1000)], [low], cap, now=5)
    assert preempted(d) == []


def test_priority_never_preempts_a_job_not_submitted_as_preemptible():
    low, cap = running_on(pool(1), "low", 0, priority=10, preemptible=False)
    d = PriorityPolicy(preempt=True)([queued("urgent", 1, priority=1000)], [low], cap, now=5)
    assert preempted(d) == []


def test_priority_never_preempts_an_equal_or_higher_priority_job():
    same, cap = running_on(pool(1), "same", 0, priority=50, preemptible=True)
    waiting = queued("old", 1, priority=50, submitted=-(10**6))  # aged far above 50
    d = PriorityPolicy(preempt=True)([waiting], [same], cap, now=5)
    assert preempted(d) == []


def test_priority_preempts_only_when_that_lets_the_job_start():
    low, cap = running_on(pool(2), "low", 0, priority=10, preemptible=True)
    keep, cap = running_on(cap, "keep", 1, priority=500, preemptible=True)
    d = PriorityPolicy(preempt=True)([queued("wide", 2, gpus=2, priority=100)], [low, keep], cap, 5)
    assert preempted(d) == []  # freeing "low" alone would not make room for 2 GPUs


def test_priority_preempts_the_lowest_priority_victim_and_no_more():
    a, cap = running_on(pool(2), "p20", 0, priority=20, preemptible=True)
    b, cap = running_on(cap, "p10", 1, priority=10, preemptible=True)
    d = PriorityPolicy(preempt=True)([queued("q", 2, priority=100)], [a, b], cap, now=5)
    assert preempted(d) == ["p10"]


def test_priority_does_not_preempt_again_while_a_victim_is_stopping():
    a, cap = running_on(pool(2), "stopping", 0, priority=10, preemptible=True, stopping=True)
    b, cap = running_on(cap, "other", 1, priority=10, preemptible=True)
    d = PriorityPolicy(preempt=True)([queued("q", 2, priority=100)], [a, b], cap, now=5)
    assert preempted(d) == []


# srtf, las, gittins


def test_srtf_preempts_the_job_with_most_remaining_gpu_time():
    a, cap = running_on(pool(2), "a", 0, remaining=100.0, preemptible=True)
    b, cap = running_on(cap, "b", 1, remaining=50.0, preemptible=True)
    d = SrtfPolicy()([queued("q", 2, remaining=10.0)], [a, b], cap, now=1.0)
    assert preempted(d) == ["a"]


def test_srtf_weighs_remaining_time_by_gpus():
    wide, cap = running_on(pool(2), "wide", 0, gpus=2, remaining=30.0, preemptible=True)
    d = SrtfPolicy(restart_cost=0.0)([queued("q", 1, remaining=40.0)], [wide], cap, now=0.0)
    assert preempted(d) == ["wide"]  # 60 GPU-seconds left against 40


def test_las_runs_the_job_with_least_attained_service_first():
    jobs = [queued("old", 0, attained=5000.0), queued("new", 1)]
    d = LasPolicy()(jobs, [], pool(1), now=0)
    assert started(d) == ["new"]


def test_las_preempts_a_job_that_crossed_a_threshold_for_a_new_one():
    r, cap = running_on(pool(1), "r", 0, started=0.0, attained=3000.0, preemptible=True)
    policy = LasPolicy(thresholds=(3600.0,))
    before = policy([queued("new", 1)], [r], cap, now=500.0)
    assert preempted(before) == []
    assert before.wake_at == pytest.approx(600.0, abs=1e-3)  # when r reaches 3600
    after = policy([queued("new", 1)], [r], cap, now=600.1)
    assert preempted(after) == ["r"]


def test_gittins_ignores_declared_and_true_durations():
    sizes = [60.0] * 9 + [36000.0]
    policy = GittinsPolicy(sizes=sizes, quantum=60)
    a, cap = running_on(pool(1), "a", 0, started=0.0, preemptible=True)
    jobs_a = [queued("q", 1, time_limit=1, remaining=1.0)]
    jobs_b = [queued("q", 1, time_limit=10**6, remaining=10**6)]
    assert preempted(policy(jobs_a, [a], cap, 600.0)) == preempted(policy(jobs_b, [a], cap, 600.0))


def test_gittins_favours_a_fresh_job_over_one_that_outlived_most_sizes():
    policy = GittinsPolicy(sizes=[60.0] * 9 + [36000.0], quantum=60, min_run=300.0)
    r, cap = running_on(pool(1), "veteran", 0, started=0.0, preemptible=True)
    d = policy([queued("fresh", 1)], [r], cap, now=600.0)
    assert preempted(d) == ["veteran"]
    # inside its minimum run time it is not stopped, and the policy asks again when it ends
    early = policy([queued("fresh", 1)], [r], cap, now=200.0)
    assert preempted(early) == [] and early.wake_at is not None and early.wake_at <= 300.0


def test_gittins_index_falls_with_age_for_heavy_tailed_sizes():
    policy = GittinsPolicy()
    assert policy.index(3600.0) > policy.index(36000.0) > policy.index(360000.0)


# the fast path the simulator uses


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_presorted_queue_gives_the_same_starts_as_a_plain_list(name):
    policy = get_policy(name)
    jobs = [
        queued(f"j{i}", i, gpus=g, time_limit=t, remaining=t, attained=a)
        for i, (g, t, a) in enumerate([(2, 50, 0), (1, 10, 4000), (4, 5, 0), (1, 99, 0), (1, 7, 0)])
    ]
    r, cap = running_on(pool(4), "r", 99, remaining=1000.0, preemptible=True, started=0.0)
    key = getattr(policy, "queue_key", submit_order)
    fast = PresortedQueue(sorted(jobs, key=key), key=key, gpu_only=True, uniform_priority=True)
    plain = policy(jobs, [r], cap, now=100.0)
    quick = policy(fast, [r], cap, now=100.0)
    assert started(quick) == started(plain)
    assert preempted(quick) == preempted(plain)


def test_policies_are_pure_same_snapshot_same_decisions():
    jobs = [queued(f"j{i}", i, gpus=1 + i % 2, time_limit=10 * i) for i in range(6)]
    for name in POLICIES:
        policy = get_policy(name)
        first = policy(jobs, [], pool(3), now=50.0)
        second = policy(list(reversed(jobs)), [], pool(3), now=50.0)
        assert started(first) == started(second), name


def test_a_promoted_job_goes_first_and_is_no_longer_a_victim():
    policy = LasPolicy(thresholds=(100.0,), promote_after=1000.0)
    veteran, cap = running_on(pool(1), "veteran", 0, submitted=0.0, started=0.0, preemptible=True)
    fresh = queued("fresh", 1, submitted=900.0)
    assert preempted(policy([fresh], [veteran], cap, now=1001.0)) == []
    waiting = [queued("young", 2, submitted=990.0), queued("old", 3, submitted=0.0, attained=1e6)]
    d = policy(waiting, [], pool(1), now=1001.0)
    assert started(d) == ["old"]
    assert policy(waiting[:1], [], cap, now=995.0).wake_at == 1990.0  # when "young" is promoted


def test_priority_reserve_after_lets_jobs_behind_a_fresh_blocked_job_fit_first():
    r, cap = running_on(pool(2), "r", 0, time_limit=100.0)
    jobs = [queued("wide", 1, gpus=2, submitted=0.0), queued("small", 2, submitted=1.0)]
    easy = PriorityPolicy()(jobs, [r], cap, now=10.0)
    patient = PriorityPolicy(reserve_after=3600)(jobs, [r], cap, now=10.0)
    assert started(easy) == []  # the free GPU is held for "wide"
    assert started(patient) == ["small"]

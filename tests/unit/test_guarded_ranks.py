"""The kept rank index's guarded victims (past the minimum run time, ranked by rank less
restart margin) decide exactly as ranking the running jobs and guarding them before each
plan: the index only spares the policy plans that would stop nobody."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_dlsched.policy import get_policy
from jupyter_dlsched.sim import TraceJob, simulate


class _GuardedAfresh:
    """A policy whose kept index does not keep the guarded victims: before each plan the
    running jobs are ranked and guarded (``_guarded_victims``, ``_plan_reaches``)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("inner", "running_ranks"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def running_ranks(self):
        ranks = self.inner.running_ranks()
        if ranks is not None:
            ranks.guard_known = False
        return ranks

    def __call__(self, queued, running, capacity, now):
        return self.inner(queued, running, capacity, now)


_job = st.tuples(
    st.integers(0, 400),  # submit
    st.sampled_from([1, 1, 1, 2, 4]),  # GPUs
    st.integers(1, 900),  # duration
    st.sampled_from(["ana", "bo"]),  # owner: gittins learns per owner
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(_job, min_size=1, max_size=40),
    name=st.sampled_from(["las", "gittins"]),
    gpus=st.sampled_from([4, 8]),
    nodes=st.sampled_from([1, 2]),
    grace=st.sampled_from([0.0, 20.0]),
    min_run=st.sampled_from([0.0, 30.0, 203.3]),
    restart=st.sampled_from([0.0, 5.0, 30.0]),
)
def test_guarded_victims_kept_by_the_index_decide_as_guarding_before_each_plan(
    rows, name, gpus, nodes, grace, min_run, restart
):
    trace = [TraceJob(f"j{i}", s, g, float(d), o) for i, (s, g, d, o) in enumerate(rows)]
    params = {
        "las": {"thresholds": (300.0, 1200.0)},  # crossed within these jobs
        "gittins": {"group_min": 3, "quantum": 30.0, "window": 8},  # learns, re-ranks often
    }[name]
    params["min_run"] = min_run
    options = {"nodes": nodes, "grace": grace, "restart_overhead": restart}
    kept = simulate(trace, get_policy(name, **params), gpus, **options)
    afresh = simulate(trace, _GuardedAfresh(get_policy(name, **params)), gpus, **options)
    assert kept.jobs == afresh.jobs
    assert kept.policy_calls == afresh.policy_calls
    assert kept.timeline == afresh.timeline


_running = st.tuples(
    st.sampled_from([1, 2, 3]),  # GPUs
    st.sampled_from([None, 0.0, 10.1, 55.7, 300.0, 4000.3]),  # remaining at its start
    st.floats(0.0, 100.0),  # started
    st.booleans(),  # preemptible
    st.booleans(),  # stopping
)


@settings(max_examples=300, deadline=None)
@given(
    running_rows=st.lists(_running, min_size=4, max_size=24),
    queued_rows=st.lists(
        st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([5.0, 60.7, 500.0])),
        min_size=1,
        max_size=12,
    ),
    restart=st.sampled_from([0.0, 7.3, 11.9, 30.0]),  # odd figures: floats rounded on the way
    min_run=st.sampled_from([0.0, 30.0]),
    pool=st.sampled_from([7, 13, 24]),
)
def test_srtf_guards_its_victims_in_one_pass_as_ranking_then_guarding(
    running_rows, queued_rows, restart, min_run, pool
):
    from jupyter_dlsched.policy.base import QueuedJob, RunningJob
    from jupyter_dlsched.policy.preempting import RankedPreemption
    from jupyter_dlsched.policy.srtf import SrtfPolicy
    from jupyter_dlsched.vocab.resources import Placement, Request

    running = [
        RunningJob(
            f"r{i}", i, 0.0, float(started), Request(gpus=g, cpus=0),
            Placement(gpus=tuple(range(g)), gpu_mem=(0,) * g),
            preemptible=preemptible, remaining=remaining, stopping=stopping,
        )
        for i, (g, remaining, started, preemptible, stopping) in enumerate(running_rows)
    ]  # fmt: skip
    policy = SrtfPolicy(restart_cost=restart, min_run=min_run)
    ordered = sorted(
        (
            QueuedJob(f"q{i}", 100 + i, 0.0, Request(gpus=g, cpus=0), remaining=left)
            for i, (g, left) in enumerate(queued_rows)
        ),
        key=policy.queue_key,
    )
    fast = policy._guarded_victims(running, 100.3, ordered, pool)
    slow = RankedPreemption._guarded_victims(policy, running, 100.3, ordered, pool)
    assert fast == slow

"""Elastic jobs in the policy and the simulator: grow into idle GPUs, shrink first, hysteresis.

The policy tests call ``ElasticPolicy`` on plain snapshots (the clock is the one
fake: a number); the replay tests run the simulator, which drives the very same
policy objects, and check it against hand-computed times.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_dlsched.policy import get_policy
from jupyter_dlsched.policy.base import QueuedJob, RunningJob
from jupyter_dlsched.policy.elastic import ElasticPolicy
from jupyter_dlsched.policy.speedup import SpeedupError, parse_speedup
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.sim.elastic import ElasticOptionError, make_elastic, parse_elastic
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request

UNIT = 1000  # memory of one GPU in these snapshots
PREEMPTIVE = ["priority", "las", "gittins", "srtf"]
ALL = ["fifo", "fifo-ff", "sjf", "fair", *PREEMPTIVE]


def pool(n: int) -> Capacity:
    return Capacity.empty(n_gpus=n, gpu_mem=UNIT, cpus=0, mem=0)


def holding(capacity: Capacity, *placements: Placement) -> Capacity:
    for p in placements:
        capacity = capacity.take(p)
    return capacity


def on(*gpus: int) -> Placement:
    return Placement(gpus=gpus, gpu_mem=(UNIT,) * len(gpus))


def queued(job_id: str, seq: int, gpus: int = 1, top: int | None = None, **kw) -> QueuedJob:
    return QueuedJob(job_id, seq, float(seq), Request(gpus=gpus, cpus=0), max_gpus=top, **kw)


def elastic_running(job_id: str, gpus: tuple[int, ...], started: float, low=1, top=2, **kw):
    return RunningJob(
        job_id,
        0,
        0.0,
        started,
        Request(gpus=len(gpus), cpus=0),
        on(*gpus),
        min_gpus=low,
        max_gpus=top,
        **kw,
    )


def test_an_elastic_job_alone_starts_on_every_free_gpu_up_to_its_maximum():
    policy = ElasticPolicy(get_policy("fifo"))
    d = policy([queued("e", 0, top=4)], [], pool(2), 0.0)
    assert [(s.job_id, s.placement.gpus) for s in d.starts] == [("e", (0, 1))]
    assert d.resizes == []
    d = policy([queued("e", 0, top=2)], [], pool(8), 0.0)
    assert [len(s.placement.gpus) for s in d.starts] == [2]


@pytest.mark.parametrize("name", ALL)
def test_waiting_work_shrinks_an_elastic_job_and_starts_once_it_let_go(name):
    policy = ElasticPolicy(get_policy(name), resize_every=300)
    e = elastic_running("e", (0, 1), started=0.0)
    rigid = queued("r", 1)
    d = policy([rigid], [e], holding(pool(2), e.placement), 400.0)
    assert d.starts == [] and d.preempts == []
    assert [(r.job_id, len(r.placement.gpus)) for r in d.resizes] == [("e", 1)]
    assert d.waiting["r"] == "waiting for elastic job e to shrink"
    # the shrink done (a restart at 400 on the GPU it kept), the rigid job starts on the other
    shrunk = elastic_running("e", d.resizes[0].placement.gpus, started=400.0)
    d = policy([rigid], [shrunk], holding(pool(2), shrunk.placement), 400.0)
    assert [s.job_id for s in d.starts] == ["r"]
    assert set(d.starts[0].placement.gpus).isdisjoint(shrunk.placement.gpus)
    assert d.resizes == []


def test_a_start_uses_truly_free_gpus_before_borrowed_ones():
    policy = ElasticPolicy(get_policy("fifo"))
    e = elastic_running("e", (0, 1), started=0.0)
    d = policy([queued("r", 1)], [e], holding(pool(3), e.placement), 1000.0)
    assert [(s.job_id, s.placement.gpus) for s in d.starts] == [("r", (2,))]
    assert d.resizes == []


def test_elastic_jobs_shrink_before_anything_is_preempted():
    # low-priority rigid job on GPU 0, elastic job on 1-2: the urgent job takes a borrowed GPU
    policy = ElasticPolicy(get_policy("priority", preempt=True))
    low = RunningJob(
        "low", 0, 0.0, 0.0, Request(gpus=1, cpus=0), on(0), priority=0, preemptible=True
    )
    e = elastic_running("e", (1, 2), started=0.0, priority=0, preemptible=True)
    urgent = queued("u", 2, priority=1000)
    d = policy([urgent], [low, e], holding(pool(3), low.placement, e.placement), 1000.0)
    assert d.preempts == []
    assert [(r.job_id, len(r.placement.gpus)) for r in d.resizes] == [("e", 1)]


def test_no_resize_within_resize_every_and_a_wake_up_when_it_ends():
    policy = ElasticPolicy(get_policy("fifo"), resize_every=300)
    e = elastic_running("e", (0, 1), started=100.0)  # started (or resized) 100 s ago
    d = policy([queued("r", 1)], [e], holding(pool(2), e.placement), 200.0)
    assert d.starts == [] and d.resizes == []
    assert d.wake_at == 400.0
    # idle GPUs do not grow a job resized less than resize_every ago either
    small = elastic_running("s", (0,), started=100.0, top=4)
    d = policy([], [small], holding(pool(4), small.placement), 200.0)
    assert d.resizes == [] and d.wake_at == 400.0
    d = policy([], [small], holding(pool(4), small.placement), 400.0)
    assert [(r.job_id, r.placement.gpus) for r in d.resizes] == [("s", (0, 1, 2, 3))]


def test_the_wrapped_policy_sees_a_lenders_service_at_the_gpus_it_holds():
    # seen at its minimum (1 GPU) while lending 3, e still had 4 GPUs for 1000 s: a policy
    # that ranks by service (las, gittins) must not see it as 4 times younger than it is
    offered = []

    def recording(queued, running, capacity, now):
        offered.extend(running)
        return get_policy("las")(queued, running, capacity, now)

    recording.name = "las"  # type: ignore[attr-defined]
    e = elastic_running("e", (0, 1, 2, 3), started=0.0, top=4)
    ElasticPolicy(recording)([queued("r", 1)], [e], holding(pool(4), e.placement), 1000.0)
    assert [(j.request.gpus, j.attained_at(1000.0)) for j in offered] == [(1, 4000.0)]


def test_idle_gpus_are_shared_fairly_among_elastic_jobs():
    policy = ElasticPolicy(get_policy("fifo"))
    jobs = [queued("a", 0, top=8), queued("b", 1, top=8), queued("c", 2, top=2)]
    d = policy(jobs, [], pool(8), 0.0)
    assert {s.job_id: len(s.placement.gpus) for s in d.starts} == {"a": 3, "b": 3, "c": 2}
    assert len({g for s in d.starts for g in s.placement.gpus}) == 8


def test_a_running_job_grows_only_when_it_saves_more_than_the_restart_costs():
    # nearly all serial: two GPUs would save far less than 2 x 60 s of restart
    slow = ElasticPolicy(get_policy("fifo"), restart_cost=60, speedup="amdahl:0.99")
    e = elastic_running("e", (0,), started=0.0)
    assert slow([], [e], holding(pool(2), e.placement), 400.0).resizes == []
    fast = ElasticPolicy(get_policy("fifo"), restart_cost=60, speedup="linear")
    assert [
        r.placement.gpus for r in fast([], [e], holding(pool(2), e.placement), 400.0).resizes
    ] == [(0, 1)]
    # a job starting now grows for free, whatever the model
    d = slow([queued("n", 0, top=2)], [], pool(2), 0.0)
    assert [len(s.placement.gpus) for s in d.starts] == [2]


def test_fair_share_counts_gpus_beyond_the_minimum_as_borrowed():
    # ana's elastic job holds all 4 GPUs, 3 of them borrowed; bob's rigid 3-GPU job gets them
    policy = ElasticPolicy(get_policy("fair"))
    e = elastic_running("e", (0, 1, 2, 3), started=0.0, top=4, owner="ana")
    d = policy([queued("b", 1, gpus=3, owner="bob")], [e], holding(pool(4), e.placement), 1000.0)
    assert d.preempts == []
    assert [(r.job_id, r.placement.gpus) for r in d.resizes] == [("e", (0,))]


# --- the simulator drives the same objects ---------------------------------------------


def test_the_replay_of_a_small_trace_matches_the_policy_by_hand():
    # e (1:2) alone from 0 on 2 GPUs at twice its speed; r (rigid) at 1000 makes it shrink;
    # r ends at 1600 and e grows back. Each resize costs 30 s.
    trace = [TraceJob("e", 0, 1, 3600.0, elastic=(1, 2)), TraceJob("r", 1000, 1, 600.0)]
    for name in ALL:
        result = simulate(trace, name, gpus=2, restart_overhead=30)
        e, r = result.jobs
        assert result.resize_log == [(1000, "e", 2, 1), (1600, "e", 1, 2)], name
        assert (r.first_start, r.finish) == (1000, 1600), name
        # work done: 2000 s by 1000; 570 s on 1 GPU by 1600; 1030 s left at 2x after 30 s
        assert e.finish == pytest.approx(2145.0), name
        assert (e.resizes, e.preemptions) == (2, 0)
        assert result.policy.endswith(" (elastic)") and result.policy.startswith(name)


def test_the_rigid_replay_is_unchanged_when_no_job_is_elastic():
    trace = [TraceJob("a", 0, 1, 100.0), TraceJob("b", 10, 2, 50.0)]
    assert [j.finish for j in simulate(trace, "fifo", gpus=2).jobs] == [100.0, 150.0]
    assert simulate(trace, "fifo", gpus=2).policy == "fifo"


def test_an_elastic_job_runs_at_its_speedup_models_rate():
    # measured at 2 GPUs for 100 s; 4 GPUs under Amdahl with a serial fraction of 0.2
    trace = [TraceJob("e", 0, 2, 100.0, elastic=(1, 4))]
    model = parse_speedup("amdahl:0.2")
    finish = simulate(trace, "fifo", gpus=4, speedup=model).jobs[0].finish
    assert finish == pytest.approx(100.0 / model.ratio(2, 4))


BLIND = ["fifo", "fifo-ff", "priority", "sjf", "sjf-gputime", "fair", "las", "gittins"]
H = 3600.0


def wide_job_before_short_ones(elastic: bool) -> list[TraceJob]:
    """4 GPUs: one frees at 1 h, three at 10 h; a 4-GPU job of 10 h (elastic in 1:4 or
    rigid) arrives ahead of three 1-GPU jobs of 1 h."""
    return [
        TraceJob("l0", 0, 1, 1 * H),
        *(TraceJob(f"l{i}", 0, 1, 10 * H) for i in (1, 2, 3)),
        TraceJob("w", 60, 4, 10 * H, elastic=(1, 4) if elastic else None),
        *(TraceJob(f"s{i}", 120, 1, 1 * H) for i in (1, 2, 3)),
    ]


def avg_jct(result) -> float:
    return sum(o.finish - o.submit for o in result.jobs) / len(result.jobs)


@pytest.mark.parametrize("speedup", ["linear", "amdahl:0.05"])
@pytest.mark.parametrize("name", BLIND)
def test_a_wide_elastic_job_takes_no_hole_that_the_short_jobs_behind_it_fill(name, speedup):
    # Offered at its minimum, w started at once on the GPU free at 1 h and ran there at a
    # quarter of its speed, so the short jobs that fill that hole rigid (fifo-ff, sjf,
    # fair: 1-4 h) waited for the long ones to end at 10 h: 10.3 h on average, 7.5 h rigid
    rigid = simulate(wide_job_before_short_ones(False), name, gpus=4, restart_overhead=30)
    flex = simulate(
        wide_job_before_short_ones(True), name, gpus=4, restart_overhead=30, speedup=speedup
    )
    assert avg_jct(flex) <= avg_jct(rigid)
    before = {o.id: o.first_start for o in rigid.jobs}
    for o in flex.jobs:
        if o.id.startswith("s"):
            assert o.first_start <= before[o.id], o.id


def test_a_wide_elastic_job_starts_narrow_on_the_hole_nobody_behind_it_can_use():
    result = simulate(wide_job_before_short_ones(True), "fifo-ff", gpus=4, restart_overhead=30)
    jobs = {o.id: o for o in result.jobs}
    assert [jobs[f"s{i}"].first_start for i in (1, 2, 3)] == [1 * H, 2 * H, 3 * H]
    # w starts at 4 h on the GPU the short jobs left, at a quarter of its speed (1.5 h of
    # its 10 h by 10 h), and grows to 4 GPUs when the long jobs end: it ends at 18.5 h
    # and 30 s of restart, rigid at 20 h
    assert jobs["w"].first_start == 4 * H
    assert result.resize_log == [(10 * H, "w", 1, 4)]
    assert jobs["w"].finish == pytest.approx(18.5 * H + 30)


def test_a_learning_policy_learns_an_elastic_jobs_size_at_the_gpus_it_asked_for():
    # 100 s on the 1 GPU it asked for; alone on 4 it runs 2.5 x as fast under Amdahl with a
    # serial fraction of 0.2: 40 s on 4 GPUs, 160 GPU-seconds held, 100 of them needed
    from jupyter_dlsched.policy.fifo import FifoPolicy

    learnt: list[float] = []

    class Learning(FifoPolicy):
        def learn(self, finished, replace=False):
            learnt.extend(f.size for f in finished)

    trace = [TraceJob("e", 0, 1, 100.0, elastic=(1, 4)), TraceJob("r", 200, 2, 50.0)]
    result = simulate(trace, Learning(), gpus=4, speedup="amdahl:0.2")
    assert result.jobs[0].finish == pytest.approx(40.0)
    assert learnt == [pytest.approx(100.0), pytest.approx(100.0)]


@pytest.mark.parametrize("name", ALL)
def test_hysteresis_holds_on_random_traces(name):
    rng = random.Random(7)
    for _ in range(5):
        trace = [
            TraceJob(
                f"j{i}",
                rng.uniform(0, 20000),
                rng.choice([1, 1, 2, 4]),
                rng.uniform(60, 8000),
                owner=rng.choice("ab"),
                priority=rng.choice([0, 50, 100]),
            )
            for i in range(40)
        ]
        trace = make_elastic(trace, 0.5, 2)
        result = simulate(trace, name, gpus=8, resize_every=300, restart_overhead=30)
        assert all(j.finish >= j.submit for j in result.jobs)
        outcomes = {j.id: j for j in result.jobs}
        # a start counts as the last resize (the engine also refuses any resize inside it)
        last = {j.id: j.first_start for j in result.jobs if j.preemptions == 0}
        for t, job_id, before, after in result.resize_log:
            assert before != after
            assert t - last.get(job_id, -1e18) >= 300 - 1e-6
            last[job_id] = t
        # useful work is conserved: nothing finishes before its work could be done
        for job in trace:
            if job.elastic is None:
                assert outcomes[job.id].held >= job.duration - 1e-6


def test_make_elastic_spreads_the_share_evenly_and_leaves_gpu_shares_rigid():
    jobs = [TraceJob(str(i), float(i), 1, 60.0) for i in range(10)] + [
        TraceJob("s", 11.0, 0.5, 60.0)
    ]
    chosen = make_elastic(jobs, 0.3, 4)
    assert [j.id for j in chosen if j.elastic] == ["3", "6", "9"]
    assert chosen[-1].elastic is None and {j.elastic for j in chosen if j.elastic} == {(1, 4)}


@pytest.mark.parametrize(
    "text, words",
    [("1.5", "SHARE[:MAXFACTOR]"), ("0.5:0.5", "a factor >= 1"), ("half", "SHARE")],
)
def test_bad_elastic_options_say_what_is_allowed(text, words):
    with pytest.raises(ElasticOptionError, match="expected SHARE"):
        parse_elastic(text)


@pytest.mark.parametrize("text", ["amdahl:1", "amdahl", "table:2", "table:0=1", "cubic"])
def test_bad_speedup_models_say_what_is_allowed(text):
    with pytest.raises(SpeedupError, match="speedup"):
        parse_speedup(text)


def test_a_speedup_table_interpolates_and_stays_flat_past_its_end():
    model = parse_speedup("table:1=1,2=1.8,4=3")
    assert (model(1), model(3), model(8)) == (1.0, 2.4, 3.0)


def dlsched_sim(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("dlsched")
    command = str(script) if script.exists() else shutil.which("dlsched")
    assert command, "the dlsched console script is not installed"
    return subprocess.run(
        [command, "sim", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_replays_a_share_of_jobs_as_elastic(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,600\n1000,1,600\n")
    done = dlsched_sim(
        str(trace), "--gpus", "2", "--policy", "fifo", "--elastic", "0.5:2", "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["elastic"] == {"share": 0.5, "max_factor": 2.0, "speedup": "linear"}
    assert out["rows"][0]["policy"] == "fifo (elastic)"
    # the second job is the elastic one (0.5 spread evenly): alone at 1000 s it runs on 2 GPUs
    rigid = dlsched_sim(str(trace), "--gpus", "2", "--policy", "fifo", "--json")
    assert out["rows"][0]["avg_jct"] < json.loads(rigid.stdout)["rows"][0]["avg_jct"]
    text = dlsched_sim(str(trace), "--gpus", "2", "--policy", "fifo", "--elastic", "1")
    assert "2 jobs elastic (1 GPU to 2 x request), speedup linear" in text.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--elastic", "2"], "dlsched sim: --elastic '2' is invalid"),
        (["--elastic", "1", "--speedup", "cubic"], "dlsched sim: speedup 'cubic' is not a model"),
        (["--elastic", "1", "--resize-every", "-1"], "dlsched sim: --resize-every -1 is invalid"),
    ],
)
def test_cli_bad_elastic_options_are_one_line_errors(tmp_path, args, message):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,10\n")
    done = dlsched_sim(str(trace), "--gpus", "1", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_an_elastic_job_grows_only_within_its_owners_gpu_limit_in_a_shared_pool():
    """A shared pool's ``max_gpus``: growing into idle GPUs never puts a user over it."""
    from jupyter_dlsched.agent.config import Limits, ServiceConfig
    from jupyter_dlsched.agent.limits import LimitsGate

    config = ServiceConfig(user_limits={"ana": Limits(max_gpus=3)})
    policy = ElasticPolicy(LimitsGate(get_policy("fifo"), config), resize_every=0)
    # starting alone on 8 idle GPUs: 3, the limit, not 4
    d = policy([queued("e", 0, top=4, owner="ana")], [], pool(8), 0.0)
    assert [len(s.placement.gpus) for s in d.starts] == [3]
    # running on 1 beside another of ana's jobs on 1: grows by one only
    e = elastic_running("e", (0,), started=0.0, top=4, owner="ana")
    other = RunningJob("r", 1, 0.0, 0.0, Request(gpus=1, cpus=0), on(1), owner="ana")
    d = policy([], [e, other], holding(pool(8), e.placement, other.placement), 400.0)
    assert [(r.job_id, len(r.placement.gpus)) for r in d.resizes] == [("e", 2)]
    # another user's elastic job is not held back by ana's limit
    bo = elastic_running("b", (2,), started=0.0, top=4, owner="bo")
    d = policy([], [e, other, bo], holding(pool(8), e.placement, other.placement, on(2)), 400.0)
    assert sorted((r.job_id, len(r.placement.gpus)) for r in d.resizes) == [("b", 4), ("e", 2)]

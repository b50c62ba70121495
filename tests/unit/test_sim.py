"""The trace-replay simulator: exact hand-calculated replays, loaders, metrics, CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_dlsched.policy import LasPolicy, SrtfPolicy, get_policy
from jupyter_dlsched.sim import (
    SimulationError,
    TraceError,
    TraceJob,
    compare,
    load_csv,
    load_philly,
    load_trace,
    simulate,
    summarize,
)

PHILLY = Path(__file__).parents[3] / "shared/traces/philly.csv"


def finishes(result) -> dict[str, float]:
    return {j.id: j.finish for j in result.jobs}


# strict FIFO, by hand
#
# 2 GPUs. a (1 GPU, 10 s) and b (2 GPUs, 5 s) arrive at 0, c (1 GPU, 2 s) at 1.
# a runs 0-10; b needs both GPUs, so it waits for a: 10-15; c is behind b: 15-17.
# JCT 10, 15, 16 (mean 41/3); queueing 0, 10, 14 (mean 8); makespan 17;
# busy GPU-seconds 10 + 2*5 + 2 = 22 of 2*17.
HOL = [TraceJob("a", 0, 1, 10.0), TraceJob("b", 0, 2, 5.0), TraceJob("c", 1, 1, 2.0)]


def test_strict_fifo_matches_the_hand_calculation():
    result = simulate(HOL, "fifo", gpus=2)
    assert finishes(result) == {"a": 10.0, "b": 15.0, "c": 17.0}
    row = summarize(result)
    assert row["avg_jct"] == pytest.approx(41 / 3)
    assert row["p50_jct"] == 15.0
    assert row["avg_queue"] == pytest.approx(8.0)
    assert row["makespan"] == 17.0
    assert row["utilisation"] == pytest.approx(22 / 34)
    assert row["preemptions_per_job"] == 0.0


def test_first_fit_fifo_lets_c_use_the_idle_gpu():
    # c fits on the GPU a leaves free: 1-3; b still starts at 10
    assert finishes(simulate(HOL, "fifo-ff", gpus=2)) == {"a": 10.0, "b": 15.0, "c": 3.0}


def test_fifo_with_equal_jobs_is_a_plain_queue():
    # 1 GPU, three 4-second jobs at 0, 1, 2: they end at 4, 8, 12; JCT 4, 7, 10
    jobs = [TraceJob(f"j{i}", float(i), 1, 4.0) for i in range(3)]
    row = summarize(simulate(jobs, "fifo", gpus=1))
    assert row["avg_jct"] == pytest.approx(7.0)
    assert row["p99_jct"] == pytest.approx(7 + 3 * 0.98)  # interpolated between 7 and 10


# preemptive shortest remaining time, by hand
#
# 1 GPU. a (10 s) at 0, b (3 s) at 2, c (1 s) at 3.
# 0-2 a; at 2 b (3 left) beats a (8 left); at 3 c (1) beats b (2 left);
# 3-4 c; 4-6 b; 6-14 a. JCT a 14, b 4, c 1; a and b were each preempted once.
SRTF = [TraceJob("a", 0, 1, 10.0), TraceJob("b", 2, 1, 3.0), TraceJob("c", 3, 1, 1.0)]


def test_preemptive_srtf_matches_the_hand_calculation():
    result = simulate(SRTF, "srtf", gpus=1, restart_overhead=0)
    assert finishes(result) == {"a": 14.0, "b": 6.0, "c": 4.0}
    assert {j.id: j.preemptions for j in result.jobs} == {"a": 1, "b": 1, "c": 0}
    row = summarize(result)
    assert row["avg_jct"] == pytest.approx(19 / 3)
    assert row["preemptions_per_job"] == pytest.approx(2 / 3)
    assert row["utilisation"] == 1.0


def test_restart_overhead_is_paid_on_every_restart():
    # as above, but each restart costs 1 s: b resumes 4-7 (2 + 1), a 7-16 (8 + 1)
    # (the policy ignores the cost, to show what the replay charges: SrtfPolicy(restart_cost=0))
    result = simulate(SRTF, SrtfPolicy(restart_cost=0.0), gpus=1, restart_overhead=1)
    assert finishes(result) == {"a": 16.0, "b": 7.0, "c": 4.0}


def test_srtf_ranks_by_remaining_gpu_time():
    # 2 GPUs. a (2 GPUs, 10 s, 20 GPU-s) at 0; b (1 GPU, 4 s) at 1 has less GPU-time
    # left (4 < 18): a is stopped, b runs 1-5 while one GPU idles, a runs again 5-14
    jobs = [TraceJob("a", 0, 2, 10.0), TraceJob("b", 1, 1, 4.0)]
    result = simulate(jobs, "srtf", gpus=2, restart_overhead=0)
    assert finishes(result) == {"a": 14.0, "b": 5.0}


def test_a_grace_period_keeps_the_victim_running_until_it_ends():
    # 1 GPU, grace 1 s: b arrives at 2, a is asked to stop and lets go at 3
    jobs = [TraceJob("a", 0, 1, 10.0), TraceJob("b", 2, 1, 3.0)]
    result = simulate(jobs, "srtf", gpus=1, restart_overhead=0, grace=1)
    assert finishes(result) == {"b": 6.0, "a": 13.0}


def test_las_wakes_itself_when_a_running_job_crosses_a_threshold():
    # 1 GPU, threshold 5 GPU-s. a (20 s) at 0, b (3 s) at 1: b waits (same level)
    # until a has had 5 s, then takes over 5-8; a finishes 8-23
    jobs = [TraceJob("a", 0, 1, 20.0), TraceJob("b", 1, 1, 3.0)]
    policy = LasPolicy(thresholds=(5.0,), min_run=0.0)
    result = simulate(jobs, policy, gpus=1, restart_overhead=0)
    assert finishes(result) == pytest.approx({"a": 23.0, "b": 8.0}, abs=1e-3)


def test_sjf_uses_time_limits_and_none_means_fifo():
    jobs = [TraceJob("long", 0, 1, 10.0), TraceJob("x", 0, 1, 8.0), TraceJob("y", 0, 1, 1.0)]
    assert finishes(simulate(jobs, "sjf", gpus=1, time_limits="exact"))["y"] == 1.0
    assert finishes(simulate(jobs, "sjf", gpus=1, time_limits=None))["y"] == 19.0


# nodes, determinism, errors


def test_nodes_keep_a_gang_on_one_node():
    jobs = [TraceJob("one", 0, 1, 10.0), TraceJob("two", 0, 2, 10.0)]
    result = simulate(jobs, "fifo", gpus=4, nodes=2)
    assert finishes(result) == {"one": 10.0, "two": 10.0}


def test_replays_are_deterministic():
    jobs = [TraceJob(f"j{i}", float(i % 7), 1 + i % 3, 5.0 + (i * 37) % 50) for i in range(60)]
    for policy in ("priority", "las", "gittins", "srtf", "fair"):
        first = simulate(jobs, policy, gpus=4)
        second = simulate(jobs, policy, gpus=4)
        assert first.jobs == second.jobs
        assert summarize(first) == summarize(second)


def test_a_job_larger_than_the_pool_is_refused_with_advice():
    with pytest.raises(SimulationError, match="max_gpus"):
        simulate([TraceJob("huge", 0, 8, 1.0)], "fifo", gpus=4)


def test_fairness_is_reported_only_when_owners_are_present():
    plain = [TraceJob("a", 0, 1, 1.0), TraceJob("b", 0, 1, 1.0)]
    owned = [TraceJob("a", 0, 1, 1.0, owner="ana"), TraceJob("b", 0, 1, 1.0, owner="bo")]
    assert summarize(simulate(plain, "fifo", gpus=1))["fairness"] is None
    # ana's job ran at once (1.0), bo's waited 1 s (0.5): Jain = 1.5^2 / (2 * 1.25)
    assert summarize(simulate(owned, "fifo", gpus=1))["fairness"] == pytest.approx(0.9)


# loaders


def test_csv_loader_reads_rows_with_or_without_a_header(tmp_path):
    bare = tmp_path / "bare.csv"
    bare.write_text("10,1,5\n0,2,7,ana,100\n")
    named = tmp_path / "named.csv"
    named.write_text("duration,submit_time,num_gpus\n5,10,1\n7,0,2\n")
    for path in (bare, named):
        jobs = load_csv(path)
        assert [(j.submit, j.gpus, j.duration) for j in jobs] == [(0.0, 2, 7.0), (10.0, 1, 5.0)]
    assert load_csv(bare)[0].owner == "ana" and load_csv(bare)[0].priority == 100


def test_csv_loader_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("0,1,5\n3,two,5\n")
    with pytest.raises(TraceError, match="line 2"):
        load_csv(path)


def test_philly_loader_sorts_and_filters(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:10,60.0,1,60.0,aa\n"
        "2017-10-02 00:00:00,30.0,2,60.0,aa\n"
        "2017-10-02 00:00:05,10.0,1,10.0,bb\n"
        "2017-10-03 00:00:00,10.0,16,160.0,aa\n"
    )
    jobs = load_trace(path, cluster="aa", max_gpus=8)
    assert [(j.id, j.submit, j.gpus, j.owner) for j in jobs] == [
        ("philly-2", 0.0, 2, "aa"),
        ("philly-1", 10.0, 1, "aa"),
    ]
    assert len(load_philly(path, end="2017-10-02 00:00:06")) == 2
    assert len(load_philly(path, sample=2, seed=1)) == 2
    assert load_philly(path, sample=2, seed=1) == load_philly(path, sample=2, seed=1)


@pytest.mark.skipif(not PHILLY.exists(), reason="the Philly trace is not next to the checkout")
def test_a_slice_of_the_real_philly_trace_replays_with_sane_figures():
    jobs = load_philly(PHILLY, cluster="ed69ec", sample=200, seed=7)
    assert len(jobs) == 200 and all(j.gpus == 1 for j in jobs)
    table = compare(jobs, ["fifo", "srtf"], gpus=2)
    fifo, srtf = table.rows
    assert fifo["jobs"] == srtf["jobs"] == 200
    assert srtf["avg_jct"] <= fifo["avg_jct"]
    assert 0 < fifo["utilisation"] <= 1


# report and CLI


def test_compare_keeps_policy_order_and_plots(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    jobs = [TraceJob(f"j{i}", float(i), 1, 3.0 + i) for i in range(8)]
    table = compare(jobs, ["srtf", "fifo", "las"], gpus=2)
    assert [row["policy"] for row in table.rows] == ["srtf (oracle)", "fifo", "las"]
    ax = table.plot_jct_cdf()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["srtf (oracle)", "fifo", "las"]
    assert ax.get_xscale() == "log"
    assert table.plot_utilisation().get_lines()
    assert "avg JCT s" in str(table).splitlines()[0]  # seconds-long jobs, in seconds


def dlsched_sim(*args: str) -> subprocess.CompletedProcess[str]:
    """``dlsched sim ARGS`` through the installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("dlsched")
    command = str(script) if script.exists() else shutil.which("dlsched")
    assert command, "the dlsched console script is not installed"
    return subprocess.run(
        [command, "sim", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_prints_one_row_per_policy(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,10\n0,2,5\n1,1,2\n")
    done = dlsched_sim(str(trace), "--gpus", "2", "--policy", "fifo,fifo-ff")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3 jobs on 2 GPUs, replayed in ")
    assert [line.split()[0] for line in lines[2:]] == ["fifo", "fifo-ff"]
    assert done.stderr == ""


def test_cli_json_is_machine_readable(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,10\n0,2,5\n1,1,2\n")
    done = dlsched_sim(str(trace), "--gpus", "2", "--policy", "fifo", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["rows"][0]["avg_jct"] == pytest.approx(41 / 3)
    assert (out["jobs"], out["gpus"], out["dropped"]) == (3, 2, [])


def test_cli_reports_a_bad_policy_without_a_traceback(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,10\n")
    done = dlsched_sim(str(trace), "--gpus", "1", "--policy", "fifo,lottery")
    assert done.returncode == 2
    assert done.stderr.startswith("dlsched sim: --policy 'lottery' is not a policy; choose from")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_cli_filters_a_philly_trace_and_credits_it(tmp_path):
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:00,3600.0,1,3600.0,aa\n"
        "2017-10-02 01:00:00,3600.0,2,7200.0,aa\n"
        "2017-10-02 00:30:00,60.0,1,60.0,bb\n"
        "2017-10-03 00:00:00,60.0,1,60.0,aa\n"
    )
    options = "--gpus 2 --policy fifo --cluster aa --start 2017-10-02 --end 2017-10-03 --json"
    done = dlsched_sim(str(trace), *options.split())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # the two aa jobs of 2 October run one after the other: JCT 1 h each
    assert out["jobs"] == 2 and out["rows"][0]["avg_jct"] == pytest.approx(3600.0)
    assert out["attribution"].startswith("Microsoft Philly traces")


def test_cli_saves_the_plot_where_asked(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,1,10\n0,2,5\n1,1,2\n")
    png = tmp_path / "sim.png"
    done = dlsched_sim(str(trace), "--gpus", "2", "--policy", "fifo,srtf", "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_replays_free_gpu_count_is_recounted_for_other_gpus():
    from dataclasses import replace

    from jupyter_dlsched.sim.gpus import _PoolCapacity
    from jupyter_dlsched.vocab.resources import GpuFree

    gpus = (GpuFree(0, 1, 1), GpuFree(1, 1, 0, jobs=1))
    capacity = _PoolCapacity(gpus, (), 0, 0, gpus, 1)
    assert capacity.free_whole_gpus == 1
    held = replace(capacity, gpus=(GpuFree(0, 1, 0, jobs=1), gpus[1]))
    assert held.free_whole_gpus == 0


def test_the_utilisation_plot_averages_busy_gpus_over_equal_spans():
    from jupyter_dlsched.sim.report import _binned

    # 2 GPUs busy from 1 to 3 s, in four 1-second spans
    assert _binned([(0.0, 0), (1.0, 2), (3.0, 0)], 4.0, 4) == [0.0, 2.0, 2.0, 0.0]


# shares of a GPU, placed by the live placement code
#
# 1 GPU. a and b use half a GPU for 10 s each, c the whole GPU for 10 s, all at 0.
# a and b share the GPU 0-10; c waits for it to be empty: 10-20.


def test_two_half_gpu_jobs_share_one_gpu_and_a_whole_job_waits_for_both():
    trace = [
        TraceJob("a", 0, 0.5, 10.0),
        TraceJob("b", 0, 0.5, 10.0),
        TraceJob("c", 0, 1, 10.0),
    ]
    result = simulate(trace, "fifo", gpus=1)
    assert finishes(result) == {"a": 10.0, "b": 10.0, "c": 20.0}
    assert summarize(result)["utilisation"] == pytest.approx(1.0)  # 0.5*10*2 + 10 of 1*20


def test_shares_that_do_not_fit_together_wait_for_each_other():
    trace = [TraceJob("a", 0, 0.7, 10.0), TraceJob("b", 0, 0.5, 10.0)]
    assert finishes(simulate(trace, "fifo", gpus=1)) == {"a": 10.0, "b": 20.0}


def test_a_gpu_milli_column_is_a_share_of_one_gpu(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text("submit_time,num_gpus,duration,gpu_milli,name\n0,1,10,500,a\n0,1,10,500,b\n")
    jobs = load_csv(path)
    assert [(j.gpus, j.name) for j in jobs] == [(0.5, "a"), (0.5, "b")]
    assert sorted(finishes(simulate(jobs, "fifo", gpus=1)).values()) == [10.0, 10.0]


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("0,2.7,10", "num_gpus='2.7' is invalid"),
        ("0,2.7,10", "write 3 if it held 3 GPUs"),
        ("0,0,10", "num_gpus='0' is invalid"),
    ],
)
def test_a_gpu_count_that_is_neither_a_share_nor_whole_is_refused_never_truncated(
    tmp_path, row, fragment
):
    path = tmp_path / "t.csv"
    path.write_text(f"0,1,10\n{row}\n")
    with pytest.raises(TraceError, match="line 2") as caught:
        load_csv(path)
    assert fragment in str(caught.value)


def test_a_share_of_several_gpus_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text("submit_time,num_gpus,duration,gpu_milli\n0,2,10,500\n")
    with pytest.raises(TraceError, match="line 2: gpu_milli='500' with num_gpus=2"):
        load_csv(path)


def test_a_trace_job_takes_a_share_but_not_a_part_of_several_gpus():
    assert TraceJob("s", 0, 0.25, 4.0).gpu_time == 1.0
    with pytest.raises(TraceError, match="gpus=2.7 is invalid"):
        TraceJob("t", 0, 2.7, 4.0)


# metrics: every wait, useful work, units that fit


def test_queueing_counts_the_wait_after_a_preemption():
    # srtf at 1: a (20 GPU-s) takes r's GPU; r waits 1-11 and ends at 110
    trace = [TraceJob("r", 0, 1, 100.0), TraceJob("a", 1, 2, 10.0), TraceJob("b", 1, 1, 50.0)]
    result = simulate(trace, "srtf", gpus=2, restart_overhead=0)
    r = next(j for j in result.jobs if j.id == "r")
    assert (r.first_wait, r.queueing_delay, r.preemptions) == (0.0, 10.0, 1)


def test_utilisation_leaves_restart_overhead_out():
    trace = [TraceJob("r", 0, 1, 100.0), TraceJob("a", 1, 2, 10.0), TraceJob("b", 1, 1, 50.0)]
    result = simulate(trace, "srtf", gpus=2, restart_overhead=5)
    row = summarize(result)
    work = 100.0 + 20.0 + 50.0
    assert result.busy_gpu_seconds == pytest.approx(work + 5.0)  # r paid 5 s on restart
    assert row["utilisation"] == pytest.approx(work / (2 * row["makespan"]))


def test_the_table_shows_short_traces_in_seconds_and_long_ones_in_hours():
    short = compare([TraceJob("a", 0, 1, 30.0)], ["fifo"], gpus=1)
    long = compare([TraceJob("a", 0, 1, 36000.0)], ["fifo"], gpus=1)
    assert str(short).splitlines()[0].split()[1:4] == ["avg", "JCT", "s"]
    assert "30.00" in str(short)
    assert "avg JCT h" in str(long) and "10.00" in str(long)


def test_rows_say_when_a_policy_read_what_only_a_replay_knows():
    trace = [TraceJob("a", 0, 1, 30.0), TraceJob("b", 0, 1, 10.0)]
    labels = [r["policy"] for r in compare(trace, ["sjf", "srtf", "las"], gpus=1).rows]
    assert labels == ["sjf", "srtf (oracle)", "las"]  # by default no job declares a limit
    exact = compare(trace, ["sjf", "priority"], gpus=1, time_limits="exact").rows
    assert [r["policy"] for r in exact] == ["sjf (oracle)", "priority (oracle)"]
    guessed = compare(trace, ["sjf"], gpus=1, time_limits=2.0).rows
    assert guessed[0]["policy"] == "sjf"


# the kept rank index (simulator's fast path) decides exactly as ranking every job afresh


class _RankedAfresh:
    """A policy shown its running jobs as a plain list: no kept index, every rank recomputed."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("inner", "running_ranks"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, queued, running, capacity, now):
        return self.inner(queued, list(running), capacity, now)


_job = st.tuples(
    st.integers(0, 400),  # submit
    st.sampled_from([1, 1, 1, 2, 4]),  # GPUs
    st.integers(1, 900),  # duration
    st.sampled_from(["ana", "bo"]),  # owner: gittins learns per owner
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(_job, min_size=1, max_size=40),
    name=st.sampled_from(["las", "srtf", "gittins"]),
    gpus=st.sampled_from([4, 8]),
    nodes=st.sampled_from([1, 2]),
    grace=st.sampled_from([0.0, 20.0]),
)
def test_the_kept_rank_index_makes_the_same_decisions_as_ranking_afresh(
    rows, name, gpus, nodes, grace
):
    trace = [TraceJob(f"j{i}", s, g, float(d), o) for i, (s, g, d, o) in enumerate(rows)]
    params = {
        # no minimum run time: its wake-ups are asked only where a plan needs them
        "las": {"thresholds": (300.0, 1200.0), "min_run": 0.0},  # crossed within these jobs
        "srtf": {},
        # learns and re-ranks often
        "gittins": {"group_min": 3, "quantum": 30.0, "window": 8, "min_run": 0.0},
    }[name]
    options = {"nodes": nodes, "grace": grace, "restart_overhead": 5.0}
    fast = simulate(trace, get_policy(name, **params), gpus, **options)
    afresh = simulate(trace, _RankedAfresh(get_policy(name, **params)), gpus, **options)
    assert fast.jobs == afresh.jobs
    assert fast.policy_calls == afresh.policy_calls
    assert fast.timeline == afresh.timeline


# at 77, j3 (80 s long) ranks below j5 and j4; j3 of 77.5 s ranks above them, so no
# running job would be stopped for them and the kept index once went to first fit
@pytest.mark.parametrize("j3_duration", [80.0, 77.5])
def test_a_job_is_not_started_where_a_stopping_job_makes_room_for_a_better_one(j3_duration):
    # at 77 two GPUs are free and j0 is still stopping: j5 (1 GPU) starts, and j4 (2 GPUs)
    # is planned on the other free GPU and j0's. Before, ranking afresh (and the kept
    # index, when no running job ranked below j5) started j2 there, only to stop it again
    rows = [(0, 1, 109), (0, 1, 121), (0, 1, 117), (0, 1, j3_duration), (57, 2, 1), (60, 1, 1)]
    trace = [TraceJob(f"j{i}", s, g, float(d), "ana") for i, (s, g, d) in enumerate(rows)]
    options = {"nodes": 1, "grace": 20.0, "restart_overhead": 5.0}
    fast = simulate(trace, get_policy("srtf"), 4, **options)
    afresh = simulate(trace, _RankedAfresh(get_policy("srtf")), 4, **options)
    assert fast.jobs == afresh.jobs
    assert {j.id: j.preemptions for j in fast.jobs}["j2"] == 1  # only for j4, at 57


def test_a_replay_keeps_ranks_only_for_policies_that_offer_them():
    trace = [TraceJob("a", 0, 1, 4000.0), TraceJob("b", 10, 1, 50.0)]
    seen = []

    class Spy(LasPolicy):
        def __call__(self, queued, running, capacity, now):
            seen.append(getattr(running, "ranks", None))
            return super().__call__(queued, running, capacity, now)

    simulate(trace, Spy(thresholds=(100.0,)), gpus=1)
    assert seen and all(r is not None and r.policy is not None for r in seen)
    seen.clear()
    simulate(trace, Spy(thresholds=(100.0,), promote_after=3600.0), gpus=1)
    assert seen and all(r is None for r in seen)  # the starvation guard plans without an index


def test_a_job_started_while_others_wait_is_woken_for_when_it_may_be_stopped():
    # j1 starts at 1031.6 while j3 waits; it may be stopped once its 203.3 s minimum run
    # ends, at 1234.9, and is. Before, nothing asked the policy again then: the index
    # path stopped it only at its next event (1359.6), ranking afresh by luck.
    rows = [(370, 4, 735), (102, 4, 701), (53, 2, 267), (297, 4, 505)]
    trace = [TraceJob(f"j{i}", s, g, float(d), "ana") for i, (s, g, d) in enumerate(rows)]
    params = {"thresholds": (300.0, 1200.0), "min_run": 203.3}
    fast = simulate(trace, get_policy("las", **params), 4, restart_overhead=5.0)
    afresh = simulate(trace, _RankedAfresh(get_policy("las", **params)), 4, restart_overhead=5.0)
    assert fast.jobs == afresh.jobs
    assert {j.id: j.finish for j in fast.jobs}["j3"] == pytest.approx(1541.6, abs=1e-3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(_job, min_size=1, max_size=40),
    name=st.sampled_from(["las", "srtf", "gittins"]),
    gpus=st.sampled_from([4, 8]),
    min_run=st.sampled_from([31.7, 203.3]),
)
def test_the_kept_rank_index_keeps_the_minimum_run_time_as_ranking_afresh(
    rows, name, gpus, min_run
):
    # minimum run times chosen not to end exactly where a rank boundary is crossed,
    # which the index wakes a hair after
    trace = [TraceJob(f"j{i}", s, g, float(d), o) for i, (s, g, d, o) in enumerate(rows)]
    params = {
        "las": {"thresholds": (300.0, 1200.0)},
        "srtf": {},
        "gittins": {"group_min": 3, "quantum": 30.0, "window": 8},
    }[name]
    params["min_run"] = min_run
    fast = simulate(trace, get_policy(name, **params), gpus, restart_overhead=5.0)
    afresh = simulate(trace, _RankedAfresh(get_policy(name, **params)), gpus, restart_overhead=5.0)
    # the same decisions; times may differ in their last bits (sums taken in another order)
    assert [(j.id, j.preemptions) for j in fast.jobs] == [
        (j.id, j.preemptions) for j in afresh.jobs
    ]
    for a, b in zip(fast.jobs, afresh.jobs, strict=True):
        assert (a.first_start, a.finish, a.held) == (
            pytest.approx(b.first_start),
            pytest.approx(b.finish),
            pytest.approx(b.held),
        )


@pytest.mark.skipif(not PHILLY.exists(), reason="the Philly trace is not next to the checkout")
def test_the_priority_against_fifo_script_marks_the_slices_above_fifo(tmp_path):
    script = Path(__file__).parents[2] / "benchmarks" / "priority_vs_fifo.py"
    out = tmp_path / "out.json"
    run = subprocess.run(
        [sys.executable, str(script), "--trace", str(PHILLY), "--slice", "e13805/48"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())["e13805/48"]
    fifo, ff = figures["fifo"], figures["fifo-ff"]
    assert figures["priority, learn_sizes=False"] == fifo  # no time limits: fifo exactly
    assert ff[0] > fifo[0]  # first fit is above fifo in average on this slice
    row = next(line for line in run.stdout.splitlines() if line.startswith("| e13805/48 |"))
    assert row.endswith(f"| {ff[0]:.2f} / {ff[1]:.1f} A |")
    assert "above fifo, fifo-ff: 1 of 1 (e13805/48 A)" in run.stdout
    assert "above fifo, priority, learn_sizes=False: 0 of 1 (none)" in run.stdout

"""Start-time estimates: the forecast on plain data, on a live queue, and scored in replays."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.forecast.replay import RunTimes
from jupyter_dlsched.forecast.replay import forecast as bounded_forecast
from jupyter_dlsched.policy import QueuedJob, RunningJob, get_policy
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request
from jupyter_dlsched.widgets import dashboard

DLSCHED = str(Path(sys.executable).with_name("dlsched"))
GIB = 2**30
ONE = Request(gpus=1, cpus=0)


def forecast(*args: Any, **options: Any) -> Any:
    """The forecast without its time budget: these tests check what it says, not how fast
    (with the budget a loaded machine would leave jobs unestimated)."""
    return bounded_forecast(*args, budget_s=math.inf, **options)


def pool(n: int, *held: RunningJob) -> Capacity:
    capacity = Capacity.empty(n, 16 * GIB, 4, 64 * GIB)
    for job in held:
        capacity = capacity.take(job.placement)
    return capacity


def running(job_id: str, gpu: int, started: float, name: str = "step") -> RunningJob:
    placement = Placement(gpus=(gpu,), gpu_mem=(16 * GIB,))
    return RunningJob(job_id, gpu, 0.0, started, ONE, placement, owner="ana", name=name)


def waiting(job_id: str, seq: int, name: str = "", time_limit: float | None = None) -> QueuedJob:
    return QueuedJob(job_id, seq, float(seq), ONE, owner="ana", name=name, time_limit=time_limit)


def learnt(*runs: tuple[str, float]) -> RunTimes:
    times = RunTimes()
    times.learn([("ana", name, 1, seconds) for name, seconds in runs])
    return times


# -- the forecast on plain data --------------------------------------------------------------


def test_jobs_in_line_start_one_run_time_after_another():
    times = learnt(*[("step", 10.0)] * 3)
    step = running("s", 0, started=100.0)
    queue = [waiting(f"w{i}", 10 + i, name="step") for i in range(3)]
    made = forecast(get_policy("fifo"), queue, [step], pool(1, step), 104.0, times)
    assert [made.estimates[f"w{i}"].expected for i in range(3)] == [110.0, 120.0, 130.0]
    assert made.refresh_at == 110.0  # when the running step should end


def test_a_running_job_that_outlived_its_runs_is_not_assumed_to_end_now():
    times = learnt(("step", 3.0), ("step", 3.0), ("step", 5.0), ("step", 40.0))
    step = running("s", 0, started=100.0)
    made = forecast(get_policy("fifo"), [waiting("w", 10)], [step], pool(1, step), 110.0, times)
    # 10 s in, only the 40 s run is longer: that is the estimate of its end
    assert made.estimates["w"].expected == 140.0
    made = forecast(get_policy("fifo"), [waiting("w", 10)], [step], pool(1, step), 150.0, times)
    # past every run seen: a heavy tail, the median end is twice its age
    assert made.estimates["w"].expected == pytest.approx(200.0)
    assert made.estimates["w"].p80 == pytest.approx(350.0)


def test_a_time_limit_caps_the_assumed_run_time():
    times = learnt(*[("step", 100.0)] * 3)
    queue = [waiting("first", 1, name="step", time_limit=20.0), waiting("second", 2)]
    made = forecast(get_policy("fifo"), queue, [], pool(1), 0.0, times)
    assert made.estimates["first"].expected == 0.0
    assert made.estimates["second"].expected == 20.0


def test_without_any_finished_job_or_time_limit_nothing_is_estimated():
    step = running("s", 0, started=0.0)
    made = forecast(get_policy("fifo"), [waiting("w", 5)], [step], pool(1, step), 1.0, RunTimes())
    assert made.estimates == {}


def test_the_p80_bound_is_never_before_the_expected_start():
    rng = random.Random(7)
    times = RunTimes()
    times.learn([("ana", "", rng.choice([1, 2]), rng.lognormvariate(4, 1.5)) for _ in range(50)])
    for policy in ("fifo", "fifo-ff", "priority", "sjf", "las", "gittins", "fair"):
        held = [running(f"r{g}", g, started=-rng.uniform(0, 300), name="") for g in range(2)]
        queue = [
            QueuedJob(
                f"w{i}", 10 + i, float(i), Request(gpus=rng.choice([1, 2]), cpus=0), owner="ana"
            )
            for i in range(30)
        ]
        made = forecast(get_policy(policy), queue, held, pool(3, *held), 0.0, times)
        assert len(made.estimates) == 30, policy
        for estimate in made.estimates.values():
            assert estimate.p80 >= estimate.expected >= 0.0, policy


def test_a_deep_queue_is_forecast_only_as_far_as_the_bound():
    times = learnt(*[("step", 10.0)] * 3)
    step = running("s", 0, started=0.0)
    queue = [waiting(f"w{i}", 10 + i, name="step") for i in range(10_000)]
    made = forecast(get_policy("fifo"), queue, [step], pool(1, step), 0.0, times, max_jobs=50)
    assert made.simulated == 50
    assert set(made.estimates) == {f"w{i}" for i in range(50)}


# -- a live queue ---------------------------------------------------------------------------


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_job_behind_a_running_step_expects_it_to_take_as_long_as_the_last_steps(
    home, monkeypatch
):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    with Scheduler(home) as s:
        steps = [s.submit(nap, 3.0, gpus=1, name="step") for _ in range(3)]
        for step in steps:
            step.result(timeout=120)
        # how long the ledger says each ran (a nap of 3 s, plus its process's start and
        # end, which a loaded machine stretches)
        ran = [(i := s.get(step.id).info()).finished - i.started for step in steps]
        fourth = s.submit(nap, 3.0, gpus=1, name="step")
        behind = s.submit(nap, 0.1, gpus=1, name="after")
        info = wait_for(
            lambda: (i := s.get(behind.id).info()).expected_start is not None and i,
            timeout=30,
            what=lambda: s.get(behind.id).info(),
        )
        started = s.get(fourth.id).info().started
        assert started is not None
        # the notebook dashboard says it in words, as the CLI and the sidebar do
        board = dashboard(s, live=False)
        if board.rows[behind.id].state == "queued":
            assert "starts in" in board.rows[behind.id].texts["progress"]
        # it waits for the fourth step, which should run about as long as the three before
        assert started + min(ran) - 0.5 <= info.expected_start <= started + max(ran) + 0.5
        assert info.start_p80 is not None and info.start_p80 >= info.expected_start
        listed = subprocess.run(
            [DLSCHED, "queue", "--json"], capture_output=True, text=True, timeout=60, check=True
        )
        # (not listed once it ended: a loaded machine may get there before the command)
        row = next((j for j in json.loads(listed.stdout) if j["id"] == behind.id), None)
        if row is None:
            assert s.get(behind.id).info().finished is not None, listed.stdout
        elif row["state"] == "queued":
            assert row["expected_start"] == pytest.approx(info.expected_start, abs=1.5)
            assert row["start_p80"] >= row["expected_start"]
            table = subprocess.run(
                [DLSCHED, "queue"], capture_output=True, text=True, timeout=60, check=True
            )
            lines = [ln for ln in table.stdout.splitlines() if behind.id in ln]
            if lines and "running" not in lines[0]:
                assert "starts in" in lines[0]
            else:  # the queue moved on between the two commands (a loaded machine)
                assert s.get(behind.id).info().started is not None, table.stdout
        behind.result(timeout=60)


# -- calibration in replays -----------------------------------------------------------------


def synthetic_trace(n: int = 300, seed: int = 3) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 30)
        jobs.append(TraceJob(f"j{i}", t, rng.choice([1, 1, 1, 2]), rng.lognormvariate(4, 0.8)))
    return jobs


def test_replays_score_the_estimates_made_at_submission():
    jobs = synthetic_trace()
    for policy in ("fifo", "las"):
        result = simulate(jobs, policy, 4, estimates=True)
        eta = result.eta
        assert eta is not None
        # every job but the very first (nothing had finished) got an estimate
        assert eta.jobs + eta.without == len(jobs) and eta.jobs >= len(jobs) - 10
        hits = sum(
            o.first_start <= eta.estimates[o.id].p80 + 1e-6
            for o in result.jobs
            if o.id in eta.estimates
        )
        assert eta.hit == hits / eta.jobs
        assert eta.hit >= 0.8, (policy, eta.hit)


def test_identical_jobs_in_a_fifo_line_start_exactly_when_estimated():
    # three finish alone (run times to learn from), then a burst queues up behind one GPU
    jobs = [TraceJob(f"a{i}", 150.0 * i, 1, 100.0) for i in range(3)]
    jobs += [TraceJob(f"b{i}", 500.0 + i, 1, 100.0) for i in range(17)]
    eta = simulate(jobs, "fifo", 1, estimates=True).eta
    assert eta is not None and (eta.jobs, eta.without) == (19, 1)
    assert eta.hit == 1.0 and eta.median_error == 0.0
    assert eta.estimates["b16"].expected == 500.0 + 16 * 100.0


PHILLY = Path(__file__).parents[3] / "shared/traces/philly.csv"


@pytest.mark.skipif(not PHILLY.exists(), reason="the Philly trace is not next to the checkout")
def test_on_a_philly_sample_most_jobs_start_by_their_p80_estimate():
    from jupyter_dlsched.sim import load_philly

    jobs = load_philly(PHILLY, cluster="103959", max_gpus=8, sample=300, seed=7)
    for policy in ("fifo", "priority", "las"):
        eta = simulate(jobs, policy, 8, estimates=True).eta
        assert eta is not None and eta.jobs >= 290
        assert eta.hit >= 0.8, (policy, eta.hit)


def test_dlsched_sim_reports_the_share_started_by_the_p80_estimate(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "submit_time,num_gpus,duration\n"
        + "".join(f"{j.submit},{j.gpus},{j.duration}\n" for j in synthetic_trace(120))
    )
    out = subprocess.run(
        [DLSCHED, "sim", str(trace), "--gpus", "2", "--policy", "fifo,las", "--eta"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    header = out.stdout.splitlines()[1]
    assert "start<=P80" in header and "ETA err" in header
    as_json = subprocess.run(
        [DLSCHED, "sim", str(trace), "--gpus", "2", "--policy", "fifo", "--eta", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    row = json.loads(as_json.stdout)["rows"][0]
    assert 0.0 <= row["eta_p80_hit"] <= 1.0 and row["eta_jobs"] > 100
    plain = json.loads(
        subprocess.run(
            [DLSCHED, "sim", str(trace), "--gpus", "2", "--policy", "fifo", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    )
    assert "eta_p80_hit" not in plain["rows"][0]  # only asked for, it costs a forecast per job


# -- the forecast's own schedule ------------------------------------------------------------


def test_decisions_in_quick_succession_forecast_once_and_the_latest_is_forecast_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain of short jobs decides every few milliseconds: the start-time forecast (most
    of such a decision's time) runs at most every ``FORECAST_EVERY`` seconds, and the
    latest decision's forecast is not lost but made at a tick after that."""
    from jupyter_dlsched.agent.service import Agent
    from jupyter_dlsched.engine import core

    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    agent = Agent(tmp_path / "home")
    agent.open()
    engine = agent.sched
    assert engine is not None
    s = Scheduler.of_engine(engine)
    try:
        running = s.submit_command(["sleep", "600"], gpus=1, time_limit=60)
        s.tick(now=time.time())
        first = s.submit_command(["true"], gpus=1, time_limit=30)
        s.tick(now=time.time())  # a tick at a given moment (a test's, a replay's): at once
        began = s.info(running.id).started
        assert began is not None
        assert s.info(first.id).expected_start == pytest.approx(began + 60, abs=2)

        monkeypatch.setattr(core, "FORECAST_EVERY", 3600.0)
        second = s.submit_command(["true"], gpus=1, time_limit=30)
        decided = s.tick()
        assert decided is not None and decided.placed  # decided on, placed in line ...
        assert s.info(second.id).position == 2
        assert s.info(second.id).expected_start is None  # ... its forecast waits

        monkeypatch.setattr(core, "FORECAST_EVERY", 0.0)
        assert s.tick() is None  # nothing new to decide on; the forecast waiting is made
        assert s.info(second.id).expected_start == pytest.approx(began + 90, abs=2)
    finally:
        for job in s.jobs(state=["queued", "running"]):
            s.cancel(job.id)
        agent.close()

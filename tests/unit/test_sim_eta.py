"""Scoring start estimates in replays: hit rate and sharpness on traces worked out by hand."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.forecast import replay as forecast_replay
from jupyter_dlsched.policy import base as policy_base
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.sim import engine as sim_engine
from jupyter_dlsched.sim.eta import StartCalibration

DLSCHED = str(Path(sys.executable).with_name("dlsched"))

# One GPU, fifo. a0 runs 100 s alone, so every forecast assumes 100 s; then a burst of
# five where b1 runs 300 s, so the three behind it start 200 s later than expected.
#   job  submitted  expected  started  |error|  wait
#   b0   500        500       500        0        0
#   b1   501        600       600        0       99
#   b2   502        700       900      200      398
#   b3   503        800      1000      200      497
#   b4   504        900      1100      200      596
# median error 200 s; average wait 1590 / 5 = 318 s; sharpness 200 / 318.
BURST = [TraceJob("a0", 0.0, 1, 100.0)] + [
    TraceJob(f"b{i}", 500.0 + i, 1, 300.0 if i == 1 else 100.0) for i in range(5)
]


def test_sharpness_is_the_median_error_as_a_share_of_the_average_wait():
    eta = simulate(BURST, "fifo", 1, restart_overhead=0, estimates=True).eta
    assert eta is not None and (eta.jobs, eta.without) == (5, 1)
    assert [eta.estimates[f"b{i}"].expected for i in range(5)] == [500, 600, 700, 800, 900]
    assert eta.median_error == 200.0
    assert eta.sharpness == pytest.approx(200.0 / 318.0)


def test_an_exact_estimate_on_a_queue_that_never_waits_is_perfectly_sharp():
    jobs = [TraceJob(f"j{i}", 200.0 * i, 1, 100.0) for i in range(4)]
    eta = simulate(jobs, "fifo", 1, restart_overhead=0, estimates=True).eta
    assert eta is not None and eta.median_error == 0.0 and eta.sharpness == 0.0


def test_dlsched_sim_eta_shows_the_sharpness_in_the_table_and_in_json(tmp_path: Path) -> None:
    trace = tmp_path / "burst.csv"
    trace.write_text(
        "submit_time,num_gpus,duration\n"
        + "".join(f"{j.submit},{j.gpus},{j.duration}\n" for j in BURST)
    )
    command = [DLSCHED, "sim", str(trace), "--gpus", "1", "--policy", "fifo", "--eta"]
    command += ["--restart-overhead", "0"]
    table = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    header, row = table.stdout.splitlines()[1:3]
    assert "ETA err/wait" in header and "0.63" in row.split(), table.stdout
    as_json = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(as_json.stdout)["rows"][0]
    assert figures["eta_sharpness"] == pytest.approx(200.0 / 318.0)
    assert figures["eta_p80_hit"] == pytest.approx(0.4)


def test_an_estimate_too_spread_to_promise_is_scored_apart_as_uncertain():
    # a1 runs 1000 s where a0 ran 10 s; when b arrives a1 has run 180 s, more than any
    # run seen, so the forecast takes a heavy tail: a1 ends at 20 + 2 x 180 = 380 s
    # (median), by 20 + 5 x 180 = 920 s (P80). A P80 wait of 720 s against 180 s
    # expected is more than UNCERTAIN_SPREAD apart: users are told "start uncertain".
    # b starts at 1020 s: the P80 would have been wrong.
    jobs = [TraceJob("a0", 0.0, 1, 10.0), TraceJob("a1", 20.0, 1, 1000.0)]
    jobs.append(TraceJob("b", 200.0, 1, 10.0))
    eta = simulate(jobs, "fifo", 1, restart_overhead=0, estimates=True).eta
    assert eta is not None
    assert eta.estimates["b"].expected == 380.0 and eta.estimates["b"].p80 == pytest.approx(920.0)
    assert eta.hit == 0.5 and eta.median_error == pytest.approx(640.0)
    assert eta.sharpness == pytest.approx(640.0 / 410.0)
    # the one number given (a1: "starts now") held, exactly
    assert eta.uncertain == 0.5 and eta.given_hit == 1.0 and eta.given_sharpness == 0.0


class _FromScratch(StartCalibration):
    """Every forecast from nothing kept: fresh run times (no estimated jobs carried over
    from the last arrival) and no placements found for an earlier decision."""

    def submitted(self, *args: Any) -> None:
        learnt = self.run_times
        self.run_times = copy.deepcopy(learnt)
        self.run_times.estimated.clear()
        policy_base._last_tried = (None, {})
        try:
            super().submitted(*args)
        finally:
            self.run_times = learnt


def _random_trace(seed: int) -> list[TraceJob]:
    """Bursts of jobs on a small pool: deep queues, preemptions, learnt run times."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(40):
        t += rng.choice([0.0, 1.0, 30.0, 600.0])
        jobs.append(
            TraceJob(
                f"j{i}",
                t,
                rng.choice([1, 1, 1, 2, 4, 0.5]),
                round(rng.lognormvariate(5, 1.5), 1),
                owner=rng.choice(["ana", "bob"]),
                priority=rng.choice([50, 50, 80]),
                name=rng.choice(["", "train"]),
            )
        )
    return jobs


@pytest.mark.parametrize("ahead_limit", [None, 1800.0])
@pytest.mark.parametrize("policy", ["fifo", "fifo-ff", "priority", "sjf", "las", "gittins", "srtf"])
def test_estimates_kept_between_arrivals_are_those_a_forecast_from_scratch_gives(
    policy: str, ahead_limit: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a replay's forecasts reuse what the last arrival's forecast made; not one estimate
    # may differ from a forecast that starts from nothing at every arrival, also where
    # jobs too deep in line are given as uncertain (a limit the random queues reach)
    if ahead_limit is not None:
        monkeypatch.setattr(forecast_replay, "AHEAD_LIMIT", ahead_limit)
    deep = 0
    for seed in range(6):
        jobs = _random_trace(seed)
        kept = simulate(jobs, policy, 4, restart_overhead=30, estimates=True)
        with monkeypatch.context() as patched:
            patched.setattr(sim_engine, "StartCalibration", _FromScratch)
            scratch = simulate(jobs, policy, 4, restart_overhead=30, estimates=True)
        assert kept.eta is not None and scratch.eta is not None
        assert len(kept.eta.estimates) > 20
        assert kept.eta.estimates == scratch.eta.estimates, seed
        assert [j.finish for j in kept.jobs] == [j.finish for j in scratch.jobs], seed
        deep += sum(e.expected is None for e in kept.eta.estimates.values())
    assert (deep > 0) == (ahead_limit is not None)


@pytest.mark.parametrize("policy", ["las", "gittins", "srtf"])
def test_a_forecast_over_running_jobs_kept_by_rank_makes_the_estimates_of_ranking_afresh(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a preemptive policy's forecast keeps the running jobs in the policy's rank index, as
    # the simulator does, instead of ranking every one of them at every step: not one
    # estimate may differ from a forecast that ranks them afresh
    kept_used = 0
    made = forecast_replay._ranks_for

    def counted(*args: Any) -> Any:
        nonlocal kept_used
        ranks = made(*args)
        kept_used += ranks is not None
        return ranks

    for seed in range(6):
        jobs = [
            replace(job, gpus=max(1, round(job.gpus))) for job in _random_trace(seed)
        ]  # whole GPUs only: where the index is kept
        with monkeypatch.context() as patched:
            patched.setattr(forecast_replay, "_ranks_for", counted)
            kept = simulate(jobs, policy, 4, restart_overhead=30, estimates=True)
        with monkeypatch.context() as patched:
            patched.setattr(forecast_replay, "_ranks_for", lambda *args: None)
            afresh = simulate(jobs, policy, 4, restart_overhead=30, estimates=True)
        assert kept.eta is not None and afresh.eta is not None
        assert len(kept.eta.estimates) > 20
        assert kept.eta.estimates == afresh.eta.estimates, seed
        assert [j.finish for j in kept.jobs] == [j.finish for j in afresh.jobs], seed
    assert kept_used > 0

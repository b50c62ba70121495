"""A job too deep in line is told its start is uncertain, with the work ahead of it, and the
forecast does not simulate the queue ahead of it: its cost stops growing with the depth."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jupyter_dlsched.forecast import replay
from jupyter_dlsched.forecast.replay import AHEAD_LIMIT, RunTimes, StartEstimate, forecast
from jupyter_dlsched.policy import QueuedJob, RunningJob, get_policy
from jupyter_dlsched.sim import TraceJob, simulate
from jupyter_dlsched.sim import eta as sim_eta
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request
from jupyter_dlsched.vocab.words import about, start_phrase

HOUR = 3600.0
ONE = Request(gpus=1, cpus=0)
NOW = 1000.0
#: jobs in line whose work ahead is within the limit: job k has k hours ahead of it
WITHIN = int(AHEAD_LIMIT // HOUR) + 1
DEPTH = WITHIN + 100


def _deep_queue(depth: int) -> tuple[list[QueuedJob], list[RunningJob], Capacity, RunTimes]:
    """One GPU, busy for an hour from ``NOW``; ``depth`` one-GPU jobs waiting, each learnt to
    run an hour (median and P80 alike)."""
    times = RunTimes()
    times.learn([("ana", "step", 1, HOUR)] * 3)
    held = Placement(gpus=(0,), gpu_mem=(2**30,))
    running = [RunningJob("r", 0, NOW, NOW, ONE, held, owner="ana", name="step")]
    pool = Capacity.empty(1, 2**30, 1, 2**30).take(held)
    line = [QueuedJob(f"w{i}", i + 1, NOW, ONE, owner="ana", name="step") for i in range(depth)]
    return line, running, pool, times


def test_a_job_with_more_work_ahead_than_the_limit_is_uncertain_and_costs_no_policy_call():
    line, running, pool, times = _deep_queue(DEPTH)
    last = line[-1].id
    made = forecast(
        get_policy("fifo"),
        line,
        running,
        pool,
        NOW,
        times,
        targets=[last],
        max_jobs=len(line),
        max_calls=100 * len(line),
        budget_s=math.inf,
    )
    # DEPTH - 1 one-hour jobs ahead on one GPU: no forecast, the work ahead as the figure
    ahead = (DEPTH - 1) * HOUR
    assert made.estimates == {last: StartEstimate(None, NOW + ahead)}
    assert made.calls == 0 and made.beyond == 1
    assert start_phrase(None, NOW + ahead, NOW) == (
        f"start uncertain: the queue ahead may take {about(ahead)}"
    )


def test_the_live_forecast_keeps_every_number_within_the_limit_and_stops_there():
    line, running, pool, times = _deep_queue(DEPTH)
    asked: dict[str, Any] = dict(max_jobs=len(line), max_calls=100 * len(line), budget_s=math.inf)
    fifo = get_policy("fifo")
    bounded = forecast(fifo, line, running, pool, NOW, times, **asked)
    whole = forecast(fifo, line, running, pool, NOW, times, ahead_limit=math.inf, **asked)
    # job k starts when the running job and the k ahead of it are done
    assert whole.estimates["w10"] == StartEstimate(NOW + 11 * HOUR, NOW + 11 * HOUR)
    for i, job in enumerate(line):
        if i < WITHIN:
            assert bounded.estimates[job.id] == whole.estimates[job.id], job.id
        else:
            assert bounded.estimates[job.id] == StartEstimate(None, NOW + i * HOUR), job.id
    assert bounded.beyond == len(line) - WITHIN
    # each pass stops once the last job within the limit has started
    assert bounded.calls <= 2 * (WITHIN + 1) < whole.calls


def _burst(n: int) -> list[TraceJob]:
    """Three ten-hour jobs to learn from, then ``n`` more submitted a second apart."""
    jobs = [TraceJob(f"a{i}", 0.0, 1, 10 * HOUR) for i in range(3)]
    return jobs + [TraceJob(f"b{i}", 31 * HOUR + i, 1, 10 * HOUR) for i in range(n)]


def test_a_replay_of_a_deep_queue_does_not_simulate_the_queue_ahead_of_each_arrival(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> replay.Forecast:
        made = replay.forecast(*args, **kwargs)
        calls.append(made.calls)
        return made

    monkeypatch.setattr(sim_eta, "forecast", counted)
    n = 300
    eta = simulate(_burst(n), "fifo", 1, restart_overhead=0, estimates=True).eta
    assert eta is not None and len(calls) == n
    # b0 starts at once; b(k) waits behind b1 .. b(k-1), ten hours each: from the limit
    # on, every arrival is too deep to forecast
    within = int(AHEAD_LIMIT // (10 * HOUR)) + 2
    assert eta.jobs == n and eta.deep == pytest.approx((n - within) / n)
    assert eta.uncertain >= eta.deep
    deep = eta.estimates[f"b{n - 1}"]
    assert deep.expected is None and deep.p80 == 31 * HOUR + n - 1 + 10 * (n - 2) * HOUR
    # a forecast's policy calls do not grow with the queue (without the limit: ~2 per job ahead)
    assert max(calls) <= 2 * (within + 2) and sum(calls) <= 2 * (within + 2) * within
    # the jobs within the limit are scored as before: each started when fifo said
    assert eta.hit == 1.0 and eta.median_error == 0.0

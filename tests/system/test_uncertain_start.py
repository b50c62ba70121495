"""A start estimate too spread to promise says so in words, in `dlsched queue`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.forecast.replay import AHEAD_LIMIT
from jupyter_dlsched.vocab.words import UNCERTAIN_FROM, UNCERTAIN_SPREAD, about

DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def queue_line(job_id: str) -> str:
    table = subprocess.run(
        [DLSCHED, "queue"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return next((ln for ln in table.splitlines() if job_id in ln), "")


def queue_row(job_id: str) -> dict:
    """The job's row in ``dlsched queue --json``."""
    listed = json.loads(
        subprocess.run(
            [DLSCHED, "queue", "--json"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    return next(j for j in listed if j["id"] == job_id)


def wait_uncertain(s: Scheduler, job_id: str) -> tuple[str, float]:
    """The job's queue line once it says its start is uncertain, and when that line was
    asked for (the words were judged no earlier)."""
    asked: list[float] = []

    def uncertain_line() -> str | bool:
        asked.append(time.time())
        return (ln := queue_line(job_id)) and "start uncertain" in ln and ln

    line = wait_for(
        uncertain_line,
        timeout=180,
        step=1.0,
        what=lambda: (queue_line(job_id), s.get(job_id).info()),
    )
    return line, asked[-1]


def test_a_job_behind_one_that_outran_every_step_seen_is_told_its_start_is_uncertain(
    home, monkeypatch
):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    with Scheduler(home) as s:
        for step in [s.submit(nap, 0.1, gpus=1, name="step") for _ in range(3)]:
            step.result(timeout=120)
        # a step that runs far longer than the three before: once it has outrun them the
        # forecast knows only that it may run much longer still (expected end at twice
        # what it has run, the P80 end at five times), too spread to give as a number
        long = s.submit(nap, 600.0, gpus=1, name="step")
        behind = s.submit(nap, 0.1, gpus=1, name="after")
        try:
            line, now = wait_uncertain(s, behind.id)
            assert "the queue ahead may take ~" in line and "starts in" not in line
            # the ledger keeps the numbers: JSON gives them, the words say they are no promise;
            # judged as of the words (``now``): a P80 is a moment, so the bound it leaves
            # shrinks while this test reads it
            row = queue_row(behind.id)
            wait, bound = row["expected_start"] - now, row["start_p80"] - now
            assert bound > UNCERTAIN_FROM and bound > UNCERTAIN_SPREAD * wait - 5.0
        finally:
            long.cancel()
        behind.result(timeout=120)


def test_a_job_with_more_work_ahead_than_the_forecast_promises_is_told_so_with_that_work(
    home, monkeypatch
):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    # nothing has finished, so each job is assumed to run to its time limit: `behind` has
    # the limit's worth of work ahead of it in line (`first`), more than the forecast
    # simulates; `first` has none ahead of it and gets a number (when `long` ends)
    limit = AHEAD_LIMIT + 3600.0
    with Scheduler(home) as s:
        long = s.submit(nap, 600.0, gpus=1, time_limit=limit)
        first = s.submit(nap, 0.1, gpus=1, time_limit=limit)
        behind = s.submit(nap, 0.1, gpus=1, time_limit=limit)
        try:
            line, _ = wait_uncertain(s, behind.id)
            assert f"the queue ahead may take {about(limit)}" in line, line
            assert "starts in" in queue_line(first.id)
            # no expected start in the ledger: only when the work ahead would be done
            row = queue_row(behind.id)
            assert row["expected_start"] is None
            assert abs(row["start_p80"] - time.time() - limit) < 120.0
        finally:
            long.cancel()
        behind.result(timeout=120)

"""``--begin WHEN``: a job of any kind waits, saying until when, and starts no earlier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import stop_agent, wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.when import parse_begin

DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def test_begin_is_spelled_as_slurm_spells_it():
    now = datetime(2026, 12, 2, 10, 0, 0).timestamp()
    assert parse_begin("now+5s", now) == now + 5
    assert parse_begin("now+2h", now) == now + 7200
    assert parse_begin("90s", now) == now + 90
    assert parse_begin(30, now) == now + 30
    assert parse_begin("now", now) == now
    assert parse_begin("11:30", now) == datetime(2026, 12, 2, 11, 30).timestamp()
    # a time of day already past today is tomorrow's
    assert parse_begin("09:15:30", now) == datetime(2026, 12, 3, 9, 15, 30).timestamp()
    assert parse_begin("2026-12-24T18:00", now) == datetime(2026, 12, 24, 18).timestamp()
    for bad in ("soon", "25:00", "now+x", True, "3000-01-01"):
        with pytest.raises(SpecError, match="begin"):
            parse_begin(bad, now)


def test_a_command_job_with_begin_waits_saying_until_when(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    try:
        asked = time.time()
        out = subprocess.run(
            [DLSCHED, "submit", "--begin", "now+5s", "--cpus", "0.25", "--", "true"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip()
        queue = subprocess.run(
            [DLSCHED, "queue"], env=env, capture_output=True, text=True, timeout=120
        ).stdout
        assert "queued" in queue and "not before" in queue and "(--begin)" in queue, queue

        def info():
            out = subprocess.run(
                [DLSCHED, "queue", "--all", "--json"], env=env, capture_output=True, text=True
            )
            [job] = [j for j in json.loads(out.stdout) if j["id"] == job_id]
            return job

        job = wait_for(lambda: (j := info())["state"] == "succeeded" and j, timeout=60)
        assert job["begin"] >= asked + 5
        assert job["started"] >= job["begin"]
    finally:
        stop_agent(home)


def test_a_function_job_and_a_cell_take_begin_too(ip, home):
    import jupyter_dlsched as dls

    h = dls.submit(time.time, begin="now+5s", cpus=0.25)
    ip.run_cell_magic("schedule", "--begin 5s --cpus 0.25", "1")
    cell = ip.user_ns["_job"]
    for handle in (h, cell):
        info = handle.info()
        assert info.begin is not None and info.begin > info.submitted + 4
        assert info.state == "queued"
    wait_for(lambda: "not before" in (h.info().waiting or ""), timeout=30)
    ran_at = h.result(timeout=60)
    assert ran_at >= h.info().begin
    assert cell.result(timeout=60).value == 1
    assert cell.info().started >= cell.info().begin


def test_begin_reaches_a_scheduler_without_an_agent(home):
    with Scheduler(home, agent=False) as s:
        h = s.submit(time.time, begin=3, cpus=0.25)
        assert h.result(timeout=60) >= h.info().begin

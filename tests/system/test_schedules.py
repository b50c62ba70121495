"""``--every SCHEDULE``: a new run on each tick while the last one is not still going;
``dlsched schedules`` lists and removes them."""

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
from jupyter_dlsched.schedules.firing import fire_due
from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.every import parse_every

BIN = Path(sys.executable).parent
DLSCHED = str(BIN / "dlsched")


def at(*parts: int) -> float:
    return datetime(*parts).timestamp()  # type: ignore[arg-type]


def test_cron_expressions_and_durations_name_their_next_tick():
    saturday_noon = at(2026, 12, 5, 12, 0)
    assert parse_every("3s").next_after(100.0) == 103.0
    assert parse_every("1h").next_after(100.0) == 3700.0
    assert parse_every("0 2 * * *").next_after(saturday_noon) == at(2026, 12, 6, 2, 0)
    assert parse_every("*/15 9-17 * * 1-5").next_after(saturday_noon) == at(2026, 12, 7, 9, 0)
    assert parse_every("@hourly").next_after(saturday_noon) == at(2026, 12, 5, 13, 0)
    assert parse_every("30 8 1 * *").next_after(saturday_noon) == at(2027, 1, 1, 8, 30)
    # both day fields restricted: either one matches, as in cron (the 1st, or a Sunday)
    assert parse_every("0 0 1 * 0").next_after(saturday_noon) == at(2026, 12, 6, 0, 0)
    assert parse_every("0 0 29 2 *").next_after(saturday_noon) == at(2028, 2, 29, 0, 0)
    for bad in ("0.5s", "soon", "* * *", "61 * * * *", "0 0 30 2 *", "*/0 * * * *", ""):
        with pytest.raises(SpecError, match="every"):
            parse_every(bad)


def console_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    # a run every 3 s keeps these tests short: below the default minimum interval of 1m
    env["DLSCHED_MIN_SCHEDULE_INTERVAL"] = "1s"
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    return env


def cli(env: dict[str, str], *args: str, python: str | None = None) -> subprocess.CompletedProcess:
    argv = [str(BIN / python), "-m", "jupyter_dlsched.cli", *args] if python else [DLSCHED, *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    return out


def test_every_3s_makes_runs_without_overlap_and_stops_when_removed(tmp_path):
    # made with `dlsched`, listed with `python -m jupyter_dlsched.cli`, removed with
    # `python3 -m jupyter_dlsched.cli`: each spelling of the command line once
    home = tmp_path / "home"
    env = console_env(home)
    try:
        out = cli(
            env, "submit", "--every", "3s", "--name", "tick", "--cpus", "0.25", "--",
            "sleep", "4",
        )  # fmt: skip
        first = out.stdout.strip()
        assert "a new run every 3s" in out.stderr
        [schedule] = json.loads(cli(env, "schedules", "--json").stdout)
        assert schedule["template"] == first and schedule["every"] == "3s"
        listing = cli(env, "schedules", python="python").stdout
        assert schedule["id"] in listing and "tick" in listing

        def runs() -> list[dict]:
            jobs = json.loads(cli(env, "queue", "--all", "--name", "tick", "--json").stdout)
            return sorted(jobs, key=lambda j: j["submitted"])

        wait_for(lambda: len(runs()) >= 3, timeout=90, what=runs)
        [going] = json.loads(cli(env, "schedules", "--json").stdout)
        # a 4 s run and a 3 s tick: a tick came while a run still ran, and made nothing
        assert going["skipped"] >= 1, going
        cli(env, "schedules", "remove", schedule["id"], python="python3")
        assert json.loads(cli(env, "schedules", "--json").stdout) == []
        made = runs()
        time.sleep(7)  # more than two ticks: none of them makes a run any more
        assert [j["id"] for j in runs()] == [j["id"] for j in made]
        wait_for(lambda: all(j["state"] == "succeeded" for j in runs()), timeout=60, what=runs)
        done = runs()
        for before, after in zip(done, done[1:], strict=False):
            # a tick while a run still ran made nothing: each run began after the last ended
            assert after["started"] >= before["finished"], (before, after)
            assert after["requeue_of"] == first
    finally:
        stop_agent(home)


def test_a_schedule_keeps_its_payload_after_its_runs_ended(home, monkeypatch):
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0")
    with Scheduler(home, agent=False) as s:
        h = s.submit(os.getpid, every="1h", cpus=0.25)
        assert h.result(timeout=60)
        [schedule] = s.schedules()
        assert schedule.next_run > time.time() + 3000
        s.store.collect_leftovers()  # ended jobs keep nothing (DLSCHED_PAYLOAD_KEEP=0)
        [run_id] = fire_due(s.store, now=schedule.next_run + 1)
        assert s.get(run_id).result(timeout=60)
        assert s.info(run_id).requeue_of == h.id
        [after] = s.schedules()
        assert after.last_job == run_id and after.runs == 1
        # a second process firing the same tick makes nothing
        assert fire_due(s.store, now=schedule.next_run + 1) == []
        s.remove_schedule(schedule.id)
        assert s.schedules() == []
        with pytest.raises(SpecError, match="schedule"):
            s.remove_schedule(schedule.id)


def test_a_cron_schedules_first_run_waits_for_its_first_tick(home):
    with Scheduler(home, agent=False) as s:
        h = s.submit(os.getpid, every="0 3 * * *", cpus=0.25)
        info = h.info()
        assert info.begin is not None and info.begin == parse_every("0 3 * * *").next_after(
            info.submitted
        )
        [schedule] = s.schedules()
        assert schedule.next_run == parse_every("0 3 * * *").next_after(info.begin)
        s.tick()
        assert "not before" in (s.info(h.id).waiting or "")
        s.remove_schedule(schedule.id)
        s.cancel(h.id)


def test_ones_own_pool_refuses_a_schedule_below_its_minimum_interval_unless_set_lower(home):
    with Scheduler(home, agent=False, loop=False) as s:
        with pytest.raises(SpecError) as refused:
            s.submit(os.getpid, every="1s", cpus=0.25)
        assert str(refused.value) == (
            "--every 1s is below this pool's minimum interval of 1m (min_schedule_interval)"
        )
        assert s.schedules() == [] and s.jobs() == []
    with Scheduler(home, agent=False, loop=False, min_schedule_interval="1s") as s:
        h = s.submit(os.getpid, every="1s", cpus=0.25)
        [schedule] = s.schedules()
        assert schedule.template == h.id and schedule.every == "1s"
        s.remove_schedule(schedule.id)
        s.cancel(h.id)

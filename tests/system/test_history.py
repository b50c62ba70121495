"""Per-job accounting: what a finished job used is in the ledger, in its JSON and in
``dlsched history`` (GPU-hours, CPU time, peak RAM), the way ``sacct`` answers it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.migrations import MIGRATIONS
from jupyter_dlsched.vocab.units import format_duration

DLSCHED = str(Path(sys.executable).with_name("dlsched"))
MiB = 2**20


def hold_memory_and_burn_cpu(megabytes: int, cpu_seconds: float) -> int:
    block = bytearray(megabytes * MiB)
    for i in range(0, len(block), 4096):  # touch every page so it is resident
        block[i] = 1
    start = time.process_time()
    while time.process_time() - start < cpu_seconds:
        pass
    return len(block)


def test_a_finished_job_records_its_cpu_time_peak_memory_and_gpu_hours(sched):
    handle = sched.submit(hold_memory_and_burn_cpu, 200, 0.6)
    assert handle.result(timeout=120) == 200 * MiB
    gpu_job = sched.submit_command(["sleep", "1.2"], gpus=1)
    gpu_job.wait(timeout=120)

    used = sched.info(handle.id)
    assert used.cpu_time is not None and used.cpu_time >= 0.6
    assert used.peak_rss is not None and used.peak_rss >= 200 * MiB
    assert used.peak_gpu_mem is None, "simulated GPUs: not measured, and not pretended"
    assert used.gpu_hours == 0.0, "a CPU job holds no GPU"
    gpu_used = sched.info(gpu_job.id)
    assert gpu_used.gpu_hours * 3600 >= 1.2
    usage = gpu_used.to_json()["usage"]
    assert usage["gpu_hours"] == gpu_used.gpu_hours and usage["peak_gpu_mem"] is None


def test_dlsched_history_lists_finished_jobs_with_usage_and_totals(sched, home):
    sched.submit(hold_memory_and_burn_cpu, 50, 0.2, name="burner").result(timeout=120)
    sched.submit_command(["true"], name="quick").wait(timeout=120)

    shown = subprocess.run([DLSCHED, "history"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "OWNER", "STATE"]
    assert "GPU-H" in lines[0] and "PEAK RAM" in lines[0]
    assert lines[1].split()[1] == "quick", "the most recently ended first"
    assert lines[2].split()[1] == "burner"
    assert "in the last 7 days:" in shown.stdout
    assert "2 jobs (2 done)" in shown.stdout

    data = json.loads(
        subprocess.run(
            [DLSCHED, "history", "--json", "--name", "burn*"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert [j["name"] for j in data["jobs"]] == ["burner"]
    assert data["jobs"][0]["usage"]["cpu_time"] >= 0.2
    assert data["totals"][0]["jobs"] == 1

    other = subprocess.run(
        [DLSCHED, "history", "-u", "nobody-here"], capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 0 and "no jobs finished in the last 7 days" in other.stdout


def test_ran_is_the_time_running_over_every_attempt(sched, home, tmp_path):
    # the first attempt runs 2 s and fails, the retry runs 2 s and succeeds
    marker = tmp_path / "tried"
    script = f"sleep 2; test -e {marker} || {{ touch {marker}; exit 1; }}"
    job = sched.submit_command(["sh", "-c", script], gpus=1, retries=1, name="twice")
    assert job.wait(timeout=120).state == "succeeded"
    info = sched.info(job.id)
    assert info.attempts == 2
    assert info.run_time >= 4.0 and info.run_time <= info.finished - info.submitted
    assert info.run_time == pytest.approx(info.gpu_hours * 3600)  # one GPU all along

    data = json.loads(
        subprocess.run(
            [DLSCHED, "history", "--json"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    assert data["jobs"][0]["usage"]["run_time"] == info.run_time
    table = subprocess.run(
        [DLSCHED, "history"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    header, row = table.splitlines()[:2]
    ran = row[header.index("RAN") :].split("  ")[0].strip()
    assert ran == format_duration(info.run_time)


def test_dlsched_history_refuses_a_bad_period_in_one_line(home):
    done = subprocess.run(
        [DLSCHED, "history", "--since", "last week"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("dlsched history:") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_ledger_from_before_accounting_opens_and_shows_usage_as_unknown(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = sqlite3.connect(home / "ledger.sqlite")
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO meta VALUES('schema_version', '1')")
    db.execute(
        "INSERT INTO jobs(id, name, kind, owner, uid, state, priority, gpus, cpus, mem, "
        "submitted, started, finished, attained) "
        "VALUES('oldjob22', 'old', 'command', 'ann', 0, 'succeeded', 50, 1, 1, 0, 1, 2, 3602, 3600)"
    )
    db.commit()
    db.close()
    (home / "ledger.sqlite").chmod(0o600)

    store = Store(home)
    old = store.get("oldjob22")
    assert (old.cpu_time, old.peak_rss, old.peak_gpu_mem) == (None, None, None)
    assert old.gpu_hours == 1.0
    assert [j.id for j in store.finished_jobs()] == ["oldjob22"]

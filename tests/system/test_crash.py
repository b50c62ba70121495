"""Nothing lost, nothing leaked: kill -9 of supervisor, job or submitter at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
from conftest import wait_for

from jupyter_dlsched.backends.local import LocalBackend
from jupyter_dlsched.client.scheduler import Scheduler


def sleeper(seconds):

    time.sleep(seconds)
    return seconds


def running_with_pids(sched, handle):
    info = handle.info()
    return info if info.state == "running" and info.job_pid and info.supervisor_pid else None


def test_killing_the_supervisor_frees_the_gpu_and_marks_the_job_lost(sched):
    handle = sched.submit(sleeper, 60, gpus=2, cpus=0.25)
    info = wait_for(lambda: running_with_pids(sched, handle))
    os.kill(info.supervisor_pid, signal.SIGKILL)
    final = handle.wait(timeout=30)
    assert final.state == "lost"
    assert "lease" in final.reason
    # the job process died with its supervisor, and the GPUs are free for the next job
    wait_for(lambda: not psutil.pid_exists(info.job_pid) or _zombie(info.job_pid))
    assert sched.submit(sleeper, 0, gpus=2, cpus=0.25).result(timeout=30) == 0
    assert sched.store.integrity_check() == "ok"


def _zombie(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_lost_job_with_retries_is_run_again(sched):
    handle = sched.submit(sleeper, 1, gpus=1, cpus=0.25, retries=1)
    info = wait_for(lambda: running_with_pids(sched, handle))
    os.kill(info.supervisor_pid, signal.SIGKILL)
    assert handle.result(timeout=40) == 1
    assert handle.info().attempts == 2
    assert any("lost (lease expired)" in e["reason"] for e in sched.store.events(handle.id))


def test_killing_the_job_process_fails_it_with_the_signal(sched):
    handle = sched.submit(sleeper, 60, gpus=1, cpus=0.25)
    info = wait_for(lambda: running_with_pids(sched, handle))
    os.kill(info.job_pid, signal.SIGKILL)
    final = handle.wait(timeout=30)
    assert final.state == "failed" and final.reason == "killed by signal SIGKILL"
    assert final.term_signal == signal.SIGKILL


SUBMITTER = textwrap.dedent(
    """
    import sys, time
    from jupyter_dlsched.client.scheduler import Scheduler

    def work(x):
        import time
        time.sleep(1.0)
        return x * 10

    s = Scheduler(sys.argv[1])
    ids = [s.submit(work, i, gpus=2, cpus=0.25).id for i in range(3)]
    while s.info(ids[0]).supervisor_pid is None:  # the first job is in its supervisor's hands
        time.sleep(0.01)
    print(" ".join(ids), flush=True)
    time.sleep(600)
    """
)


def test_jobs_survive_their_submitter_and_the_queue_drains_without_it(home, tmp_path):
    script = tmp_path / "submitter.py"
    script.write_text(SUBMITTER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(home)], stdout=subprocess.PIPE, text=True
    )
    ids = proc.stdout.readline().split()
    assert len(ids) == 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # nobody else holds a scheduler loop: the supervisors of ending jobs start the next ones
    with Scheduler(home, loop=False) as reader:
        results = [reader.get(i).result(timeout=60) for i in ids]
    assert results == [0, 10, 20]


def test_the_ledger_stays_consistent_after_crashes(sched):
    handles = [sched.submit(sleeper, 30, gpus=1, cpus=0.25) for _ in range(2)]
    infos = [wait_for(lambda h=h: running_with_pids(sched, h)) for h in handles]
    os.kill(infos[0].supervisor_pid, signal.SIGKILL)
    os.kill(infos[1].job_pid, signal.SIGKILL)
    states = sorted(h.wait(timeout=30).state for h in handles)
    assert states == ["failed", "lost"]
    assert sched.store.integrity_check() == "ok"
    assert sched.store.jobs(states=["running"]) == []


class NeverLaunches(LocalBackend):
    """A participant that dies between allocating a job and launching it."""

    def launch(self, job):
        return None


def test_a_job_allocated_by_a_participant_that_died_is_launched_by_another(home):
    with Scheduler(home, backend=NeverLaunches(), loop=False) as dying:
        handle = dying.submit(sleeper, 0, gpus=1, cpus=0.25)
        assert handle.state == "running" and handle.info().supervisor_pid is None
    with Scheduler(home) as survivor:
        assert survivor.get(handle.id).result(timeout=30) == 0

"""One rule for how a run's end moves its job on, whichever runner saw it end."""

from __future__ import annotations

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.policy import Decisions
from jupyter_dlsched.vocab.errors import SpecError
from jupyter_dlsched.vocab.schema import RunEnd, end_of_run


class Hold:
    """A policy that starts nothing: the test alone moves these jobs."""

    name = "hold"

    def __call__(self, queued, running, capacity, now):
        return Decisions()


@pytest.fixture
def sched(home):
    with Scheduler(home, policy=Hold(), loop=False) as s:
        yield s


def running_job(sched, **columns):
    job = sched.submit(print, "x", retries=columns.pop("retries", 0))
    columns = {"state": "running", "started": 100.0, "attempts": 1, "gpus": 1.0, **columns}
    sched.store.update(job.id, **columns)
    return sched.info(job.id)


def test_a_failed_run_is_retried_while_retries_are_left_then_fails(sched):
    job = running_job(sched, retries=1)
    to, why, columns = end_of_run(job, RunEnd("failed", "exit code 3", exit_code=3), 110.0)
    assert (to, why) == ("queued", "retry 1/1 after: exit code 3")
    assert columns["placement"] is None and "finished" not in columns
    assert columns["attained"] == 10.0 and columns["exit_code"] == 3

    last = running_job(sched, retries=1, attempts=2)
    to, why, columns = end_of_run(last, RunEnd("failed", "exit code 3"), 110.0)
    assert (to, why, columns["finished"]) == ("failed", "exit code 3", 110.0)


def test_a_lost_run_is_retried_like_a_failed_one_but_a_refused_one_is_not(sched):
    job = running_job(sched, retries=2)
    assert end_of_run(job, RunEnd("lost", "lost: node died"), 101.0)[0] == "queued"
    assert end_of_run(job, RunEnd("failed", "cannot run here", retry=False), 101.0)[0] == "failed"


def test_preemption_requeues_and_counts_cancel_and_success_finish(sched):
    job = running_job(sched)
    to, why, columns = end_of_run(job, RunEnd("preempted"), 105.0)
    assert (to, why) == ("preempted", "requeued after preemption")
    assert columns["preemptions"] == 1 and columns["preempt_requested"] == 0
    assert end_of_run(job, RunEnd("cancelled"), 105.0)[1] == "cancelled by user"
    assert end_of_run(job, RunEnd("succeeded"), 105.0)[2]["finished"] == 105.0
    with pytest.raises(ValueError):
        end_of_run(job, RunEnd("queued"), 105.0)


def test_the_time_a_job_ran_adds_up_over_its_runs(sched):
    first = running_job(sched)  # ran from 100
    ended = end_of_run(first, RunEnd("preempted"), 111.0)[2]
    assert ended["run_time"] == 11.0
    again = running_job(sched, started=200.0, attempts=2, run_time=11.0, attained=11.0)
    ended = end_of_run(again, RunEnd("succeeded"), 240.0)[2]
    assert (ended["run_time"], ended["attained"]) == (51.0, 51.0)  # not the last run's 40


def test_the_store_applies_the_rule_and_keeps_what_the_runner_measured(sched):
    job = running_job(sched, retries=1)
    with sched.store.transaction() as db:
        assert sched.store.finish_run(db, job, RunEnd("failed", "boom"), 120.0, cpu_time=2.5)
    after = sched.info(job.id)
    assert (after.state, after.reason, after.cpu_time) == ("queued", "retry 1/1 after: boom", 2.5)


def test_an_inline_job_refuses_retries_because_it_runs_once_in_this_process(sched):
    with pytest.raises(SpecError, match="runs once"):
        sched.submit_inline(lambda info: None, retries=2)


@pytest.mark.parametrize("end", ["exit 3", "exit 0", "SIGKILL", "SIGSEGV"])
def test_a_peeked_exit_status_reads_as_the_reaped_one(end: str) -> None:
    """The supervisor peeks at its job's group leader (``waitid(WNOWAIT)``) and reaps it only
    after killing the group; the status it peeked must be the one ``wait4`` then gives."""
    import os
    import signal

    from jupyter_dlsched.local.ending import wait_status as _wait_status

    pid = os.fork()
    if pid == 0:
        try:
            if end.startswith("exit"):
                os._exit(int(end.split()[1]))
            if end != "SIGKILL":
                signal.signal(getattr(signal, end), signal.SIG_DFL)
            os.kill(os.getpid(), getattr(signal, end))
        finally:
            os._exit(99)
    peeked = _wait_status(os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT))
    _, reaped, _ = os.wait4(pid, 0)
    assert peeked == reaped
    assert os.waitstatus_to_exitcode(peeked) == (
        int(end.split()[1]) if end.startswith("exit") else -getattr(signal, end)
    )

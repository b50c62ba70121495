"""A job process forked ahead of its job: the pool agent's spare supervisor forks the
next job's process before the job is known, and hands it the job once claimed; the job
runs there exactly as in a process forked for it (one process per job, its own group,
the supervisor its parent), and the process is let go when it does not fit the job."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest
from conftest import alive, wait_for

from jupyter_dlsched.agent.forking import SPARES
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local.supervisor import rehearse
from jupyter_dlsched.local.warm import WarmProcess
from jupyter_dlsched.store import Store


def whoami():
    """What the job's process knows of itself."""
    import os

    import psutil

    return {
        "pid": os.getpid(),
        "group": os.getpgrp(),
        "parent": psutil.Process(os.getppid()).name(),
        "job": os.environ.get("DLSCHED_JOB_ID"),
        "cwd": os.getcwd(),
        "rank": os.environ.get("RANK"),
    }


def sleeper(seconds):
    import time

    time.sleep(seconds)
    return seconds


@pytest.fixture
def agent_sched(home):
    with Scheduler(home, agent=True, lease_ttl=3.0, grace=1.0) as s:
        yield s


def spares(s):
    """(spare supervisor, the job process it forked ahead) for each spare whose job
    process is there."""
    assert s.link is not None
    agent = psutil.Process(int(s.link.hello["pid"]))
    found = []
    for spare in agent.children():
        try:
            if spare.name() != "dlsched-sup" or spare.status() == psutil.STATUS_ZOMBIE:
                continue
            waiting = spare.children()
        except psutil.NoSuchProcess:
            continue
        if len(waiting) == 1:
            found.append((spare.pid, waiting[0].pid))
    return found


def ready(s):
    """Wait until every spare supervisor and the job process it forked ahead wait, and
    no job holds a grant (the supervisors of the jobs before are spares again or gone):
    each spare's pid → its job process's. A job's ``supervisor_pid`` says which it took."""

    def settled():
        if s.store.jobs(holding=True):
            return None
        first = spares(s)
        time.sleep(0.05)
        return dict(first) if len(first) == SPARES and spares(s) == first else None

    return wait_for(settled, timeout=30)


def forked_ahead(pairs, h):
    """The process forked ahead by the spare supervisor that took job ``h``."""
    return pairs[h.info().supervisor_pid]


def test_a_job_runs_in_the_process_its_spare_supervisor_forked_before_it_was_submitted(
    agent_sched, tmp_path, monkeypatch
):
    s = agent_sched
    monkeypatch.chdir(tmp_path)
    s.submit(abs, -1).result(timeout=30)  # the agent is up
    pairs = ready(s)
    h = s.submit(whoami)
    me = h.result(timeout=30)
    # the process that waited before the job was submitted
    assert me["pid"] == forked_ahead(pairs, h)
    # as a job process forked for its job: its own group, its supervisor's child, the
    # job's environment and the submitter's folder
    assert me["group"] == me["pid"]
    assert me["parent"] == "dlsched-sup"
    assert me["job"] == h.id
    assert me["cwd"] == str(tmp_path)


def test_jobs_started_together_each_run_in_a_process_forked_ahead(agent_sched):
    """Two spares: a queue draining back to back does not fork a supervisor per job."""
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    assert SPARES == 2
    waiting = set(ready(s).values())
    first, second = s.submit(whoami), s.submit(whoami)
    assert {first.result(timeout=30)["pid"], second.result(timeout=30)["pid"]} == waiting
    # and both spares come back for the next ones
    assert len(ready(s)) == 2


def test_a_spare_supervisor_takes_the_next_job_once_its_own_has_ended(agent_sched):
    """Short jobs one at a time: a job's supervisor, once its job has ended, waits for
    another (with a new process forked ahead), instead of each job costing a supervisor
    of its own (one still running 50 ms after its launch finds a spare forked to replace
    it, and exits at its end)."""
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    ready(s)
    supervisors: list[int] = []
    # a job still running 50 ms after its launch lets its supervisor go (a loaded machine
    # makes some of them that slow): up to 20 jobs, until one supervisor took a second
    while len(supervisors) < 20 and len(set(supervisors)) == len(supervisors):
        h = s.submit(abs, -1)
        assert h.result(timeout=30) == 1
        supervisors.append(h.info().supervisor_pid)
        ready(s)
    assert None not in supervisors
    assert len(set(supervisors)) < len(supervisors), supervisors


def test_supervisors_beyond_the_spares_exit_when_their_jobs_end(agent_sched):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    ready(s)
    handles = [s.submit(sleeper, 0.5, cpus=0.1) for _ in range(2 * SPARES)]
    ran = {h.result(timeout=60) and h.info().supervisor_pid for h in handles}
    assert len(ran) == 2 * SPARES
    ready(s)
    agent = psutil.Process(int(s.link.hello["pid"]))

    def supervisors():
        return {
            p.pid
            for p in agent.children()
            if p.name() == "dlsched-sup" and p.status() != psutil.STATUS_ZOMBIE
        }

    # the spares wait (some of them the jobs' own supervisors), the others have gone
    assert wait_for(lambda: len(supervisors()) == SPARES, timeout=30)


def test_a_command_runs_in_the_process_forked_ahead(agent_sched):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    pairs = ready(s)
    h = s.submit_command([sys.executable, "-c", "import os; print('pid', os.getpid())"])
    assert h.result(timeout=30) == 0
    assert f"pid {forked_ahead(pairs, h)}" in h.logs()


#: what a job prints of the two variables its submitter dropped and changed, as JSON
ENV_SCRIPT = (
    "import json, os; print(json.dumps({name: os.environ.get(name) for name in "
    "('DLSCHED_T_DROPPED', 'DLSCHED_T_CHANGED')}))"
)


def run_env_script():
    exec(ENV_SCRIPT)


@pytest.mark.parametrize("kind", ["function", "command"])
def test_a_job_forked_ahead_sees_its_submitters_environment_not_the_agents(home, monkeypatch, kind):
    """The agent (and the process it forks ahead) started with variables the submitter
    then dropped or changed: the job sees the submitter's, for a function run in that
    process and for a program it runs."""
    monkeypatch.setenv("DLSCHED_T_DROPPED", "the agent's")
    monkeypatch.setenv("DLSCHED_T_CHANGED", "the agent's")
    with Scheduler(home, agent=True) as s:
        s.submit(abs, -1).result(timeout=30)  # the agent starts with both
        pairs = ready(s)
        monkeypatch.delenv("DLSCHED_T_DROPPED")
        monkeypatch.setenv("DLSCHED_T_CHANGED", "the submitter's")
        if kind == "function":
            h = s.submit(run_env_script)
        else:
            h = s.submit_command([sys.executable, "-c", ENV_SCRIPT])
        h.result(timeout=30)
        seen = json.loads(h.logs().strip().splitlines()[-1])
        assert h.info().supervisor_pid in pairs  # it ran in a process forked ahead
        assert seen == {"DLSCHED_T_DROPPED": None, "DLSCHED_T_CHANGED": "the submitter's"}


def test_a_spares_rehearsal_writes_nothing_to_the_ledger(agent_sched):
    """While it waits, a spare reads what its next job's start reads first, those of the job
    it ran last: it writes nothing to the ledger, and a job it cannot read is no error."""
    s = agent_sched
    h = s.submit(abs, -1)
    h.result(timeout=30)
    store = Store(s.home)
    store.get(h.id)
    written = store.db.total_changes  # rows this connection changed
    rehearse(store, h.id)
    rehearse(store, "nosuchjb")
    assert store.db.total_changes == written
    store.close()


def test_a_job_in_a_process_forked_ahead_is_stopped_by_its_time_limit_and_by_cancel(
    agent_sched,
):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    ready(s)
    limited = s.submit(sleeper, 60, time_limit=1)
    assert limited.wait(timeout=30).state == "timeout"
    ready(s)
    cancelled = s.submit(sleeper, 60)
    wait_for(lambda: cancelled.info().job_pid is not None)
    s.cancel(cancelled.id)
    assert cancelled.wait(timeout=30).state == "cancelled"


def test_a_distributed_job_is_forked_for_and_the_process_forked_ahead_let_go(agent_sched):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    pairs = ready(s)
    h = s.submit(whoami, cpus=2, distributed=True)
    me = h.result(timeout=30)
    waiting = forked_ahead(pairs, h)
    assert me["rank"] == "0" and me["pid"] != waiting and me["parent"] == "dlsched-sup"
    assert not psutil.pid_exists(waiting) or psutil.Process(waiting).status() == "zombie"
    assert h.info().state == "succeeded" and not h.info().reason  # nothing left behind


#: A process that ignores SIGTERM (argv: PIDFILE): only the kill at the end of the grace
#: stops it.
STUBBORN = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
"""


def leave_a_stubborn_process(pidfile: str, script: str, ballast: bytes) -> int:
    """A job function that returns (its pid) while a process it started runs on in a
    session of its own (``ballast``: only its size matters)."""
    import os
    import subprocess
    import time

    subprocess.Popen(["/usr/bin/python3", "-c", script, pidfile], start_new_session=True)
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    return os.getpid()


def gpu_and_whether_running(pid: int) -> tuple[str, bool]:
    import os

    return os.environ["CUDA_VISIBLE_DEVICES"], alive(pid)


@pytest.mark.parametrize("process", ["forked ahead", "forked for it"])
def test_a_functions_result_comes_at_once_and_its_gpu_waits_for_what_it_left_behind(
    home, monkeypatch, tmp_path, process
):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    pidfile = tmp_path / "stubborn"
    # a payload over MAX_PAYLOAD is not sent to the process forked ahead: one is forked for it
    ballast = b"x" * (2 << 20) if process == "forked for it" else b""
    with Scheduler(home, lease_ttl=3.0, grace=3.0) as s:
        s.submit(abs, -1, cpus=0.5).result(timeout=30)  # the agent is up
        pairs = ready(s)
        first = s.submit(
            leave_a_stubborn_process, str(pidfile), STUBBORN, ballast, gpus=1, cpus=0.5
        )
        ran_in = first.result(timeout=60)
        stubborn = int(pidfile.read_text())
        try:
            assert (ran_in == forked_ahead(pairs, first)) == (process == "forked ahead")
            second = s.submit(gpu_and_whether_running, stubborn, gpus=1, cpus=0.5)
            # the result is the client's as soon as it is written: what the function left
            # running is stopped afterwards, killed at the end of its grace (3 s) ...
            assert alive(stubborn)
            assert first.info().state == "succeeded"
            # ... and until it is gone, the GPU stays the finished job's
            assert second.info().state == "queued"
            assert second.result(timeout=60) == ("0", False)
        finally:
            if alive(stubborn):
                os.kill(stubborn, signal.SIGKILL)
        done = first.info()
    assert done.reason == "killed 1 process left behind"
    assert done.cpu_time is not None and done.peak_rss


def report_done_and_linger(pidfile: str) -> None:
    """A job function that says its result is written on every pipe it holds (its
    supervisor's report among them), then goes on running."""
    import os
    import time

    from jupyter_dlsched.local.jobproc import RESULT_REPORT

    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    for name in os.listdir("/proc/self/fd"):
        try:
            if int(name) > 2 and os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                os.write(int(name), RESULT_REPORT.pack(os.getpid(), 0.0, 0))
        except OSError:
            pass
    time.sleep(120)


def test_a_process_that_says_it_is_done_and_goes_on_is_killed_after_the_grace(
    home, monkeypatch, tmp_path
):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    pidfile = tmp_path / "pid"
    with Scheduler(home, lease_ttl=3.0, grace=2.0) as s:
        first = s.submit(report_done_and_linger, str(pidfile), gpus=1, cpus=0.5)
        assert first.wait(timeout=60).state == "succeeded"  # as it said
        pid = int(pidfile.read_text())
        try:
            # it is not let run on, and its GPU goes on once it is gone
            wait_for(lambda: not alive(pid), timeout=30)
            assert s.submit(gpu_and_whether_running, pid, gpus=1).result(timeout=60) == (
                "0",
                False,
            )
        finally:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def fork_and_return_in_both() -> str:
    """A job function whose fork returns through the job's own code first."""
    import os
    import time

    if os.fork() == 0:
        return "the fork"  # and on to writing a result and reporting it, as the job would
    os.wait()
    time.sleep(0.5)
    return "the job"


def test_only_the_jobs_own_process_reports_its_result(agent_sched):
    h = agent_sched.submit(fork_and_return_in_both)
    assert h.result(timeout=60) == "the job"


def test_a_stopping_agent_leaves_no_spares_and_no_processes_forked_ahead(agent_sched):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)
    ready(s)
    pids = [pid for pair in spares(s) for pid in pair]
    assert len(pids) == 2 * SPARES
    assert s.link is not None
    s.link.client.call("stop")

    def gone(pid):
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(lambda: all(gone(pid) for pid in pids), timeout=30)


def test_a_process_forked_ahead_and_not_used_is_killed_and_reaped():
    warm = WarmProcess.fork()
    assert warm is not None
    assert os.getpgid(warm.pid) == warm.pid  # its own group, as a job's first process is
    warm.discard()
    with pytest.raises(ChildProcessError):
        os.waitpid(warm.pid, os.WNOHANG)
    warm.discard()  # once is enough


def test_a_process_forked_ahead_exits_when_its_supervisor_lets_go():
    warm = WarmProcess.fork()
    assert warm is not None
    assert warm._sock is not None
    warm._sock.close()  # as when the supervisor exits without a job for it
    warm._sock = None
    _, status = os.waitpid(warm.pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_process_forked_ahead_dies_with_its_supervisor():
    read, write = os.pipe()
    supervisor = os.fork()
    if supervisor == 0:
        os.close(read)
        warm = WarmProcess.fork()
        os.write(write, str(warm.pid if warm else 0).encode())
        time.sleep(60)
        os._exit(0)
    os.close(write)
    pid = int(os.read(read, 32))
    os.close(read)
    assert pid
    os.kill(supervisor, signal.SIGKILL)
    os.waitpid(supervisor, 0)
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie")

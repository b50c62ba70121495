"""A function job's result reaches its client as soon as it is written (through the pool
agent), while the ledger keeps the job ``running``, and its grant held, until its
processes have exited; a job process forked ahead of its job runs it."""

from __future__ import annotations

import os
import time

import pytest

from jupyter_dlsched.agent.results import WrittenResults
from jupyter_dlsched.local.warm import WarmProcess
from jupyter_dlsched.scheduler import Scheduler


def leave_a_process_behind(value):
    """Return ``value`` after starting a process, in a session of its own, that ignores
    SIGTERM: the job's main process exits at once, its end waits for that process."""
    import os
    import signal
    import time

    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
    return value


@pytest.fixture
def agent_sched(home):
    with Scheduler(home, agent=True, lease_ttl=5.0, grace=3.0) as s:
        yield s


def test_the_result_comes_before_the_end_and_the_grant_waits_for_the_exit(agent_sched):
    s = agent_sched
    s.submit(abs, -1).result(timeout=30)  # the agent and its spare supervisor are up
    first = s.submit(leave_a_process_behind, 7, gpus=2)
    second = s.submit(abs, -2, gpus=2)
    assert first.result(timeout=30) == 7
    # read before the end: what it left behind is still being stopped (for `grace`)
    info = first.info()
    assert info.state == "running" and info.finished is None
    assert not first.done()
    assert second.state == "queued"  # both GPUs are still the first job's
    ended = first.wait(timeout=30)
    assert ended.state == "succeeded" and "left behind" in ended.reason
    assert second.result(timeout=30) == 2
    assert second.info().started >= ended.finished


def test_a_job_that_fails_is_not_resolved_early(agent_sched):
    s = agent_sched
    h = s.submit(int, "not a number")
    with pytest.raises(ValueError):
        h.result(timeout=30)
    assert h.info().state == "failed"


def test_a_note_without_a_result_written_is_not_a_result(agent_sched):
    """Only the pool's own user may say a result is written; a note for a job with no
    result yet leaves its handle waiting for the job's end."""
    s = agent_sched
    h = s.submit(time.sleep, 1.0)
    deadline = time.monotonic() + 30
    while h.state != "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert s.link is not None
    assert s.link.client.call("result", id=h.id)["noted"] is True
    assert h.result(timeout=30) is None
    # the note was read, found no result, and the handle waited for the real one
    assert time.time() >= h.info().started + 1.0


def test_written_results_are_numbered_and_read_from_a_client_cursor():
    notes = WrittenResults()
    assert notes.since(0) == []
    notes.add("aaaa")
    notes.add("bbbb")
    assert notes.since(0) == [(1, "aaaa"), (2, "bbbb")]
    assert notes.since(1) == [(2, "bbbb")]
    assert notes.since(2) == []
    # a cursor from an agent that has since restarted reads every note this one has
    assert notes.since(9) == [(1, "aaaa"), (2, "bbbb")]


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
    _, status = os.waitpid(warm.pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    warm._sock = None

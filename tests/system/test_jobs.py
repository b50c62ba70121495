"""Real jobs through the real ledger and supervisors, on simulated GPUs."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest
from conftest import wait_for

import jupyter_dlsched as dls
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab.errors import JobFailed, JobNotFound, JobTimeout, SpecError


def add(a, b):
    return a + b


def visible_devices(seconds=0.0):
    time.sleep(seconds)
    return os.environ["CUDA_VISIBLE_DEVICES"]


def boom():
    raise ValueError("learning rate too high")


def job_env():
    keys = ("DLSCHED_JOB_ID", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "DLSCHED_DEVICES")
    return {k: os.environ.get(k) for k in keys} | {"affinity": sorted(os.sched_getaffinity(0))}


def report_progress():
    for step in range(1, 4):
        dls.progress(step, 3, loss=1.0 / step)
    return "ok"


def test_a_function_job_returns_its_result(sched):
    handle = sched.submit(add, 2, b=40, cpus=0.5)
    assert handle.result(timeout=30) == 42
    info = handle.info()
    assert info.state == "succeeded" and info.finished >= info.started >= info.submitted


def test_the_job_gets_its_grant_in_the_environment(sched):
    handle = sched.submit(job_env, gpus=1, cpus=1)
    env = handle.result(timeout=30)
    assert env["DLSCHED_JOB_ID"] == handle.id
    assert env["CUDA_VISIBLE_DEVICES"] == env["DLSCHED_DEVICES"] == str(handle.devices[0])
    assert env["OMP_NUM_THREADS"] == "1"
    assert len(env["affinity"]) == 1


def test_a_cpu_job_sees_no_gpu(sched):
    assert sched.submit(job_env, cpus=0.5).result(timeout=30)["CUDA_VISIBLE_DEVICES"] == ""


def test_concurrent_jobs_get_distinct_gpus_and_never_exceed_the_pool(sched):
    handles = [sched.submit(visible_devices, 0.5, gpus=1, cpus=0.25) for _ in range(6)]
    seen = [h.result(timeout=60) for h in handles]
    assert set(seen) == {"0", "1"}
    assert max_concurrent(sched, [h.id for h in handles]) <= 2
    # the two jobs that ran side by side held different GPUs
    spans = {h.id: (h.info().started, h.info().finished, h.devices[0]) for h in handles}
    for a, (s1, e1, d1) in spans.items():
        for b, (s2, e2, d2) in spans.items():
            if a < b and s1 < e2 and s2 < e1:
                assert d1 != d2


def max_concurrent(sched, ids):
    """The most jobs that were running at once, from the events table."""
    running, peak = 0, 0
    for event in sched.store.events():
        if event["job_id"] not in ids:
            continue
        if event["to_state"] == "running":
            running += 1
        elif event["from_state"] == "running":
            running -= 1
        peak = max(peak, running)
    return peak


def test_higher_priority_starts_first(sched):
    blocker = sched.submit(visible_devices, 1.0, gpus=2, cpus=0.25)
    low = sched.submit(visible_devices, gpus=2, cpus=0.25, priority="low", name="low")
    high = sched.submit(visible_devices, gpus=2, cpus=0.25, priority="high", name="high")
    for h in (blocker, low, high):
        h.result(timeout=60)
    assert high.info().started < low.info().started


def test_a_queued_job_says_why_it_waits(sched):
    blocker = sched.submit(visible_devices, 2.0, gpus=2, cpus=0.25)
    waiting = sched.submit(visible_devices, gpus=1, cpus=0.25)
    deadline = time.time() + 20
    while blocker.state != "running" and time.time() < deadline:
        time.sleep(0.05)
    sched.tick()
    info = waiting.info()
    assert info.state == "queued"
    assert info.position == 1 and info.waiting == "waiting for 1 GPU"
    blocker.cancel()
    waiting.result(timeout=30)


@pytest.fixture
def two_cores():
    """This process, and the pool agent it starts, may use two cores: the pool has two."""
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("needs two cores")
    os.sched_setaffinity(0, sorted(cores)[:2])
    yield
    os.sched_setaffinity(0, cores)


def test_no_gpu_waits_for_a_core_a_job_did_not_ask_for(home, monkeypatch, two_cores):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "4x16GiB")
    with Scheduler(home) as s:
        sweep = s.map(time.sleep, [60] * 4, gpus=1)  # no cpus: half a core each
        why = lambda: [job.info().waiting for job in sweep]  # noqa: E731
        wait_for(lambda: all(job.state == "running" for job in sweep), what=why)
        assert {job.info().cpus for job in sweep} == {0.5}
        for job in sweep:
            job.cancel()
        # asked for, a whole core each: two run, and two wait for cores with GPUs free
        asked = s.map(time.sleep, [60] * 4, gpus=1, cpus=1)
        wait_for(lambda: sum(job.state == "running" for job in asked) == 2)
        s.tick()
        waiting = [job.info() for job in asked if job.state == "queued"]
        assert len(waiting) == 2 and all("CPU" in (info.waiting or "") for info in waiting)
        for job in asked:
            job.cancel()


def test_an_exception_comes_back_with_the_remote_traceback(sched):
    handle = sched.submit(boom, cpus=0.5)
    with pytest.raises(ValueError, match="learning rate too high") as caught:
        handle.result(timeout=30)
    assert "in boom" in str(caught.value.__cause__)
    info = handle.info()
    assert info.state == "failed" and info.reason == "ValueError: learning rate too high"
    assert isinstance(handle.exception(), ValueError)
    assert "Traceback" in handle.logs()


def test_output_is_streamed_to_the_log(sched):
    handle = sched.submit(print, "hello from the job", cpus=0.5)
    handle.result(timeout=30)
    assert "hello from the job" in handle.logs()


def test_cancel_a_queued_job(sched):
    blocker = sched.submit(visible_devices, 1.0, gpus=2, cpus=0.25)
    queued = sched.submit(visible_devices, gpus=2, cpus=0.25)
    assert queued.cancel()
    assert queued.state == "cancelled"
    with pytest.raises(concurrent.futures.CancelledError):
        queued.result(timeout=5)
    blocker.result(timeout=30)


def test_cancel_a_running_job_kills_its_process_group(sched, tmp_path):
    marker = tmp_path / "child.pid"
    cmd = f"sleep 60 & echo $! > {marker}; wait"
    handle = sched.submit_command(["bash", "-c", cmd], cpus=0.5)
    deadline = time.time() + 20
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    child = int(marker.read_text())
    handle.cancel()
    info = handle.wait(timeout=30)
    assert info.state == "cancelled"
    assert not pid_alive(child)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its parent counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_time_limit_stops_the_job_with_state_timeout(sched):
    handle = sched.submit_command(["sleep", "30"], cpus=0.5, time_limit="1s")
    with pytest.raises(JobTimeout):
        handle.result(timeout=30)
    assert handle.info().state == "timeout"
    assert handle.info().reason == "time limit 1s reached"


def hog(n_bytes):
    block = bytearray(n_bytes)
    for i in range(0, n_bytes, 4096):
        block[i] = 1
    time.sleep(30)
    return len(block)


def test_memory_limit_fails_the_job_with_a_reason(sched):
    handle = sched.submit(hog, 400 * 2**20, cpus=0.5, mem="200MiB")
    with pytest.raises(JobFailed):
        handle.result(timeout=40)
    reason = handle.info().reason
    assert reason.startswith("out of memory: used ") and reason.endswith("limit 200 MiB")


def flaky(marker):
    from pathlib import Path

    path = Path(marker)
    attempts = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(attempts))
    if attempts < 3:
        raise RuntimeError(f"attempt {attempts} fails")
    return attempts


def test_retries_requeue_a_failed_job(sched, tmp_path):
    handle = sched.submit(flaky, str(tmp_path / "n"), cpus=0.5, retries=2)
    assert handle.result(timeout=60) == 3
    reasons = [e["reason"] for e in sched.store.events(handle.id) if e["to_state"] == "queued"]
    assert reasons[1:] == [
        "retry 1/2 after: RuntimeError: attempt 1 fails",
        "retry 2/2 after: RuntimeError: attempt 2 fails",
    ]


def test_retries_run_out(sched, tmp_path):
    handle = sched.submit(flaky, str(tmp_path / "n"), cpus=0.5, retries=1)
    with pytest.raises(RuntimeError, match="attempt 2 fails"):
        handle.result(timeout=60)
    assert handle.info().attempts == 2


def test_a_dependent_job_waits_for_its_dependency(sched):
    first = sched.submit(visible_devices, 0.5, cpus=0.25)
    second = sched.submit(add, 1, 2, cpus=0.25, after=[first])
    assert second.result(timeout=30) == 3
    assert second.info().started >= first.info().finished


def test_a_failed_dependency_fails_the_dependent_job(sched):
    first = sched.submit(boom, cpus=0.25)
    second = sched.submit(add, 1, 2, cpus=0.25, after=first.id)
    with pytest.raises(JobFailed, match=f"dependency {first.id} failed"):
        second.result(timeout=30)


def test_after_an_unknown_job_is_a_spec_error(sched):
    with pytest.raises(SpecError, match="after='nosuchjob'"):
        sched.submit(add, 1, 2, after=["nosuchjob"])


def test_progress_is_recorded_in_the_ledger(sched):
    handle = sched.submit(report_progress, cpus=0.5)
    assert handle.result(timeout=30) == "ok"
    progress = handle.info().progress
    assert progress["done"] == 3 and progress["total"] == 3
    assert progress["metrics"]["loss"] == pytest.approx(1 / 3)


def test_a_command_job_records_its_exit_code(sched):
    ok = sched.submit_command(["true"], cpus=0.5)
    bad = sched.submit_command(["sh", "-c", "exit 3"], cpus=0.5)
    assert ok.result(timeout=30) == 0
    with pytest.raises(JobFailed, match="exit code 3"):
        bad.result(timeout=30)


def test_a_missing_program_fails_clearly(sched):
    handle = sched.submit_command(["no-such-program-here"], cpus=0.5)
    with pytest.raises(JobFailed, match="exit code 127"):
        handle.result(timeout=30)
    assert "cannot run 'no-such-program-here'" in handle.logs()


def test_futures_helpers_work_on_handles(sched):
    handles = [sched.submit(add, i, i, cpus=0.25) for i in range(4)]
    done, _ = concurrent.futures.wait(handles, timeout=60)
    assert len(done) == 4
    assert sorted(h.result() for h in concurrent.futures.as_completed(handles)) == [0, 2, 4, 6]
    called = []
    handles[0].add_done_callback(called.append)
    assert called == [handles[0]]


def test_unknown_job_id_raises_job_not_found(sched):
    with pytest.raises(JobNotFound):
        sched.get("zzzzzzzz")
    with pytest.raises(JobNotFound):
        sched.get("../../etc")


def test_set_priority_is_recorded(sched):
    blocker = sched.submit(visible_devices, 1.0, gpus=2, cpus=0.25)
    queued = sched.submit(add, 1, 1, gpus=2, cpus=0.25)
    assert sched.set_priority(queued.id, "urgent").priority == 1000
    assert any(e["reason"] == "priority 50 -> 1000" for e in sched.store.events(queued.id))
    with pytest.raises(SpecError):
        sched.set_priority(queued.id, "asap")
    blocker.cancel()
    queued.result(timeout=30)


def test_module_api_and_decorator(home):
    @dls.job(cpus=0.5, priority="high")
    def square(x):
        return x * x

    try:
        handles = square.map([1, 2, 3])
        assert [h.result(timeout=30) for h in handles] == [1, 4, 9]
        assert square(5) == 25
        assert dls.get(handles[0].id).result() == 1
        assert {j.id for j in dls.jobs(state="succeeded")} >= {h.id for h in handles}
        assert dls.jobs()[0].priority == 100
        pool = dls.pool()
        assert [g.simulated for g in pool.gpus] == [True, True]
    finally:
        dls.set_default_scheduler(None)


def test_a_result_is_readable_from_another_process(sched, home):
    handle = sched.submit(add, 20, 22, cpus=0.5)
    handle.wait(timeout=30)
    code = f"import jupyter_dlsched as dls, sys;print(dls.get({handle.id!r}).result(timeout=30))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "42", out.stderr


def test_inline_jobs_run_in_this_process_once_granted(sched):
    seen = {}

    def cell(info):
        seen["pid"] = os.getpid()
        seen["devices"] = info.devices
        dls.progress(1, 1, acc=0.9)
        return object()  # unpicklable values are fine in-process

    handle = sched.submit_inline(cell, gpus=1, cpus=0.5)
    value = handle.result(timeout=30)
    assert isinstance(value, object) and seen["pid"] == os.getpid()
    assert seen["devices"] == handle.devices and handle.info().progress["done"] == 1


def test_an_inline_job_can_be_cancelled_between_python_steps(sched):
    def spin(info):
        while True:
            sum(range(1000))

    handle = sched.submit_inline(spin, cpus=0.5)
    deadline = time.time() + 20
    while handle.state != "running" and time.time() < deadline:
        time.sleep(0.05)
    handle.cancel()
    assert handle.wait(timeout=30).state == "cancelled"


def rank_info():
    import os

    return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}


def rank_fails():
    import os
    import time

    if os.environ["RANK"] == "1":
        raise RuntimeError("rank one broke")
    time.sleep(60)


def test_a_distributed_job_starts_one_process_per_gpu(sched):
    handle = sched.submit(rank_info, gpus=2, cpus=0.5, distributed=True)
    info = handle.result(timeout=30)
    assert info["RANK"] == "0" and info["WORLD_SIZE"] == "2"
    assert info["MASTER_ADDR"] == "127.0.0.1" and int(info["MASTER_PORT"]) > 0


def test_one_failing_rank_fails_the_whole_distributed_job(sched):
    handle = sched.submit(rank_fails, gpus=2, cpus=0.5, distributed=True)
    with pytest.raises(RuntimeError, match="rank one broke"):
        handle.result(timeout=40)
    info = handle.info()
    assert info.reason.startswith("rank 1 failed (RuntimeError: rank 1: rank one broke)")
    assert info.finished - info.started < 30  # rank 0 was stopped, not waited for


def test_schedulers_share_one_ledger(home):
    with Scheduler(home) as a, Scheduler(home) as b:
        handle = a.submit(add, 1, 1, cpus=0.5)
        assert b.get(handle.id).result(timeout=30) == 2


def checkpointing_loop(path, steps):
    """Counts steps into a file; on a stop request saves and exits, resuming next time."""
    import time
    from pathlib import Path

    import jupyter_dlsched as dls

    file = Path(path)
    step = int(file.read_text()) if file.exists() else 0
    while step < steps:
        if dls.checkpoint_requested():
            file.write_text(str(step))
            raise SystemExit(0)
        step += 1
        time.sleep(0.05)
    file.write_text(str(step))
    return step


def test_a_higher_priority_job_preempts_a_preemptible_one_which_resumes(home, tmp_path):
    policy = {"preempt": True, "preempt_grace": 5}
    with Scheduler(home, policy="priority", policy_params=policy, lease_ttl=3) as s:
        ckpt = tmp_path / "step"
        low = s.submit(
            checkpointing_loop, str(ckpt), 60, gpus=2, cpus=0.25, priority="low", preemptible=True
        )
        deadline = time.time() + 20
        while not ckpt.exists() and low.state != "running" and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        urgent = s.submit(add, 1, 1, gpus=1, cpus=0.25, priority="urgent")
        assert urgent.result(timeout=30) == 2
        assert low.result(timeout=60) == 60
        states = [e["to_state"] for e in s.store.events(low.id)]
        assert states == ["queued", "running", "preempted", "running", "succeeded"]
        assert low.info().preemptions == 1
        assert urgent.info().started >= next(
            e["time"] for e in s.store.events(low.id) if e["to_state"] == "preempted"
        )


def hold(path):
    """Run until ``path`` exists."""
    import time
    from pathlib import Path

    while not Path(path).exists():
        time.sleep(0.05)
    return "held"


def test_a_job_that_went_ahead_on_backfills_bet_is_taken_back_when_fifo_would_have_started(
    home, tmp_path, monkeypatch
):
    # Four GPUs. Jobs that finished teach the default policy a run time of about 2 s: h (2
    # GPUs) is decided while l (2 GPUs) and p (1), running, are within it, so it waits with
    # one GPU free and its reservation on l's (l ends first); b (preemptible, long)
    # backfills on the free one. (Once both are past their estimate, a reservation takes
    # the first devices that fit, the free one too: a slow decision left nothing to backfill.)
    # When p ends, h would start under fifo: b is stopped (it saves its step), h starts
    # while l still runs, and b resumes behind it. Before, h waited for b.
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "4x16GiB")
    with Scheduler(home, lease_ttl=3) as s:
        for handle in [s.submit(visible_devices, 2.0, gpus=1, cpus=0.25) for _ in range(3)]:
            handle.result(timeout=30)
        gate_l, gate_p, ckpt = tmp_path / "l", tmp_path / "p", tmp_path / "step"
        # l starts first, so it is the one h's reservation counts on ending first (p's end
        # would give it p's device and the free one, and nothing would be left to backfill)
        long = s.submit(hold, str(gate_l), gpus=2, cpus=0.25)
        wait_for(lambda: long.state == "running", 30, what=lambda: f"l running: {long.state}")
        p = s.submit(hold, str(gate_p), gpus=1, cpus=0.25)
        wait_for(lambda: p.state == "running", 30, what=lambda: f"p running: {p.state}")
        h = s.submit(add, 2, 2, gpus=2, cpus=0.25)
        b = s.submit(checkpointing_loop, str(ckpt), 100_000, gpus=1, cpus=0.25, preemptible=True)
        wait_for(lambda: b.state == "running", 30, what=lambda: f"b backfilled: {b.state}")
        assert h.state == "queued"
        gate_p.touch()
        assert h.result(timeout=60) == 4
        assert long.state == "running"
        states = [e["to_state"] for e in s.store.events(b.id)]
        assert states[:3] == ["queued", "running", "preempted"]
        assert b.info().preemptions == 1
        assert h.info().started >= next(
            e["time"] for e in s.store.events(b.id) if e["to_state"] == "preempted"
        )
        wait_for(lambda: b.state == "running", 60, what=lambda: f"b resumed after h: {b.state}")
        b.cancel()
        gate_l.touch()
        assert long.result(timeout=30) == "held"


def test_reading_the_pool_twice_does_not_count_grants_twice(sched):
    handle = sched.submit(visible_devices, 2.0, gpus=1, cpus=0.25)
    deadline = time.time() + 20
    while handle.state != "running" and time.time() < deadline:
        time.sleep(0.05)
    used = [sched.pool().gpus[handle.devices[0]].mem_used for _ in range(3)]
    assert used == [16 * 2**30] * 3
    handle.result(timeout=30)


def test_result_without_waiting_reads_a_finished_job_from_the_ledger(home):
    with Scheduler(home, loop=False) as s:
        handle = s.submit(add, 2, 3, cpus=0.5)
        # nobody resolves this future in the background: only the ledger knows it ended
        deadline = time.time() + 30
        while s.info(handle.id).state != "succeeded" and time.time() < deadline:
            time.sleep(0.05)
        assert handle.result(timeout=0) == 5

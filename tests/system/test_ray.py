"""The Ray backend against a real local Ray cluster (two CPUs, two pretend GPUs).

The cluster is started once for the module, on loopback only, with its files in
a short temporary folder and ``HOME`` pointed at an empty folder that must stay
empty.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

ray = pytest.importorskip("ray")

from jupyter_dlsched.backends.ray import (  # noqa: E402
    RayBackend,
    _check_fits_one_node,
    _ray_fraction,
    _Unrunnable,
)
from jupyter_dlsched.client.scheduler import Scheduler  # noqa: E402
from jupyter_dlsched.store import TERMINAL  # noqa: E402
from jupyter_dlsched.vocab.errors import JobLost, JobTimeout, RemoteTraceback  # noqa: E402


def until(predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    assert not ray.is_initialized(), "another test left Ray running"
    home = tmp_path_factory.mktemp("home-for-ray")
    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(home))
    patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    patch.setenv("RAY_AUTH_MODE", "disabled")
    # Ray swaps 127.0.0.1 for the machine's address unless clusters are off
    patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    temp = tempfile.mkdtemp(prefix="dlsray", dir="/tmp")  # short: Ray's socket paths
    options: dict[str, Any] = {
        "num_cpus": 2,
        "num_gpus": 2,
        "include_dashboard": False,
        "log_to_driver": False,
        "_temp_dir": temp,
        "_node_ip_address": "127.0.0.1",
    }
    try:
        for attempt in range(3):
            try:
                ray.init(**options)
                break
            except Exception:
                # Ray's raylet waits 15 s for its agents; on a busy machine that can run out
                ray.shutdown()
                if attempt == 2:
                    raise
        yield SimpleNamespace(home=home, temp=temp)
    finally:
        ray.shutdown()
        patch.undo()
        shutil.rmtree(temp, ignore_errors=True)


def notebook_env(home: Path) -> dict[str, str]:
    """The environment of a notebook on this cluster: its address, the ray backend."""
    return {
        "DLSCHED_HOME": str(home),
        "DLSCHED_SIMULATE_GPUS": "2x16GiB",
        "DLSCHED_BACKEND": "ray",
        "DLSCHED_RAY_ADDRESS": ray.get_runtime_context().gcs_address,
    }


@pytest.fixture
def ray_env(cluster: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of the test's own, in a notebook's environment on this cluster."""
    for name, value in notebook_env(tmp_path / "dlsched").items():
        monkeypatch.setenv(name, value)
    return tmp_path / "dlsched"


@pytest.fixture(scope="module")
def pool(cluster: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    """One pool agent and its Ray driver for the module's tests that change neither (a
    driver's start costs seconds of CPU): each test finds the queue empty."""
    home = tmp_path_factory.mktemp("ray-pool") / "dlsched"
    patch = pytest.MonkeyPatch()
    for name, value in notebook_env(home).items():
        patch.setenv(name, value)
    try:
        with Scheduler(home=home) as s:
            yield s
    finally:
        stop_pool(home)
        patch.undo()


def empty_queue(s: Scheduler) -> None:
    for job in s.jobs(state=["queued", "running", "preempted"]):
        s.cancel(job.id)
    until(lambda: all(j.state in TERMINAL for j in s.jobs()), timeout=30)


@pytest.fixture
def sched(pool: Scheduler, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    """A scheduler whose Ray jobs the pool agent's Ray driver runs (the default); the
    module's pool, left with an empty queue."""
    for name, value in notebook_env(pool.home).items():
        monkeypatch.setenv(name, value)
    yield pool
    empty_queue(pool)


@pytest.fixture
def fresh_sched(ray_env: Path) -> Iterator[Scheduler]:
    """As ``sched``, on a pool and driver of the test's own (for tests that change them)."""
    try:
        with Scheduler(home=ray_env) as s:
            yield s
            empty_queue(s)
    finally:
        stop_pool(ray_env)


def stop_pool(home: Path) -> None:
    """Stop the Ray driver and the agent of ``home`` (they would exit when idle)."""
    from jupyter_dlsched.agent.client import AgentClient
    from jupyter_dlsched.agent.service import user_address
    from jupyter_dlsched.backends.ray_driver import driver_alive
    from jupyter_dlsched.store import Store

    if not (home / "ledger.sqlite").exists():
        return
    pid = Store(home).get_meta("ray_driver_pid")
    if isinstance(pid, int) and driver_alive(home):
        os.kill(pid, signal.SIGTERM)
        until(lambda: not driver_alive(home), timeout=30)
    try:
        AgentClient(user_address(home)).call("stop")
    except Exception:
        pass


# -- what runs inside the jobs (imported by the Ray workers through the job's sys.path) ----


def double(x: int) -> int:
    print(f"doubling {x}", flush=True)
    return 2 * x


def fail_loudly() -> None:
    raise ValueError("the learning rate is negative")


def wait_for(path: str, value: Any = None) -> Any:
    deadline = time.time() + 60
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)
    return value


def gpu_grant(release: str) -> dict[str, Any]:
    wait_for(release)
    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ray_gpus": ray.get_gpu_ids(),
        "gpu_share": ray.get_runtime_context().get_assigned_resources().get("GPU"),
    }


def report_and_wait(release: str) -> str:
    import jupyter_dlsched as dls

    print("epoch 1 done", flush=True)
    dls.progress(3, 10, loss=0.5)
    return str(wait_for(release, "released"))


def train_until_preempted(marker: str) -> str:
    import jupyter_dlsched as dls

    if os.path.exists(marker):
        return "resumed from checkpoint"
    deadline = time.time() + 60
    while not dls.checkpoint_requested():
        if time.time() > deadline:
            raise TimeoutError("never asked to checkpoint")
        time.sleep(0.02)
    Path(marker).touch()  # the checkpoint
    return "stopped to checkpoint"


def rank_info() -> dict[str, Any]:
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)
    visible = ",".join(sorted(os.environ["CUDA_VISIBLE_DEVICES"].split(",")))
    return {"rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "visible": visible}


def fail_on_rank_one() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 broke")
    time.sleep(30)


def argument_facts(a: Any, b: Any) -> tuple[float, bool, bool]:
    """What a job sees of two big arguments: their sum, whether the first can be written
    and whether the second is the same memory (one buffer, shared)."""
    import numpy as np

    return float(a.sum() + b[0]), a.flags.writeable, np.shares_memory(a, b)


def rank_sum(a: Any) -> tuple[float, list[str]]:
    """The sum, and the files of a gang's own copies this rank maps the array from."""
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "dlsched-ranks-" in line}
    return float(a.sum()), sorted(Path(m).name for m in mapped)


def train_in_place(t: Any) -> float:
    t.add_(1.0)  # as an optimizer steps a model's weights
    return float(t.sum())


def crash_once(marker: str) -> str:
    if not os.path.exists(marker):
        Path(marker).touch()
        time.sleep(60)
    return "second attempt"


# -- the tests -------------------------------------------------------------------------------


def test_cluster_stays_on_loopback_and_out_of_the_home_folder(
    cluster: SimpleNamespace, sched: Scheduler
) -> None:
    assert sched.submit(double, 1).result(timeout=60) == 2
    nodes = ray.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"]
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    listening = [
        conn.laddr.ip
        for proc in psutil.Process().children(recursive=True)
        for conn in proc.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    ]
    assert listening, "found no Ray process listening"
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in listening), listening
    assert list(Path(cluster.home).iterdir()) == []


def test_scheduler_with_ray_backend_lists_the_cluster_its_driver_joined(
    sched: Scheduler,
) -> None:
    inventory = sched.inventory
    assert inventory["cpus"] == 2
    assert [(g["index"], g["group"]) for g in inventory["gpus"]] == [(0, 0), (1, 0)]
    assert sched.status()["backend"] == "ray"
    assert len(sched.pool().gpus) == 2


def test_without_the_agent_a_scheduler_reuses_this_processs_connection(ray_env: Path) -> None:
    with Scheduler(home=ray_env, agent=False) as s:
        assert isinstance(s.backend, RayBackend)
        assert s.inventory["cpus"] == 2 and len(s.pool().gpus) == 2
        assert s.submit(double, 4).result(timeout=60) == 8


def test_function_round_trip_returns_result_and_streams_output_to_the_log(
    sched: Scheduler,
) -> None:
    h = sched.submit(double, 21, cpus=1)
    assert h.result(timeout=60) == 42
    info = h.info()
    assert (info.state, info.backend, info.host, info.exit_code) == (
        "succeeded",
        "ray",
        "127.0.0.1",
        0,
    )
    assert "doubling 21" in h.logs()
    # a fresh handle in another participant reads the same result from the ledger
    assert sched.get(h.id).result(timeout=5) == 42


def test_map_runs_one_ray_job_per_item(sched: Scheduler) -> None:
    handles = sched.map(double, [1, 2, 3], cpus=0.5)
    assert [h.result(timeout=60) for h in handles] == [2, 4, 6]
    assert {h.info().backend for h in handles} == {"ray"}


def test_output_and_progress_reach_the_ledger_while_the_job_runs(
    sched: Scheduler, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    h = sched.submit(report_and_wait, str(release))
    until(lambda: "epoch 1 done" in h.logs())
    progress = until(lambda: h.info().progress)
    assert (progress["done"], progress["total"], progress["metrics"]) == (3.0, 10, {"loss": 0.5})
    assert h.state == "running"
    release.touch()
    assert h.result(timeout=60) == "released"


def test_command_job_records_exit_code_and_output(sched: Scheduler) -> None:
    ok = sched.submit_command(["sh", "-c", "echo from-the-command"])
    bad = sched.submit_command(["sh", "-c", "exit 3"])
    assert ok.result(timeout=60) == 0
    assert "from-the-command" in ok.logs()
    with pytest.raises(Exception, match="exit code 3"):
        bad.result(timeout=60)
    assert bad.info().exit_code == 3


def test_remote_exception_is_raised_with_its_traceback(sched: Scheduler) -> None:
    h = sched.submit(fail_loudly)
    with pytest.raises(ValueError, match="learning rate is negative") as caught:
        h.result(timeout=60)
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "fail_loudly" in caught.value.__cause__.tb
    info = h.info()
    assert info.state == "failed"
    assert info.reason == "ValueError: the learning rate is negative"
    assert "Traceback" in h.logs()


def test_queue_order_follows_priority_not_submission(sched: Scheduler, tmp_path: Path) -> None:
    release = str(tmp_path / "release")
    blocker = sched.submit(wait_for, release, cpus=2, name="blocker")
    until(lambda: blocker.info().job_pid)
    low = sched.submit(double, 1, cpus=2, priority="low")
    high = sched.submit(double, 2, cpus=2, priority="urgent")
    until(lambda: high.info().position == 1 and low.info().position == 2)
    assert (low.state, high.state) == ("queued", "queued")
    Path(release).touch()
    assert (high.result(timeout=60), low.result(timeout=60)) == (4, 2)
    assert high.info().finished <= low.info().started


def placement_group_table() -> dict[str, Any]:
    from ray.util import placement_group_table as table

    return dict(table())


def test_gang_job_gets_both_gpus_through_a_placement_group(
    sched: Scheduler, tmp_path: Path
) -> None:
    release = str(tmp_path / "release")
    gang = sched.submit(gpu_grant, release, gpus=2)
    until(lambda: gang.info().job_pid)
    groups = [g for g in placement_group_table().values() if g["state"] == "CREATED"]
    assert [(g["name"], g["strategy"], g["bundles"]) for g in groups] == [
        (f"dlsched-{gang.id}", "STRICT_PACK", {0: {"GPU": 2.0, "CPU": 1.0}})
    ]
    single = sched.submit(double, 3, gpus=1)
    time.sleep(0.5)
    assert single.state == "queued"  # both GPUs are held by the gang
    assert gang.devices == [0, 1]
    Path(release).touch()
    grant = gang.result(timeout=60)
    assert sorted(grant["ray_gpus"]) == [0, 1]
    assert sorted(grant["visible"].split(",")) == ["0", "1"]
    assert single.result(timeout=60) == 6
    # the reservation ends with the job
    until(lambda: all(g["state"] == "REMOVED" for g in placement_group_table().values()))


def test_fractional_gpus_share_one_card(sched: Scheduler, tmp_path: Path) -> None:
    release = str(tmp_path / "release")
    halves = [sched.submit(gpu_grant, release, gpus=0.5) for _ in range(2)]
    until(lambda: all(h.info().job_pid for h in halves))  # both run at once
    assert [h.devices for h in halves] == [[0], [0]]
    Path(release).touch()
    for h in halves:
        grant = h.result(timeout=60)
        assert grant["gpu_share"] == 0.5


def test_preempted_job_checkpoints_then_resumes_after_the_urgent_one(
    fresh_sched: Scheduler, tmp_path: Path
) -> None:
    fresh_sched.close()
    with Scheduler(
        home=fresh_sched.home,
        policy="priority",
        policy_params={"preempt": True, "preempt_grace": 30},
    ) as s:
        low = s.submit(
            train_until_preempted, str(tmp_path / "ckpt"), cpus=2, priority="low", preemptible=True
        )
        until(lambda: low.info().job_pid)
        urgent = s.submit(double, 5, cpus=2, priority="urgent")
        assert urgent.result(timeout=60) == 10
        assert low.result(timeout=60) == "resumed from checkpoint"
        states = [e["to_state"] for e in s.store.events(low.id)]
        assert states == ["queued", "running", "preempted", "running", "succeeded"], states
        assert low.info().preemptions == 1
        assert urgent.info().finished <= low.info().started


def test_cancel_stops_the_ray_task(sched: Scheduler) -> None:
    h = sched.submit(time.sleep, 600)
    pid = until(lambda: h.info().job_pid, timeout=180)  # a Ray worker's start, loaded machine
    assert h.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        h.result(timeout=30)
    assert h.info().state == "cancelled"
    until(lambda: not psutil.pid_exists(pid), timeout=30)


def test_killed_worker_is_lost_then_retried(sched: Scheduler, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    h = sched.submit(crash_once, str(marker), retries=1)
    until(marker.exists)  # the first attempt is inside the job's code
    until(lambda: h.info().job_pid is not None)  # recorded a moment after it started
    os.kill(h.info().job_pid, signal.SIGKILL)
    assert h.wait(timeout=60).state == "succeeded", (sched.store.events(h.id), h.logs())
    assert h.result() == "second attempt"
    assert h.info().attempts == 2
    reasons = [e["reason"] for e in sched.store.events(h.id)]
    assert any(r.startswith("retry 1/1 after: lost") for r in reasons), reasons
    assert "[dlsched] attempt 2" in h.logs()


def test_killed_worker_without_retries_is_lost(sched: Scheduler, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    h = sched.submit(crash_once, str(marker))
    until(marker.exists)
    until(lambda: h.info().job_pid is not None)  # recorded a moment after it started
    os.kill(h.info().job_pid, signal.SIGKILL)
    with pytest.raises(JobLost):
        h.result(timeout=60)
    assert h.info().state == "lost"


HAND_BACK_SCRIPT = """
import sys, time
from jupyter_dlsched.client.scheduler import Scheduler

s = Scheduler(home=sys.argv[1], backend="ray", agent=False)
h = s.submit(time.sleep, 2, name="outlives-its-kernel")
while h.info().job_pid is None:
    time.sleep(0.02)
print(h.id, flush=True)
"""


def test_job_of_an_exiting_process_is_requeued_for_the_next_participant(
    cluster: SimpleNamespace, tmp_path: Path
) -> None:
    home = tmp_path / "shared-ledger"
    env = {**os.environ, "DLSCHED_RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run(
        [sys.executable, "-c", HAND_BACK_SCRIPT, str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    with Scheduler(home=home, backend="ray", agent=False) as s:
        h = s.get(job_id)
        reasons = [e["reason"] for e in s.store.events(job_id)]
        assert "requeued: the process that ran it on Ray exited" in reasons
        assert h.result(timeout=60) is None
        assert h.info().attempts == 1  # the interrupted run is not counted


KERNEL_SCRIPT = """
import sys, time
from jupyter_dlsched.client.scheduler import Scheduler
import test_ray

s = Scheduler(home=sys.argv[1], backend="ray")
h = s.submit(test_ray.wait_for, sys.argv[2], "released")
while h.info().job_pid is None:
    time.sleep(0.02)
print(h.id, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_ray_job_outlives_the_kernel_that_queued_it(ray_env: Path, tmp_path: Path) -> None:
    release = tmp_path / "release"
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL_SCRIPT, str(ray_env), str(release)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert kernel.stdout is not None
        job_id = kernel.stdout.readline().strip()
        assert job_id, "the kernel queued nothing"
        kernel.kill()  # kill -9 of the kernel, with its Ray job running
        kernel.wait(timeout=30)
        with Scheduler(home=ray_env) as s:
            h = s.get(job_id)
            time.sleep(1.0)
            assert h.state == "running"  # not handed back, not lost
            release.touch()
            assert h.result(timeout=60) == "released"
            states = [e["to_state"] for e in s.store.events(job_id)]
            assert states == ["queued", "running", "succeeded"], states
    finally:
        if kernel.poll() is None:
            kernel.kill()
        stop_pool(ray_env)


def test_the_agent_restarts_a_killed_ray_driver_and_the_queue_moves_on(
    sched: Scheduler, tmp_path: Path
) -> None:
    from jupyter_dlsched.backends.ray_driver import driver_alive

    assert sched.submit(double, 1).result(timeout=60) == 2
    pid = sched.store.get_meta("ray_driver_pid")
    os.kill(pid, signal.SIGKILL)
    until(lambda: not driver_alive(sched.home), timeout=30)
    h = sched.submit(double, 5)
    assert h.result(timeout=120) == 10
    assert sched.store.get_meta("ray_driver_pid") != pid


def test_time_limit_ends_the_task(sched: Scheduler) -> None:
    h = sched.submit(time.sleep, 60, time_limit="1s")
    with pytest.raises(JobTimeout):
        h.result(timeout=60)
    assert h.info().reason == "time limit 1s reached"


def test_gpu_shares_round_down_so_what_fits_the_ledger_fits_ray() -> None:
    thirds = [_ray_fraction(1 / 3, 0.3) for _ in range(3)]
    assert sum(thirds) <= 1.0
    assert _ray_fraction(0.5, 0.5) == 0.5
    assert _ray_fraction(1e-9, 0.5) == 0.0001


def test_job_bigger_than_every_node_is_refused_with_the_reason(sched: Scheduler) -> None:
    info = sched.info(sched.submit(double, 1).id)
    nodes = [{"gpus": 2, "cpus": 8.0, "mem_total": 2**36}] * 2
    with pytest.raises(
        _Unrunnable, match="requests 4 GPUs on one Ray node; the largest node has 2"
    ):
        _check_fits_one_node(replace(info, gpus=4.0), nodes)
    with pytest.raises(
        _Unrunnable, match="requests 12 CPUs on one Ray node; the largest node has 8"
    ):
        _check_fits_one_node(replace(info, cpus=12.0), nodes)
    _check_fits_one_node(replace(info, gpus=2.0, cpus=8.0), nodes)


def test_distributed_job_runs_one_process_per_gpu(sched: Scheduler) -> None:
    h = sched.submit(rank_info, gpus=2, distributed=True)
    assert h.result(timeout=120) == {"rank": "0", "world": "2", "visible": "0,1"}
    assert h.info().devices == [0, 1]
    assert "rank 0 of 2" in h.logs() and "rank 1 of 2" in h.logs()


def test_failing_rank_fails_the_distributed_job_with_its_traceback(sched: Scheduler) -> None:
    h = sched.submit(fail_on_rank_one, gpus=2, distributed=True)
    with pytest.raises(ValueError, match="rank 1 broke") as caught:
        h.result(timeout=120)
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert h.info().state == "failed"


def test_big_arguments_travel_through_rays_object_store_not_the_ledger(
    sched: Scheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from jupyter_dlsched.store import buffers

    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    x = np.arange(4 * 2**20 // 8, dtype=np.float64)
    h = sched.submit(argument_facts, x, x, cpus=1)
    total, writeable, shared = h.result(timeout=120)
    assert total == float(x.sum())
    # mapped from Ray's object store without a copy, read-only as Ray hands out arrays
    assert not writeable and shared
    assert len(sched.store.read_file(h.id, "payload.pkl") or b"") < 64 * 1024
    folder = buffers.buffer_folder(sched.home)
    assert [p.stat().st_size for p in folder.iterdir()] == [x.nbytes]  # written once

    # a gang's ranks are not Ray workers: they map the copy written on their node
    gang = sched.submit(rank_sum, x, gpus=2, distributed=True)
    assert gang.result(timeout=120) == (float(x.sum()), ["buffer.0"])
    # a sweep's function carries the array too (pickled once for all its members)
    swept = sched.map(lambda k: float(x.sum()) * k, [1, 2], cpus=1)
    assert [m.result(timeout=120) for m in swept] == [float(x.sum()), 2 * float(x.sum())]


def test_a_tensor_from_rays_object_store_may_be_trained_in_place(
    sched: Scheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch cannot mark a tensor read-only: one over Ray's shared memory is a copy, so a
    job that writes into it changes neither the stored object nor another job's view."""
    torch = pytest.importorskip("torch")
    from jupyter_dlsched.store import buffers

    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    weights = torch.ones(2**20)
    first = sched.submit(train_in_place, weights, cpus=1)
    assert first.result(timeout=120) == 2.0 * 2**20
    assert "not writable" not in first.logs()
    again = sched.submit(train_in_place, weights, cpus=1)  # the same stored bytes
    assert again.result(timeout=120) == 2.0 * 2**20


def test_a_driver_that_cannot_join_says_why_and_clients_of_the_old_cluster_are_refused(
    fresh_sched: Scheduler, ray_env: Path
) -> None:
    sched = fresh_sched
    from jupyter_dlsched.agent.protocol import AgentUnavailable
    from jupyter_dlsched.vocab.errors import SpecError

    assert sched.submit(double, 1).result(timeout=60) == 2
    # another notebook asks for a cluster the driver cannot join (ray.init refuses it)
    with pytest.raises(AgentUnavailable, match="no_such_option") as caught:
        Scheduler(home=ray_env, init_options={"no_such_option": 1})
    assert "did not join the cluster" in str(caught.value)
    # the state folder's Ray jobs no longer go where this scheduler joined: refused, not moved
    with pytest.raises(SpecError, match="another Scheduler switched to"):
        sched.submit(double, 2)

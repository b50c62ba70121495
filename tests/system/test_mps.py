"""Fractions of a GPU held by MPS: a stand-in ``nvidia-cuda-mps-control`` on PATH (a small
program that records what it was asked and runs a stand-in daemon, as the real one answers)
and a simulated GPU are the fakes; the pool, its supervisors, the jobs and the CLI are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import standins
from conftest import wait_for
from team_pool import RESULT, shared_pool

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.machine.mps import MpsDaemons

GiB = 2**30


@pytest.fixture
def mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in on PATH; returns the file it records its calls in."""
    bin_dir, log = tmp_path / "bin", tmp_path / "mps-calls.jsonl"
    bin_dir.mkdir()
    standins.install(bin_dir, "nvidia-cuda-mps-control", log)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[dict]:
    return standins.recorded(log)


def held_until(release: str) -> dict[str, str]:
    """A job that holds its grant until ``release`` exists; what CUDA would read of MPS.
    ``release.started`` says the job's own code runs: its supervisor has joined it to MPS
    (the ledger says "running" from its launch, before that)."""
    Path(release + ".started").touch()
    while not Path(release).exists():
        time.sleep(0.05)
    return {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}


def dlsched_status() -> str:
    dlsched = Path(sys.executable).with_name("dlsched")
    out = subprocess.run([str(dlsched), "status"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def test_fractional_jobs_run_as_clients_of_one_mps_daemon_started_and_stopped_for_them(
    home: Path, mps: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    with Scheduler(home) as s:
        first = s.submit(held_until, str(tmp_path / "go-1"), gpus=0.5, gpu_mem="4GiB")
        wait_for((tmp_path / "go-1.started").exists, timeout=60)
        [start] = wait_for(lambda: calls(mps), timeout=30)
        assert start["args"] == ["-d"] and start["uid"] == os.getuid()
        assert Path(start["pipe"]).parent == home / "mps" / "gpu0"
        daemon = psutil.Process(start["pid"])
        assert f"fractions: MPS ({psutil.Process().username()})" in dlsched_status()

        second = s.submit(held_until, str(tmp_path / "go-2"), gpus=0.25, gpu_mem="2GiB")
        wait_for((tmp_path / "go-2.started").exists, timeout=60)
        assert s.info(second.id).devices == s.info(first.id).devices == [0]
        assert len(calls(mps)) == 1  # one daemon per GPU, whatever the number of jobs

        (tmp_path / "go-1").touch()
        env = first.result(timeout=60)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == start["pipe"]
        assert env["CUDA_VISIBLE_DEVICES"] == start["device"]
        time.sleep(0.5)
        assert len(calls(mps)) == 1 and daemon.is_running()  # the second job still uses it

        (tmp_path / "go-2").touch()
        env = second.result(timeout=60)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        stop = wait_for(lambda: calls(mps)[1:], timeout=30)[0]
        assert stop["stdin"] == "quit" and stop["pipe"] == start["pipe"]
        psutil.wait_procs([daemon], timeout=10)
        assert not daemon.is_running()
        assert "fractions: MPS\n" in dlsched_status() + "\n"

        # a whole GPU is its job's alone: no MPS
        whole = s.submit(held_until, str(tmp_path / "go-1"), gpus=1).result(timeout=60)
        assert not any(k.startswith("CUDA_MPS_") for k in whole)
        assert len(calls(mps)) == 2


def test_without_mps_a_fraction_keeps_the_cap_and_watch_and_status_says_so(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # no nvidia-cuda-mps-control
    (tmp_path / "go").touch()
    with Scheduler(home) as s:
        env = s.submit(held_until, str(tmp_path / "go"), gpus=0.5, gpu_mem="4GiB").result(60)
        assert not any(k.startswith("CUDA_MPS_") for k in env)
        assert s.pool().gpus[0].fractions == "cap + watch"
    assert "fractions: cap + watch" in dlsched_status()


def test_an_mps_gpu_serves_one_user_and_another_users_fraction_keeps_the_cap(
    mps: Path, tmp_path: Path
) -> None:
    """An MPS daemon runs one user's server at a time (another user's clients would wait for
    every client of the first to end): the GPU's daemon is its first user's."""
    daemons = MpsDaemons(tmp_path / "home")

    def job(name: str) -> SimpleNamespace:
        placement = SimpleNamespace(shared=True, gpus=(0,), gpu_mem=(4 * GiB,))
        return SimpleNamespace(id=name, gpus=0.5, placement=placement)

    mine = daemons.join(job("a"), uid=os.getuid(), device="GPU-0")
    assert mine["CUDA_VISIBLE_DEVICES"] == "GPU-0" and len(calls(mps)) == 1
    assert daemons.join(job("b"), uid=os.getuid() + 1, device="GPU-0") == {}
    assert daemons.sharing([0]) == {0: f"MPS ({psutil.Process().username()})"}
    assert not daemons.leave("b", 0) and daemons.leave("a", 0)
    assert [c.get("stdin") for c in calls(mps)] == [None, "quit"]


#: a user's script: one job that holds a GPU share until a file exists, and returns what it
#: saw of MPS; prints the job's id
SUBMIT_SHARE = """
import sys
import jupyter_dlsched as dls

def held_until(release):
    import os, time
    while not os.path.exists(release):
        time.sleep(0.05)
    return {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}

h = dls.Scheduler(loop=False).submit(held_until, sys.argv[1], gpus=0.5, gpu_mem="4GiB")
print(h.id, flush=True)
"""


def test_in_a_shared_pool_a_gpus_mps_daemon_is_its_first_users_and_another_user_keeps_the_cap(
    team_users,
) -> None:
    a, b = team_users
    # the stand-in and its record where every user reaches them
    shared = Path(tempfile.mkdtemp(prefix="dlsched-mps-"))
    os.chmod(shared, 0o777)
    log, release = shared / "calls.jsonl", shared / "go"
    standins.install(shared, "nvidia-cuda-mps-control", log)
    path = f"{shared}{os.pathsep}{os.environ['PATH']}"
    try:
        with shared_pool(env={"PATH": path, "DLSCHED_SIMULATE_GPUS": "1x16GiB"}) as service:
            first = service.as_user(a, SUBMIT_SHARE, str(release))
            assert first.returncode == 0, first.stderr
            wait_for(lambda: service.job(first.stdout.strip())["state"] == "running", timeout=60)
            [start] = wait_for(lambda: calls(log), timeout=30)
            assert start["args"] == ["-d"] and start["uid"] == a.uid  # run as the job's user
            second = service.as_user(b, SUBMIT_SHARE, str(release))
            assert second.returncode == 0, second.stderr
            wait_for(lambda: service.job(second.stdout.strip())["state"] == "running", timeout=60)
            # (one GPU in this pool: both shares are on it)

            release.touch()
            seen = {}
            for user, done in ((a, first), (b, second)):
                got = service.as_user(user, RESULT, done.stdout.strip(), "60")
                assert got.returncode == 0, got.stderr
                seen[user.name] = json.loads(got.stdout)
            assert seen[a.name]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
            # the other user's share on the same GPU is no client of the first user's daemon
            assert not any(k.startswith("CUDA_MPS_") for k in seen[b.name])
            stop = wait_for(lambda: calls(log)[1:], timeout=30)[0]
            assert stop["stdin"] == "quit"
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)

"""GPU use outside the pool, attributed: a process on a GPU that no job owns is shown with its
Unix user, command and memory, and gone once it ends. NVML's process list is the one fake (this
machine has no GPU); the processes, users, server and ledger are real."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from nvml_fake import fake_nvml

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.machine.metrics import parse

pool = importlib.import_module("jupyter_dlsched.machine.inventory")
nvml = importlib.import_module("jupyter_dlsched.machine.nvml")
pytest_plugins = ["pytest_jupyter.jupyter_server"]
GiB = 2**30


@pytest.fixture
def gpu_processes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """One real-looking H200 whose NVML process list is this list (only live pids count, as
    NVML lists only running processes)."""
    listed: list[tuple[int, int]] = []

    class Live(list):
        def __iter__(self):  # type: ignore[override]
            import psutil

            return iter([(pid, used) for pid, used in listed if psutil.pid_exists(pid)])

    nv = fake_nvml([("NVIDIA H200", 141 * GiB, 20 * GiB, 50, Live())])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(nvml, "_state", {})
    monkeypatch.setattr(pool, "_cache", {})
    monkeypatch.delenv("DLSCHED_SIMULATE_GPUS", raising=False)
    return listed


@pytest.fixture
def sleeper(other_user) -> Iterator[subprocess.Popen[bytes]]:
    """``sleep 300`` run by another Unix user: a process on the GPU nobody asked the pool for."""
    import psutil

    proc = subprocess.Popen(other_user.command("sleep", "300"))
    # setpriv changes user, then execs: until both are done the pid is root's setpriv, or a
    # process between images whose command line reads empty.
    try:
        process = psutil.Process(proc.pid)
        wait_for(
            lambda: (process.username(), process.cmdline()) == (other_user.name, ["sleep", "300"])
        )
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_gpu_process_outside_the_pool_is_shown_with_its_user_and_command(
    gpu_processes, sleeper, other_user, tmp_path: Path
) -> None:
    gpu_processes.append((sleeper.pid, 12 * GiB))
    with Scheduler(tmp_path / "home", agent=False, loop=False) as s:
        wait_for(lambda: s.pool().gpus[0].processes, timeout=10)
        [gpu] = s.pool().gpus
        [process] = gpu.processes
        assert (process.pid, process.used_mem, process.job_id) == (sleeper.pid, 12 * GiB, None)
        assert (process.user, process.command) == (other_user.name, "sleep 300")
        # `dlsched status` prints the pool this way, and a notebook's repr too
        line = f"outside the pool: {other_user.name} · 12 GiB · pid {sleeper.pid} · sleep 300"
        assert line in str(s.pool()) and line in repr(s.pool())


def test_a_jobs_own_gpu_processes_are_the_jobs_down_to_its_grandchildren(
    gpu_processes, tmp_path: Path
) -> None:
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)"
    )
    with Scheduler(tmp_path / "home", agent=False, loop=True) as s:
        job = s.submit_command([sys.executable, "-c", code], gpus=1)
        log = s.store.spool(job.id) / "log"
        line = wait_for(lambda: log.exists() and log.read_text().strip(), timeout=60)
        child = int(line.split()[0])
        main = s.get(job.id).info().job_pid
        gpu_processes.extend([(main, GiB), (child, 2 * GiB)])

        def attributed() -> dict[int, str | None]:
            [gpu] = s.pool().gpus  # a reading at most a second old
            return {p.pid: p.job_id for p in gpu.processes}

        wait_for(lambda: len(attributed()) == 2, timeout=10)
        assert attributed() == {main: job.id, child: job.id}
        s.cancel(job.id)


@pytest.fixture
def jp_server_config(gpu_processes, tmp_path: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}},
        "DlschedApp": {"home": str(tmp_path / "dlsched"), "sample_interval": 0},
    }


async def test_rest_and_metrics_name_the_user_on_a_gpu_until_the_process_ends(
    jp_fetch: Any, gpu_processes, sleeper, other_user
) -> None:
    import asyncio
    import json
    import time

    async def outside() -> list[dict[str, Any]]:
        answer = await jp_fetch("dlsched", "api", "v1", "pool")
        [gpu] = json.loads(answer.body)["gpus"]
        return [p for p in gpu["processes"] if p["job_id"] is None]

    gpu_processes.append((sleeper.pid, 12 * GiB))
    started = time.monotonic()
    while not await outside():
        assert time.monotonic() - started < 10, "not shown within 10 s"
        await asyncio.sleep(0.2)
    [shown] = await outside()
    assert (shown["user"], shown["command"], shown["used_mem"]) == (
        other_user.name,
        "sleep 300",
        12 * GiB,
    )
    metrics = parse((await jp_fetch("dlsched", "metrics")).body.decode())
    assert [(labels, v) for labels, v, _ in metrics["dlsched_gpu_outside_memory_bytes"]] == [
        ({"gpu": "0", "user": other_user.name}, 12 * GiB)
    ]
    sleeper.kill()
    sleeper.wait()
    ended = time.monotonic()
    while await outside():
        assert time.monotonic() - ended < 10, "still shown 10 s after it ended"
        await asyncio.sleep(0.2)

"""An idle GPU kernel suspended instead of shut down: a stand-in ``cuda-checkpoint`` on PATH
(a small program that records what it was asked and answers as the real one does) and a
simulated GPU are the fakes; the kernels, their leases, the pool and the jobs are real."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import standins
from conftest import wait_for
from jupyter_client import KernelManager

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.kernels import control
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install
from jupyter_dlsched.kernels.suspend import Checkpointer, reclaim_decision, restore_refusal

HOLD_GPU = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in on PATH; returns the file its toggles are recorded in."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "toggles.jsonl"
    standins.install(bin_dir, "cuda-checkpoint", calls)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def toggles(calls: Path) -> list[tuple[int, str]]:
    return [(e["pid"], e["to"]) for e in standins.recorded(calls)]


@pytest.fixture
def pool(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    install(GpuKernelRequest(gpus=1, idle="2s", idle_grace="2s"), user=True, name="gpu-idle")
    with Scheduler(home, loop=False) as s:
        yield s
        for job in s.jobs(state=("queued", "running")):
            s.cancel(job.id)


class Kernel:
    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="gpu-idle")
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.folder = Path(self.manager.provisioner.folder)  # type: ignore[union-attr,arg-type]
        self.pid = int(self.manager.provisioner.pid)  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 120) -> tuple[str, dict[str, Any]]:
        """What the cell printed, and its reply's content."""
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                out.append(msg["content"]["evalue"])

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        return "".join(out), reply["content"]

    def stop(self) -> None:
        self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel(pool: Scheduler) -> Iterator[Kernel]:
    started = Kernel()
    yield started
    started.stop()


def suspended_while_a_job_waits(pool: Scheduler, kernel: Kernel) -> Any:
    """Leave the kernel idle while a job waits for its GPU, until the job runs."""
    job = pool.submit_command(HOLD_GPU, gpus=1, name="waits-for-gpu")
    wait_for(lambda: pool.info(job.id).state == "running", timeout=60)
    return job


def test_an_idle_kernel_is_suspended_and_its_next_cell_waits_for_a_gpu_and_is_restored(
    checkpoint: Path, pool: Scheduler, kernel: Kernel
) -> None:
    kernel.run("x = 41")
    first_lease = kernel.manager.provisioner.job_id  # type: ignore[union-attr]
    job = suspended_while_a_job_waits(pool, kernel)
    ended = control.read(kernel.folder, "ended.json")
    assert ended is not None and ended["ended"] == "suspended", ended
    assert "next cell waits in line" in ended["message"]
    assert toggles(checkpoint) == [(kernel.pid, "checkpointed")]
    assert kernel.manager.is_alive()  # the kernel process lives on, its GPU given away
    assert pool.info(first_lease).state == "succeeded"

    # the next cell waits in line for the GPU the job holds ...
    printed: list[Any] = []
    cell = threading.Thread(target=lambda: printed.append(kernel.run("print(x + 1)")))
    cell.start()
    waiting = wait_for(
        lambda: [j for j in pool.jobs(state="queued") if j.kind == "kernel"], timeout=30
    )
    time.sleep(0.5)
    assert cell.is_alive() and toggles(checkpoint) == [(kernel.pid, "checkpointed")]
    # ... is restored once the job lets go, and runs in the same kernel (its state kept)
    pool.cancel(job.id)
    cell.join(timeout=60)
    out, reply = printed[0]
    assert reply["status"] == "ok" and out.strip().endswith("42"), (out, reply)
    assert "waits in line for a GPU" in out
    assert toggles(checkpoint)[-1] == (kernel.pid, "running")
    [lease] = waiting
    assert pool.info(lease.id).state == "running"
    assert pool.info(lease.id).placement.gpus == (0,)  # type: ignore[union-attr]

    # a restored kernel is suspended again before it is killed (cuda-checkpoint#53)
    pool.cancel(lease.id)
    wait_for(lambda: not kernel.manager.is_alive(), timeout=30)
    assert toggles(checkpoint)[-1] == (kernel.pid, "checkpointed")


def test_a_restore_without_room_on_the_gpu_is_refused_and_the_kernel_stays_suspended(
    checkpoint: Path, pool: Scheduler, kernel: Kernel
) -> None:
    job = suspended_while_a_job_waits(pool, kernel)
    pool.cancel(job.id)
    # the kernel held more than the GPU has free (NVIDIA/cuda-checkpoint#44: a restore
    # after out-of-memory leaves the process stuck)
    suspended = control.read(kernel.folder, "suspended.json")
    assert suspended is not None and suspended["pid"] == kernel.pid
    control.write(kernel.folder, "suspended.json", {**suspended, "held": 64 * 2**30})
    out, reply = kernel.run("print('ran')")
    assert reply["status"] == "error" and "ran" not in out.split(), out
    assert "GPU 0 has 16.0 GiB free, the kernel needs 64.0 GiB to be restored" in out
    assert toggles(checkpoint) == [(kernel.pid, "checkpointed")]  # no restore tried

    control.write(kernel.folder, "suspended.json", suspended)
    out, reply = kernel.run("print('ran')")
    assert reply["status"] == "ok" and out.strip().endswith("ran")
    assert toggles(checkpoint)[-1] == (kernel.pid, "running")


def test_a_kernel_in_a_process_group_is_shut_down_not_suspended(
    checkpoint: Path, pool: Scheduler, kernel: Kernel, tmp_path: Path
) -> None:
    kernel.run(
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, "
        "world_size=1)"
    )
    suspended_while_a_job_waits(pool, kernel)
    ended = control.read(kernel.folder, "ended.json")
    assert ended is not None and ended["ended"] == "reclaimed"
    assert "not suspended: the kernel is in a torch.distributed process group" in ended["message"]
    assert toggles(checkpoint) == []
    wait_for(lambda: not kernel.manager.is_alive(), timeout=30)


def test_without_cuda_checkpoint_a_reclaim_shuts_down_and_says_why(
    pool: Scheduler, kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    suspended_while_a_job_waits(pool, kernel)
    ended = control.read(kernel.folder, "ended.json")
    assert ended is not None and ended["ended"] == "reclaimed"
    assert "not suspended: no cuda-checkpoint program on PATH" in ended["message"]


def test_the_reclaim_rules(checkpoint: Path, tmp_path: Path) -> None:
    here = Checkpointer()
    assert here.supported() is None
    assert reclaim_decision(here, {}).action == "suspend"
    assert reclaim_decision(here, {"process_group": True}).action == "shutdown"
    old = tmp_path / "old-cuda-checkpoint"
    old.write_text("#!/bin/sh\necho usage: cuda-checkpoint --pid PID\n")
    old.chmod(0o755)
    refused = reclaim_decision(Checkpointer(str(old)), {})
    assert refused.action == "shutdown" and "needs NVIDIA driver 550" in refused.reason
    assert restore_refusal(2 * 2**30, {0: 4 * 2**30}) is None
    assert restore_refusal(8 * 2**30, {0: 80 * 2**30, 1: 4 * 2**30}) == (
        "GPU 1 has 4.0 GiB free, the kernel needs 8.0 GiB to be restored"
    )

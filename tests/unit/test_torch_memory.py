"""GPU memory grants: NVML accounting, PyTorch's memory fraction, the supervisor's stop.

There is no GPU here, so NVML (and, for one test, CUDA) is faked at its
boundary: the ``pynvml`` functions, or a stand-in ``pynvml`` module that the
real supervisor process imports.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from jupyter_dlsched.machine import gpu_watch
from jupyter_dlsched.machine import nvml as nvml_gateway
from jupyter_dlsched.vocab.units import format_size

torch = pytest.importorskip("torch")

import jupyter_dlsched.torch as dlt  # noqa: E402
from jupyter_dlsched.inside import job_device  # noqa: E402

GiB = 2**30
MiB = 2**20


@pytest.fixture
def nvml(monkeypatch):
    """Two cards, 40 GiB (index 0) and 80 GiB (index 1); ``procs[index]`` lists (pid, bytes)."""
    sizes = {0: 40 * GiB, 1: 80 * GiB}
    procs: dict[int, list[tuple[int, int | None]]] = {0: [], 1: []}
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(sizes))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h: SimpleNamespace(total=sizes[h[1]], used=0, free=sizes[h[1]]),
    )
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs[h[1]]],
    )
    monkeypatch.setattr(nvml_gateway, "_state", {})
    monkeypatch.setattr(job_device, "_applied_fractions", None)
    return procs


def test_job_gpu_memory_sums_the_jobs_processes_per_gpu(nvml):
    nvml[0] = [(100, 3 * GiB), (101, 1 * GiB), (999, 20 * GiB)]
    nvml[1] = [(101, 512 * MiB), (102, None)]  # None: NVML could not tell
    assert gpu_watch.job_gpu_memory({100, 101, 102}) == {0: 4 * GiB, 1: 512 * MiB}
    assert gpu_watch.job_gpu_memory({555}) == {}


def test_job_gpu_memory_is_empty_without_a_driver(monkeypatch):
    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    monkeypatch.setattr(nvml_gateway, "_state", {})
    assert gpu_watch.job_gpu_memory({os.getpid()}) == {}
    assert "NVML" in (gpu_watch.nvml_error() or "")


def test_over_grant_names_the_gpu_the_use_and_the_limit():
    assert gpu_watch.over_grant({0: 8 * GiB}, {0: 8 * GiB}) is None
    assert gpu_watch.over_grant({1: 9 * GiB}, {0: 8 * GiB, 1: 8 * GiB}) == (
        f"GPU out of memory: used {format_size(9 * GiB)}, limit {format_size(8 * GiB)} on GPU 1"
    )


def test_memory_fraction_is_the_grant_less_context_over_the_visible_card(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # cuda:0 is the 80 GiB card
    monkeypatch.setenv("DLSCHED_GPU_MEM", str(10 * GiB))
    margin = job_device.OUTSIDE_ALLOCATOR_MARGIN
    assert dlt.memory_fractions() == {0: (10 * GiB - margin) / (80 * GiB)}
    context = {0: 500 * MiB}
    assert dlt.memory_fractions(context) == {0: (10 * GiB - 500 * MiB - margin) / (80 * GiB)}


def test_a_grant_smaller_than_the_cuda_context_is_refused(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("DLSCHED_GPU_MEM", str(600 * MiB))
    with pytest.raises(dlt.GpuGrantTooSmall, match="larger gpu_mem"):
        dlt.memory_fractions({0: 500 * MiB})


def test_jobs_that_own_their_gpus_get_no_fraction(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("DLSCHED_GPU_MEM", raising=False)
    assert dlt.memory_fractions() == {}


def test_the_fraction_is_applied_after_measuring_the_context_and_only_once(nvml, monkeypatch):
    # CUDA is faked at its edge too: creating the context makes NVML list this process
    calls = []

    def create_context(index):
        calls.append(("context", index))
        nvml[1].append((os.getpid(), 600 * MiB))
        return (80 * GiB, 80 * GiB)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", create_context)
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda fraction, index: calls.append(("fraction", index, fraction)),
    )
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("device", index)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("DLSCHED_GPU_MEM", str(10 * GiB))
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    assert dlt.device() == torch.device("cuda", 0)
    assert dlt.device() == torch.device("cuda", 0)
    expected = (10 * GiB - 600 * MiB - job_device.OUTSIDE_ALLOCATOR_MARGIN) / (80 * GiB)
    assert calls == [("context", 0), ("fraction", 0, expected), ("device", 0), ("device", 0)]


# -- the supervisor stops a shared-GPU job that outgrows its grant ----------------------------

FAKE_PYNVML = '''
"""Stand-in NVML: two GPUs whose processes are listed in the JSON file $FAKE_NVML_PROCS."""
import json, os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=16 * 2**30, used=0, free=16 * 2**30)


def nvmlDeviceGetComputeRunningProcesses(handle):
    try:
        with open(os.environ["FAKE_NVML_PROCS"]) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return []
    return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in table.get(str(handle), [])]
'''


def hold_gpu_memory(table, marker):
    """Report 6 GiB on the job's GPU (under its grant), then 12 GiB (over it)."""
    gpu = os.environ["DLSCHED_DEVICES"]

    def report(amount):
        tmp = table + ".tmp"
        Path(tmp).write_text(json.dumps({gpu: [[os.getpid(), amount]]}))
        os.replace(tmp, table)

    report(6 * 2**30)
    time.sleep(1.5)  # several of the supervisor's checks pass while within the grant
    Path(marker).touch()
    report(12 * 2**30)
    time.sleep(60)
    return "not stopped"


def test_the_supervisor_stops_a_shared_job_over_its_gpu_memory_grant(home, tmp_path, monkeypatch):
    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(textwrap.dedent(FAKE_PYNVML))
    table = tmp_path / "procs.json"
    # supervisors (forked by a launcher started from this environment) import the stand-in
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_NVML_PROCS", str(table))
    from jupyter_dlsched.client.scheduler import Scheduler

    marker = tmp_path / "went-over"
    # agent=False: the stand-in NVML is for job supervisors only, not for probing the pool
    with Scheduler(home, lease_ttl=3.0, grace=2.0, agent=False) as sched:
        handle = sched.submit(hold_gpu_memory, str(table), str(marker), gpu_mem="8GiB")
        info = handle.wait(timeout=60)
    assert marker.exists()  # it was not stopped while within its grant
    assert info.state == "failed"
    used, limit = format_size(12 * GiB), format_size(8 * GiB)
    assert info.reason == f"GPU out of memory: used {used}, limit {limit} on GPU {info.devices[0]}"

"""The pool: NVML faked at its boundary (this machine has no GPU), psutil real."""

from __future__ import annotations

import importlib
import sys

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.engine.tick import idle_capacity_minus

# the module, not ``dls.pool()``, which shadows it as an attribute of the package
pool = importlib.import_module("jupyter_dlsched.machine.inventory")
nvml_gateway = importlib.import_module("jupyter_dlsched.machine.nvml")

from nvml_fake import FakeNVMLError, fake_nvml  # noqa: E402

GiB = 2**30


@pytest.fixture
def nvml(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        monkeypatch.setattr(nvml_gateway, "_state", {})
        monkeypatch.setattr(pool, "_cache", {})
        monkeypatch.delenv("DLSCHED_SIMULATE_GPUS", raising=False)

    return install


def test_gpus_are_read_through_nvml_with_their_processes(nvml):
    nvml(fake_nvml([("NVIDIA H200", 141 * GiB, 12 * GiB, 87, [(4242, 12 * GiB)])]))
    info = pool.probe()
    [gpu] = info.gpus
    assert (gpu.name, gpu.uuid, gpu.mem_total, gpu.mem_used, gpu.util) == (
        "NVIDIA H200",
        "GPU-0",
        141 * GiB,
        12 * GiB,
        87.0,
    )
    assert [(p.pid, p.used_mem) for p in gpu.processes] == [(4242, 12 * GiB)]
    assert gpu.external_mem == 12 * GiB and not gpu.simulated
    assert info.gpu_error is None and info.cpus >= 1 and info.mem_total > 0


def test_no_driver_means_a_cpu_only_pool_with_the_reason(nvml):
    broken = fake_nvml([])

    def no_library():
        raise FakeNVMLError("NVML Shared Library Not Found")

    broken.nvmlInit = no_library
    nvml(broken)
    info = pool.probe()
    assert info.gpus == []
    assert "NVML Shared Library Not Found" in info.gpu_error


def test_simulated_gpus_come_after_real_ones_and_say_so(nvml, monkeypatch):
    nvml(fake_nvml([("NVIDIA A100", 80 * GiB, 0, 0, [])]))
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB,1x24GiB")
    info = pool.probe()
    assert [(g.index, g.simulated, g.mem_total) for g in info.gpus] == [
        (0, False, 80 * GiB),
        (1, True, 16 * GiB),
        (2, True, 24 * GiB),
    ]
    assert "[simulated]" in repr(info)


def test_bad_simulation_setting_is_a_clear_error():
    with pytest.raises(ValueError, match="DLSCHED_SIMULATE_GPUS='lots'"):
        pool.parse_simulated("lots")


def test_topology_islands_from_pcie_switches_and_nvlink(nvml):
    four = [(f"GPU{i}", 16 * GiB, 0, 0, []) for i in range(4)]
    nvml(fake_nvml(four, topology={(0, 1): 10}, nvlink={(2, 3)}))
    groups = [g.group for g in pool.probe().gpus]
    assert groups[0] == groups[1] and groups[2] == groups[3] and groups[0] != groups[2]


def test_memory_used_outside_the_scheduler_counts_as_taken(nvml, tmp_path):
    nvml(fake_nvml([("GPU", 16 * GiB, 10 * GiB, 50, [(999999, 10 * GiB)])]))
    # agent=False: NVML is faked in this process only, so this process must decide
    with Scheduler(tmp_path / "home", loop=False, agent=False) as s:
        external = s.backend.external_gpu_mem([])
        assert external == {0: 10 * GiB}
        capacity = idle_capacity_minus(s.inventory, [], external)
        assert capacity.gpus[0].mem_free == 6 * GiB
        # a 4 GiB share fits beside the stranger's 10 GiB, an 8 GiB share does not
        from jupyter_dlsched.vocab.placement import place
        from jupyter_dlsched.vocab.resources import Request

        assert place(Request(gpus=0.25, gpu_mem=4 * GiB), capacity) is not None
        assert place(Request(gpus=0.5, gpu_mem=8 * GiB), capacity) is None


def test_the_pool_and_a_jobs_watch_read_nvmls_not_available_the_same_way(nvml):
    """NVML lists a process whose memory the caller may not read with an unsigned -1: the
    pool's outside use and a job's own GPU memory both count it as nothing known."""
    from jupyter_dlsched.machine import gpu_watch

    not_available = 2**64 - 1
    nvml(fake_nvml([("NVIDIA H200", 141 * GiB, 0, 0, [(4242, not_available), (4243, None)])]))
    [gpu] = pool.probe().gpus
    assert [(p.pid, p.used_mem) for p in gpu.processes] == [(4242, 0), (4243, 0)]
    assert gpu.external_mem == 0
    assert gpu_watch.job_gpu_memory({4242, 4243}) == {}

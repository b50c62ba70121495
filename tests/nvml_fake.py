"""A stand-in ``pynvml``: NVML is the one edge the tests fake (this machine has no GPU)."""

from __future__ import annotations

import types
from types import SimpleNamespace


class FakeNVMLError(Exception):
    pass


def fake_nvml(gpus, topology=None, nvlink=()):
    """A stand-in ``pynvml`` with ``gpus`` = [(name, total, used, util, [(pid, used)])]."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_TOPOLOGY_MULTIPLE = 20
    nv.NVML_P2P_CAPS_INDEX_NVLINK = 3
    nv.NVML_P2P_STATUS_OK = 0
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetName = lambda h: gpus[h][0]
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=gpus[h][1], used=gpus[h][2])
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=gpus[h][3], memory=99)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpus[h][4]
    ]
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    levels = topology or {}
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: levels.get((min(a, b), max(a, b)), 50)
    nv.nvmlDeviceGetP2PStatus = lambda a, b, cap: 0 if (min(a, b), max(a, b)) in nvlink else 1
    return nv

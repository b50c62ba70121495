"""GPU memory that given processes really use, measured through NVML.

The supervisor of a job that shares a GPU calls :func:`job_gpu_memory` from
its monitor loop (twice a second) and stops the job when it holds more than
its grant. Inside a job, :mod:`jupyter_dlsched.torch` reads the card sizes
from here to turn a grant into PyTorch's per-process memory fraction.

NVML is reached through ``nvml.py``, the package's one gateway. Without an NVIDIA
driver (or without ``nvidia-ml-py``) every function answers "nothing known" (an
empty dict) instead of failing.

>>> from jupyter_dlsched.machine.gpu_watch import job_gpu_memory
>>> job_gpu_memory({os.getpid()})  # doctest: +SKIP
{0: 1073741824}

NVML reports process ids as the host sees them; inside a container with its
own PID namespace they may not match the job's, and then nothing is counted.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..vocab.units import format_size
from . import nvml


def nvml_error() -> str | None:
    """Why NVML is unusable in this process, or None when it works."""
    return nvml.error()


def job_gpu_memory(pids: Iterable[int]) -> dict[int, int]:
    """Bytes of GPU memory held by ``pids``, per NVML GPU index (GPUs they hold nothing on left out).

    >>> job_gpu_memory({1234, 1240})  # doctest: +SKIP
    {0: 6442450944, 2: 1073741824}

    Empty when NVML is absent. A GPU NVML cannot read (lost, or not supported)
    is skipped rather than failing the caller.
    """
    wanted = set(pids)
    if not wanted:
        return {}
    try:
        nv = nvml.module()
    except nvml.NvmlUnavailable:
        return {}
    used: dict[int, int] = {}
    try:
        count = int(nv.nvmlDeviceGetCount())
    except Exception:
        return {}
    for index in range(count):
        try:
            rows = nvml.processes(nv, nvml.handle(nv, index), graphics=False)
        except Exception:
            continue
        total = sum(amount for pid, amount in rows.items() if pid in wanted)
        if total:
            used[index] = total
    return used


def gpu_memory_total(index: int) -> int | None:
    """Size in bytes of the GPU NVML numbers ``index``, or None when NVML cannot tell."""
    try:
        nv = nvml.module()
        return int(nv.nvmlDeviceGetMemoryInfo(nvml.handle(nv, index)).total)
    except Exception:
        return None


def over_grant(used: dict[int, int], grants: dict[int, int]) -> str | None:
    """The reason to stop a job that holds more GPU memory than it was granted, or None.

    >>> over_grant({0: 12 * 2**30}, {0: 10 * 2**30})
    'GPU out of memory: used 12 GiB, limit 10 GiB on GPU 0'
    """
    for index, limit in sorted(grants.items()):
        if used.get(index, 0) > limit:
            return (
                f"GPU out of memory: used {format_size(used[index])}, "
                f"limit {format_size(limit)} on GPU {index}"
            )
    return None

"""GPU memory that given processes really use, measured through NVML.

The supervisor of a job that shares a GPU calls :func:`job_gpu_memory` from
its monitor loop (twice a second) and stops the job when it holds more than
its grant. Inside a job, :mod:`jupyter_dlsched.torch` reads the card sizes
from here to turn a grant into PyTorch's per-process memory fraction.

Without an NVIDIA driver (or without ``nvidia-ml-py``) every function answers
"nothing known" (an empty dict) instead of failing; the first failure is
remembered so a monitor loop does not retry the driver twice a second.

>>> from jupyter_dlsched.gpu_watch import job_gpu_memory
>>> job_gpu_memory({os.getpid()})  # doctest: +SKIP
{0: 1073741824}

NVML reports process ids as the host sees them; inside a container with its
own PID namespace they may not match the job's, and then nothing is counted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from .units import format_size

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None when there is no usable driver."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        if "error" in _state:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as error:  # ImportError, NVMLError (no driver), OSError
            _state["error"] = f"{type(error).__name__}: {error}"
            return None
        _state["module"] = pynvml
        return pynvml


def nvml_error() -> str | None:
    """Why NVML is unusable in this process, or None when it works."""
    _nvml()
    return _state.get("error")


def _handle(nv: Any, index: int) -> Any:
    handles: dict[int, Any] = _state.setdefault("handles", {})
    if index not in handles:
        handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
    return handles[index]


def _process_memory(nv: Any, handle: Any) -> list[tuple[int, int]]:
    """``(pid, bytes)`` of compute processes on one GPU; unknown amounts count as 0."""
    rows = []
    for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(proc, "usedGpuMemory", None)
        # NVML_VALUE_NOT_AVAILABLE arrives as None (or a huge sentinel) without privileges
        if not isinstance(used, int) or used < 0 or used >= 2**63:
            used = 0
        rows.append((int(proc.pid), used))
    return rows


def job_gpu_memory(pids: Iterable[int]) -> dict[int, int]:
    """Bytes of GPU memory held by ``pids``, per NVML GPU index (GPUs they hold nothing on left out).

    >>> job_gpu_memory({1234, 1240})  # doctest: +SKIP
    {0: 6442450944, 2: 1073741824}

    Empty when NVML is absent. A GPU NVML cannot read (lost, or not supported)
    is skipped rather than failing the caller.
    """
    wanted = set(pids)
    nv = _nvml()
    if nv is None or not wanted:
        return {}
    used: dict[int, int] = {}
    try:
        count = int(nv.nvmlDeviceGetCount())
    except Exception:
        return {}
    for index in range(count):
        try:
            rows = _process_memory(nv, _handle(nv, index))
        except Exception:
            continue
        total = sum(amount for pid, amount in rows if pid in wanted)
        if total:
            used[index] = total
    return used


def gpu_memory_total(index: int) -> int | None:
    """Size in bytes of the GPU NVML numbers ``index``, or None when NVML cannot tell."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(_handle(nv, index)).total)
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

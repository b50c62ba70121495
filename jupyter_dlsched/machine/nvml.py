"""The one way into NVML: the driver opened once per process, its handles, and one
reading of each process's GPU memory.

``pool.probe`` (the pool's GPUs and who is on them) and ``gpu_watch`` (a job's own GPU
memory, read twice a second by its supervisor) both come through here, so they agree on
what a missing driver is and on NVML's "not available" amount. Without an NVIDIA driver
(or without ``nvidia-ml-py``) ``module()`` raises ``NvmlUnavailable`` with the reason,
and the reason is remembered so that a monitor loop does not retry the driver each time.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {}

#: NVML's ``NVML_VALUE_NOT_AVAILABLE`` for a process's memory: an unsigned -1, which the
#: bindings pass on as a huge number (or as None) when the caller may not read it.
_NOT_AVAILABLE = 2**63


class NvmlUnavailable(RuntimeError):
    """No usable NVIDIA driver in this process; the message says why."""


def module() -> Any:
    """The initialised ``pynvml`` module, or raise ``NvmlUnavailable`` with the reason."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        if "error" in _state:
            raise NvmlUnavailable(_state["error"])
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as error:  # NVMLError (no driver), ImportError, OSError
            _state["error"] = f"no NVIDIA driver ({type(error).__name__}: {error})"
            raise NvmlUnavailable(_state["error"]) from error
        _state["module"] = pynvml
        return pynvml


def error() -> str | None:
    """Why NVML is unusable in this process, or None when it works."""
    try:
        module()
    except NvmlUnavailable as unavailable:
        return str(unavailable)
    return None


def handle(nv: Any, index: int) -> Any:
    """The device handle of GPU ``index`` (NVML's numbering), kept for the next call."""
    handles: dict[int, Any] = _state.setdefault("handles", {})
    if index not in handles:
        handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
    return handles[index]


def used_memory(process: Any) -> int:
    """The bytes NVML lists for one process; 0 when it could not tell (not available)."""
    used = getattr(process, "usedGpuMemory", None)
    if not isinstance(used, int) or used < 0 or used >= _NOT_AVAILABLE:
        return 0
    return used


def processes(nv: Any, device: Any, graphics: bool = True) -> dict[int, int]:
    """``{pid: bytes}`` of the processes on one GPU: compute ones, and with ``graphics``
    graphics ones too (a process on both is counted once with both amounts). A list
    NVML cannot give (an old driver, a GPU gone) is left out rather than failing."""
    getters = ["nvmlDeviceGetComputeRunningProcesses"]
    if graphics:
        getters.append("nvmlDeviceGetGraphicsRunningProcesses")
    seen: dict[int, int] = {}
    for getter in getters:
        try:
            listed = list(getattr(nv, getter)(device))
        except Exception:  # NVMLError, AttributeError on old bindings
            continue
        for process in listed:
            pid = int(process.pid)
            seen[pid] = seen.get(pid, 0) + used_memory(process)
    return seen

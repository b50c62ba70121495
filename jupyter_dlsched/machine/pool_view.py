"""The pool as people see it: the machine now, with each GPU's jobs, and its shape in numbers.

Read by the client (``Scheduler.pool``, ``status``) and by the engine (the agent's
``status`` and the shared pool's samples) from any ledger that answers ``jobs`` — the
ledger itself or a shared pool's ``RemoteLedger``.
"""

from __future__ import annotations

import copy
from typing import Any

import psutil

from .inventory import PoolInfo, probe, remembered_simulation
from .mps import MpsDaemons


def _job_of(pid: int, by_pid: dict[int, str]) -> str | None:
    """The job a GPU process belongs to: its own pid, or any ancestor's (a rank, a data
    loader worker, a process the job started), is a job's or its supervisor's."""
    if pid in by_pid:
        return by_pid[pid]
    try:
        for parent in psutil.Process(pid).parents():
            if parent.pid in by_pid:
                return by_pid[parent.pid]
    except psutil.Error:
        pass
    return None


def pool_with_jobs(store: Any, inventory: dict[str, Any]) -> PoolInfo:
    """This machine's GPUs now, each with its jobs, its processes' jobs and, for a
    simulated GPU, the memory granted on it as its memory in use."""
    # the pool's simulated GPUs are the ledger's, not this caller's environment; the probe
    # is cached and shared: never mutate it
    simulate = remembered_simulation(inventory)
    info = copy.deepcopy(probe(usage=True, simulate=simulate))
    running = store.jobs(holding=True)  # a success whose process still exits holds its GPUs
    by_pid = {j.job_pid: j.id for j in running if j.job_pid}
    by_pid.update({j.supervisor_pid: j.id for j in running if j.supervisor_pid})
    for gpu in info.gpus:
        gpu.jobs = []
        for p in gpu.processes:
            p.job_id = _job_of(p.pid, by_pid)
    for job in running:
        if not job.placement:
            continue
        for index, granted in zip(job.placement.gpus, job.placement.gpu_mem, strict=False):
            if index < len(info.gpus):
                gpu = info.gpus[index]
                gpu.jobs.append(job.id)
                if gpu.simulated:
                    gpu.mem_used += granted
    home = getattr(store, "home", None)
    if home is not None:
        sharing = MpsDaemons(home).sharing([g.index for g in info.gpus])
        for gpu in info.gpus:
            gpu.fractions = sharing.get(gpu.index, "")
    for gpu in info.gpus:
        if gpu.simulated:
            # nothing measures a simulated GPU: its memory in use is what was allocated,
            # and it has no utilisation reading (views say "allocated", never "util")
            gpu.util = None
    return info


def pool_shape(store: Any, inventory: dict[str, Any], backend: str) -> dict[str, Any]:
    """A backend's name and pool: GPUs (total, busy, simulated), CPUs, memory."""
    running = store.jobs(holding=True)
    busy = {i for j in running if j.placement and j.backend == backend for i in j.placement.gpus}
    return {
        "backend": backend,
        "gpus": {
            "total": len(inventory.get("gpus", [])),
            "busy": len(busy),
            "simulated": sum(1 for g in inventory.get("gpus", []) if g.get("simulated")),
        },
        "cpus": inventory.get("cpus"),
        "mem_total": inventory.get("mem_total"),
    }

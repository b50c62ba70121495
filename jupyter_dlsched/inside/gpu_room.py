"""A job's view of the GPU memory around it: what a process holds, what a GPU has free.

Read through NVML (``machine/``), for a kernel's lease deciding whether a suspended kernel
fits back on its GPU. A simulated GPU has nothing measured on it: all of it counts as free.

>>> free_memory([0])  # doctest: +SKIP
{0: 84825604096}
"""

from __future__ import annotations

from collections.abc import Iterable

from ..machine.gpu_watch import job_gpu_memory
from ..machine.inventory import probe


def held_by(pids: Iterable[int]) -> dict[int, int]:
    """Bytes the processes ``pids`` hold on each GPU (NVML index); empty without NVML."""
    return job_gpu_memory(pids)


def free_memory(devices: Iterable[int]) -> dict[int, int]:
    """Free bytes now on each of ``devices`` (NVML indices) the machine has."""
    gpus = {g.index: g for g in probe(usage=True, max_age=0).gpus}
    return {
        index: max(0, gpus[index].mem_total - gpus[index].mem_used)
        for index in devices
        if index in gpus
    }

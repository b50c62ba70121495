"""Which device a job process computes on: its place among the job's processes, its GPUs,
and the memory grant of a shared GPU, applied before the first CUDA allocation.

The public names are ``jupyter_dlsched.torch``'s (``dlt.device()``, ``dlt.rank()``,
``dlt.memory_fractions()``...); this module is what that one and
``jupyter_dlsched.inside.checkpoint`` are built on. Importing it never imports torch and
never touches CUDA: ranks and GPU counts are read from the environment the job was
started with, and torch is loaded by the first call that needs it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from ..machine import gpu_watch
from ..vocab.errors import DlschedError
from ..vocab.units import format_size

if TYPE_CHECKING:
    import torch as torch_module

GPU_MEM_ENV = "DLSCHED_GPU_MEM"
# memory a CUDA process holds outside PyTorch's caching allocator beyond the context
# measured at start-up (cuBLAS/cuDNN handles, kernels loaded lazily): kept out of the
# fraction so that PyTorch's own out-of-memory error comes before the supervisor's stop
OUTSIDE_ALLOCATOR_MARGIN = 256 * 2**20

_applied_fractions: dict[int, float] | None = None


class GpuGrantTooSmall(DlschedError):
    """The GPU memory granted to a shared job does not cover even the CUDA context."""


def _torch() -> Any:
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            "jupyter_dlsched.torch needs PyTorch: pip install 'jupyter-dlsched[torch]'"
        ) from error
    return torch


# -- which device ----------------------------------------------------------------------------


def local_rank() -> int:
    """This process's rank on this machine (``LOCAL_RANK``; 0 outside distributed jobs)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank() -> int:
    """This process's rank in its job (``RANK``; 0 outside distributed jobs)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """How many processes the job runs (``WORLD_SIZE``; 1 outside distributed jobs)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def gpu_count() -> int:
    """How many GPUs this run of the job was given (an elastic job's change between runs).

    Read from ``CUDA_VISIBLE_DEVICES``, so it never touches CUDA; 0 for a CPU job.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return 0
    return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])


def accumulation_steps(global_batch: int, per_gpu_batch: int, replicas: int | None = None) -> int:
    """Micro-batches to accumulate per optimizer step so the global batch stays the same
    whatever the job's size (an elastic job resized from 4 GPUs to 2 accumulates twice as many).

    ``replicas``: the data-parallel copies; by default the world size of a distributed job,
    else this run's GPUs (at least 1).

    >>> accumulation_steps(256, 32, replicas=4), accumulation_steps(256, 32, replicas=2)
    (2, 4)
    """
    if replicas is None:
        replicas = world_size() if "WORLD_SIZE" in os.environ else max(1, gpu_count())
    if global_batch <= 0 or per_gpu_batch <= 0 or replicas <= 0:
        raise DlschedError(
            f"accumulation_steps({global_batch}, {per_gpu_batch}, replicas={replicas}): "
            "batch sizes and replicas must be positive"
        )
    per_step = per_gpu_batch * replicas
    if global_batch % per_step:
        raise DlschedError(
            f"a global batch of {global_batch} is not a whole number of micro-batches of "
            f"{per_gpu_batch} on {replicas} replica{'s' if replicas != 1 else ''}; choose a "
            "global batch divisible by per_gpu_batch × the most GPUs the job may have"
        )
    return global_batch // per_step


def is_main() -> bool:
    """True in rank 0, the process whose return value is the job's result."""
    return rank() == 0


def device() -> torch_module.device:
    """The device this job process should compute on.

    ``cuda:0`` of the GPUs the scheduler granted (``cuda:LOCAL_RANK`` in a
    distributed job, one GPU per rank), or ``cpu`` when the job has no GPU
    PyTorch can use. For a job that shares a GPU (``gpu_mem=`` or
    ``gpus=0.5``) the memory grant is applied first, so call this before
    the first CUDA allocation::

        dev = dlt.device()
        model = Net().to(dev)
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = local_rank() if world_size() > 1 and local_rank() < count else 0
    apply_memory_limit()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


# -- the memory grant of a shared GPU -----------------------------------------------------------


def memory_grants() -> dict[int, int]:
    """Bytes granted per visible CUDA device (local index), from ``DLSCHED_GPU_MEM``.

    Empty for jobs that own their GPUs (or run outside the scheduler).

    >>> os.environ["DLSCHED_GPU_MEM"] = "10737418240"  # doctest: +SKIP
    >>> memory_grants()  # doctest: +SKIP
    {0: 10737418240}
    """
    raw = os.environ.get(GPU_MEM_ENV, "").strip()
    if not raw:
        return {}
    try:
        return {i: int(v) for i, v in enumerate(raw.split(",")) if v.strip()}
    except ValueError:
        raise DlschedError(
            f"{GPU_MEM_ENV}={raw!r} is not a comma-separated list of byte counts"
        ) from None


def visible_physical_gpus() -> list[int | None]:
    """NVML index of each visible CUDA device, in CUDA order (None for a UUID entry)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return []
    out: list[int | None] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        out.append(int(item) if item.isdigit() else None)
    return out


def memory_fractions(context: dict[int, int] | None = None) -> dict[int, float]:
    """PyTorch memory fraction per visible device that keeps the job inside its grant.

    ``fraction = (granted - context - margin) / card size``: ``context`` is what
    the CUDA context already holds per local device (measured after it is
    created), the margin covers what CUDA libraries take outside PyTorch's
    allocator. Card sizes come from NVML (falling back to PyTorch).

    >>> memory_fractions()  # doctest: +SKIP
    {0: 0.121875}

    Raises ``GpuGrantTooSmall`` when a grant leaves nothing for tensors.
    """
    grants = memory_grants()
    if not grants:
        return {}
    physical = visible_physical_gpus()
    context = context or {}
    fractions: dict[int, float] = {}
    for local, granted in grants.items():
        index = physical[local] if local < len(physical) else None
        total = gpu_watch.gpu_memory_total(index) if index is not None else None
        if total is None:
            total = _torch_total(local)
        if not total:
            continue
        reserved = context.get(local, 0) + OUTSIDE_ALLOCATOR_MARGIN
        usable = granted - reserved
        if usable <= 0:
            raise GpuGrantTooSmall(
                f"the job's GPU memory grant ({format_size(granted)}) does not cover the CUDA "
                f"context and libraries ({format_size(reserved)}); submit with a larger gpu_mem"
            )
        fractions[local] = min(1.0, usable / total)
    return fractions


def _torch_total(local: int) -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or local >= torch.cuda.device_count():
        return None
    return int(torch.cuda.get_device_properties(local).total_memory)


def apply_memory_limit() -> dict[int, float]:
    """Cap PyTorch's allocator at the job's GPU memory grant; returns the fractions applied.

    Runs once per process (``device()`` and ``init_process_group()`` call it).
    The CUDA context is created first and measured through NVML so that the
    context plus everything PyTorch may allocate stays within the grant: a job
    that outgrows it gets PyTorch's ``OutOfMemoryError`` instead of being
    stopped by the supervisor or starving its neighbours.
    """
    global _applied_fractions
    if _applied_fractions is not None:
        return dict(_applied_fractions)
    grants = memory_grants()
    if not grants:
        _applied_fractions = {}
        return {}
    torch = _torch()
    if not torch.cuda.is_available():
        return {}
    count = torch.cuda.device_count()
    physical = visible_physical_gpus()
    locals_ = [i for i in grants if i < count]
    for local in locals_:
        torch.cuda.mem_get_info(local)  # creates the context (no allocation) so NVML counts it
    mine = gpu_watch.job_gpu_memory({os.getpid()})
    context: dict[int, int] = {}
    for local in locals_:
        index = physical[local] if local < len(physical) else None
        context[local] = mine.get(index, 0) if index is not None else 0
    fractions = memory_fractions(context)
    for local, fraction in fractions.items():
        if local < count:
            torch.cuda.set_per_process_memory_fraction(fraction, local)
    _applied_fractions = fractions
    return dict(fractions)

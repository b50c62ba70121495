"""PyTorch inside scheduled jobs: the job's device, its GPU memory grant, DDP, checkpoints.

>>> import jupyter_dlsched as dls
>>> import jupyter_dlsched.torch as dlt
>>> def train(steps=1000):
...     dev = dlt.device()  # cuda:0 of the job's GPUs (memory grant applied), else cpu
...     model = Net().to(dev)
...     opt = torch.optim.AdamW(model.parameters())
...     ckpt = dlt.Checkpoint(model=model, optimizer=opt, every=100)
...     for step in ckpt.steps(steps):  # resumes after a preemption; saves on SIGTERM
...         loss = train_step(model, opt)
...         dls.progress(step + 1, steps, loss=loss.item())
...     return loss.item()
>>> h = dls.submit(train, gpus=1, preemptible=True)  # doctest: +SKIP

Importing this module never imports torch and never touches CUDA; torch is
loaded by the first call that needs it (``pip install jupyter-dlsched[torch]``).
Outside a job every helper still works (device of this process, a
single-process group, a checkpoint at the path given), so the same training
function runs unchanged in a notebook cell.

This module is what users import: it holds the process group of a distributed
job and gives the names of ``jupyter_dlsched.inside.job_device`` (ranks, the device, a
shared GPU's memory grant) and ``jupyter_dlsched.inside.checkpoint`` (``Checkpoint``,
``Stopped``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .inside.checkpoint import Checkpoint, Stopped
from .inside.job_device import (
    GpuGrantTooSmall,
    _torch,
    accumulation_steps,
    apply_memory_limit,
    device,
    gpu_count,
    is_main,
    local_rank,
    memory_fractions,
    memory_grants,
    rank,
    visible_physical_gpus,
    world_size,
)

# -- distributed data parallel ------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedInfo:
    """Where this process stands in its job's process group."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: Any

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_process_group(
    backend: str | None = None, timeout: float | timedelta = 300.0
) -> DistributedInfo:
    """Join the job's process group: NCCL when the ranks have GPUs, gloo on CPU.

    In a job submitted with ``distributed=True`` the scheduler starts one
    process per GPU (or per CPU core of a CPU job) with ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, as ``torchrun``
    does; outside one this makes a group of one, so the code still runs::

        info = dlt.init_process_group()
        model = dlt.ddp(Net())
        ...
        if info.is_main:
            return evaluate(model)

    Calling it again returns the same information.
    """
    torch = _torch()
    dist = torch.distributed
    dev = device()
    if backend is None:
        backend = "nccl" if dev.type == "cuda" and dist.is_nccl_available() else "gloo"
    if isinstance(timeout, int | float):
        timeout = timedelta(seconds=timeout)
    if not dist.is_initialized():
        if "MASTER_PORT" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(
                backend, init_method="env://", rank=rank(), world_size=world_size(), timeout=timeout
            )
        else:
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
                timeout=timeout,
            )
    return DistributedInfo(
        rank=dist.get_rank(),
        local_rank=local_rank(),
        world_size=dist.get_world_size(),
        backend=str(dist.get_backend()),
        device=dev,
    )


def ddp(model: Any, **options: Any) -> Any:
    """Move ``model`` to this rank's device and wrap it in ``DistributedDataParallel``.

    Joins the process group first if needed. ``options`` go to DDP.
    """
    torch = _torch()
    info = init_process_group()
    model = model.to(info.device)
    if info.device.type == "cuda":
        options.setdefault("device_ids", [info.device.index])
    return torch.nn.parallel.DistributedDataParallel(model, **options)


def destroy_process_group() -> None:
    """Leave the process group (harmless when none was joined)."""
    torch = _torch()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


__all__ = [
    "Checkpoint",
    "accumulation_steps",
    "DistributedInfo",
    "GpuGrantTooSmall",
    "Stopped",
    "apply_memory_limit",
    "ddp",
    "destroy_process_group",
    "device",
    "gpu_count",
    "init_process_group",
    "is_main",
    "local_rank",
    "memory_fractions",
    "memory_grants",
    "rank",
    "visible_physical_gpus",
    "world_size",
]

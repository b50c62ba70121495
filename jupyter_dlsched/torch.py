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
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import gpu_watch, runtime
from .errors import DlschedError
from .units import format_size

if TYPE_CHECKING:
    import torch as torch_module

GPU_MEM_ENV = "DLSCHED_GPU_MEM"
# memory a CUDA process holds outside PyTorch's caching allocator beyond the context
# measured at start-up (cuBLAS/cuDNN handles, kernels loaded lazily): kept out of the
# fraction so that PyTorch's own out-of-memory error comes before the supervisor's stop
OUTSIDE_ALLOCATOR_MARGIN = 256 * 2**20
CHECKPOINT_FILE = "checkpoint.pt"

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


# -- checkpoint and resume ----------------------------------------------------------------------


class Stopped(SystemExit):
    """Ends a job that saved its checkpoint because the scheduler asked it to stop.

    A ``SystemExit`` with status 0: the log gets no traceback, and the
    scheduler records the job as preempted (it will resume) or cancelled.
    """

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


class Checkpoint:
    """Save model, optimizer and step on request; restore them when the job starts again.

    >>> ckpt = Checkpoint(model=model, optimizer=opt, every=500)  # doctest: +SKIP
    >>> for step in ckpt.steps(10_000):  # doctest: +SKIP
    ...     train_step()

    ``steps(total)`` restores the last checkpoint (if any) and counts on from
    its step. Between two steps it saves every ``every`` steps and, when the
    scheduler asks the job to stop (preemption, or a cancel with grace:
    SIGTERM), saves at once and ends the job, so a ``preemptible=True`` job
    picks up where it stopped when it is started again. Steps must be
    shorter than the grace period (``Scheduler(grace=...)``, 10 s by default).

    ``path`` defaults to ``checkpoint.pt`` in the job's spool folder, which
    survives preemption; outside a job give one. In a distributed job only
    rank 0 writes, every rank restores, and all ranks stop at the same step.
    Random number generators (Python, NumPy, PyTorch, CUDA) are saved too, so a
    resumed run continues the same random stream.

    ``extra`` values (numbers, strings, lists, dicts, tensors) are saved as
    given and come back in ``ckpt.extra``; objects with ``state_dict()`` (an
    LR scheduler, a ``GradScaler``) can be passed as keyword arguments.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        model: Any = None,
        optimizer: Any = None,
        every: int | None = None,
        **stateful: Any,
    ) -> None:
        if path is None:
            job = runtime.current_job()
            if job is None:
                raise DlschedError(
                    "Checkpoint() needs a path outside a scheduled job, e.g. Checkpoint('run.pt')"
                )
            job_id, home = job
            path = Path(home) / "spool" / job_id / CHECKPOINT_FILE
        if every is not None and (not isinstance(every, int) or every < 1):
            raise DlschedError(f"Checkpoint(every={every!r}) must be a whole number of steps >= 1")
        self.path = Path(path)
        self.every = every
        self.objects: dict[str, Any] = {"model": model, "optimizer": optimizer, **stateful}
        self.step = 0
        self.resumed_from: int | None = None
        self._saved_step: int | None = None
        self._restored = False
        self._control_group: Any = None
        self.extra: dict[str, Any] = {}
        runtime.checkpoint_requested()  # from now on SIGTERM sets a flag instead of killing

    # saving and restoring

    def save(self, step: int | None = None, **extra: Any) -> Path | None:
        """Write the checkpoint now (rank 0 only; atomic); returns its path, None on other ranks."""
        torch = _torch()
        if step is not None:
            self.step = step
        self.extra.update(extra)
        if rank() != 0:
            return None
        state: dict[str, Any] = {"step": self.step, "extra": self.extra, "rng": _rng_state()}
        for name, obj in self.objects.items():
            if obj is not None:
                state[name] = _unwrap(obj).state_dict()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        self._saved_step = self.step
        return self.path

    def restore(self) -> int:
        """Load the checkpoint if there is one; returns the step to continue from (0 if none).

        Loads once: later calls (``steps()`` makes one) return the same step.
        """
        torch = _torch()
        if self._restored or not self.path.exists():
            self._restored = True
            return self.step
        self._restored = True
        dev = device()
        state = torch.load(self.path, map_location=dev, weights_only=True)
        for name, obj in self.objects.items():
            if obj is not None and name in state:
                _unwrap(obj).load_state_dict(state[name])
        _set_rng_state(state.get("rng") or {})
        self.step = int(state["step"])
        self.extra = dict(state.get("extra") or {})
        self.resumed_from = self._saved_step = self.step
        return self.step

    # the training loop

    def stop_requested(self) -> bool:
        """True when the scheduler asked this job to stop; agreed by all ranks of a DDP job."""
        wanted = runtime.checkpoint_requested()
        torch = sys.modules.get("torch")
        if torch is None or not torch.distributed.is_initialized():
            return wanted
        dist = torch.distributed
        if dist.get_world_size() == 1:
            return wanted
        if self._control_group is None:
            # a CPU (gloo) group for the flag, so that agreeing costs no GPU sync per step
            gloo = dist.get_backend() == "gloo"
            self._control_group = dist.group.WORLD if gloo else dist.new_group(backend="gloo")
        flag = torch.tensor([1 if wanted else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._control_group)
        return bool(flag.item())

    def check(self, step: int) -> None:
        """Call between steps with the number of steps done: saves when due, stops on request."""
        self.step = step
        if self.stop_requested():
            self.save(step)
            torch = sys.modules.get("torch")
            if torch is not None and torch.distributed.is_initialized():
                torch.distributed.barrier()  # no rank leaves before rank 0 has written
            if rank() == 0:
                print(f"[dlsched] checkpoint saved at step {step}; stopping as asked", flush=True)
            raise Stopped(step)
        if self.every and step % self.every == 0 and step != self._saved_step and step:
            self.save(step)

    def steps(self, total: int) -> Iterator[int]:
        """Step numbers from the restored step to ``total - 1``, checkpointing between them."""
        start = self.restore()
        for step in range(start, total):
            self.check(step)
            yield step
        self.step = total


def _unwrap(obj: Any) -> Any:
    """The model inside a DDP (or DataParallel) wrapper, so checkpoints load either way."""
    module = getattr(obj, "module", None)
    if (
        module is not None
        and hasattr(module, "state_dict")
        and type(obj).__name__
        in (
            "DistributedDataParallel",
            "DataParallel",
        )
    ):
        return module
    return obj


def _rng_state() -> dict[str, Any]:
    torch = _torch()
    version, mt, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": (version, list(mt), gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch = _torch()
    if "python" in state:
        version, mt, gauss = state["python"]
        random.setstate((version, tuple(mt), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, keys.cpu().numpy(), pos, has_gauss, cached))


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

"""``Checkpoint``: a job's model, optimizer, step and random state saved on request and
restored when the job starts again, so a preempted or resized job resumes where it
stopped.

Public as ``jupyter_dlsched.torch.Checkpoint`` (``dlt.Checkpoint``) and
``dlt.Stopped``. Importing this module never imports torch; saving and restoring
load it.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..vocab.errors import DlschedError
from . import runtime
from .job_device import _torch, device, rank

CHECKPOINT_FILE = "checkpoint.pt"


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

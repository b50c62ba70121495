"""The backend interface: what the scheduler asks of whatever runs jobs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from ..vocab.errors import SpecError

if TYPE_CHECKING:
    from ..machine.inventory import PoolInfo
    from ..policy import Policy
    from ..store import JobInfo
    from ..vocab.spec import JobSpec
    from .port import Port


class Backend(ABC):
    """Runs allocated jobs. Read top to bottom, a job's life here is:

    1. ``inventory()`` — the pool's shape, stored in the ledger for every participant;
       ``check(spec)`` — refuse at submit what this backend cannot run;
       ``policy()`` — a backend that decides by itself (SLURM) replaces the policy;
       ``before_reap()`` — each tick, before expired leases are reaped;
    2. ``launch(job)`` — the policy allocated ``job`` (state ``running``); start it.
       Whatever runs it must claim the job, renew its lease and record its end;
    3. ``cancel(job)`` — the user cancelled a running job (``cancel_requested`` is set);
    4. ``reap(job)`` — the job's lease expired and the ledger already moved it on;
       make sure nothing of it keeps running;
    5. ``close()`` — the scheduler is closing; running jobs keep running.
    """

    name = "base"

    def __init__(self, port: Port | None = None) -> None:
        self.port = port

    def bind(self, port: Port) -> None:
        """Run jobs for ``port`` (a ``Scheduler``): its ledger, folder, pool and wake-up."""
        self.port = port

    @abstractmethod
    def inventory(self) -> dict[str, Any]:
        """``{"cpus", "cores", "mem_total", "gpus": [{index, uuid, name, mem_total, simulated, group}]}``."""

    @abstractmethod
    def launch(self, job: JobInfo) -> None:
        """Start an allocated job."""

    def check(self, spec: JobSpec) -> None:
        """Raise ``SpecError`` for a request this backend cannot run, before it is stored."""
        refuse_stage_in(self.name, spec)

    def policy(self) -> Policy | None:
        """The policy to use instead of the ledger's (None: the ledger's)."""
        return None

    def before_reap(self) -> None:
        """Called by each tick just before it reaps jobs whose lease expired."""
        return None

    def cancel(self, job: JobInfo) -> None:
        """Deliver a cancel to a running job (the ledger flag is already set)."""
        return None

    def reap(self, job: JobInfo) -> None:
        """Clean up after a job whose lease expired."""
        return None

    def external_gpu_mem(self, job_pids: list[int | None]) -> dict[int, int]:
        """GPU memory (per index) held by processes other than the running jobs' ``job_pids``."""
        return {}

    def pool(self) -> PoolInfo:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds; jobs keep running."""
        return None


def refuse_stage_in(backend: str, spec: JobSpec) -> None:
    """``SpecError`` for a request with ``stage_in`` to a backend other than ``local``."""
    if spec.stage_in:
        raise SpecError(
            "stage_in",
            spec.stage_in,
            f"no stage_in with the {backend} backend: data is staged into this "
            "machine's cache, for local jobs only",
        )

"""The backend interface: what the scheduler asks of whatever runs jobs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pool import PoolInfo
    from ..scheduler import Scheduler
    from ..store import JobInfo


class Backend(ABC):
    """Runs allocated jobs. Read top to bottom, a job's life here is:

    1. ``inventory()`` — the pool's shape, stored in the ledger for every participant;
    2. ``launch(job)`` — the policy allocated ``job`` (state ``running``); start it.
       Whatever runs it must claim the job, renew its lease and record its end;
    3. ``cancel(job)`` — the user cancelled a running job (``cancel_requested`` is set);
    4. ``reap(job)`` — the job's lease expired and the ledger already moved it on;
       make sure nothing of it keeps running;
    5. ``close()`` — the scheduler is closing; running jobs keep running.
    """

    name = "base"

    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self.scheduler = scheduler

    def bind(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @abstractmethod
    def inventory(self) -> dict[str, Any]:
        """``{"cpus", "cores", "mem_total", "gpus": [{index, uuid, name, mem_total, simulated, group}]}``."""

    @abstractmethod
    def launch(self, job: JobInfo) -> None:
        """Start an allocated job."""

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

"""The local backend: a detached supervisor per job, forked by a preloaded launcher."""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

import psutil

from ..local import launcher
from ..machine.inventory import (
    PoolInfo,
    inventory_json,
    probe,
    remembered_simulation,
    simulation,
    usable_cores,
)
from ..store import JobInfo
from ..vocab.spec import JobSpec
from .base import Backend

if TYPE_CHECKING:
    from .port import Port


class LocalBackend(Backend):
    """Jobs run on this machine under ``jupyter_dlsched.local.supervisor`` supervisors.

    ``fast_start=False`` skips the launcher and starts each supervisor with a
    fresh interpreter (slower; useful to rule the launcher out when debugging).
    """

    name = "local"

    def __init__(self, port: Port | None = None, fast_start: bool = True) -> None:
        super().__init__(port)
        self.fast_start = fast_start and os.environ.get("DLSCHED_FAST_START", "1") != "0"
        self._launcher_spawned_at = -1e9

    def check(self, spec: JobSpec) -> None:
        return None  # stage_in included: staged into this machine's cache

    def inventory(self) -> dict[str, Any]:
        assert self.port is not None
        # simulated GPUs stay with the ledger: a later agent started without the variable
        # (a plain terminal after `make lab`) keeps them
        simulate = simulation(self.port.store.get_meta("inventory"))
        info = probe(usage=False, max_age=0, simulate=simulate)
        data = inventory_json(info)
        data["cores"] = usable_cores()
        data["simulate"] = simulate or None
        return data

    def launch(self, job: JobInfo) -> None:
        assert self.port is not None
        home = self.port.home
        if self.fast_start and launcher.request_start(home, job.id):
            return
        # no launcher answers (none yet, it idled out, or the code changed): start one for
        # the next jobs, at most every few seconds, and start this one the slow way
        if self.fast_start and time.monotonic() - self._launcher_spawned_at > 5.0:
            self._launcher_spawned_at = time.monotonic()
            launcher.spawn_launcher(home)
        launcher.spawn_supervisor(home, job.id)

    def cancel(self, job: JobInfo) -> None:
        # the supervisor notices the ledger flag within a fraction of a second
        return None

    def reap(self, job: JobInfo) -> None:
        """Kill what is left of a lost job's process group on this machine."""
        ours = job.uid == os.getuid() or os.geteuid() == 0  # a shared pool's service: root
        if job.job_pid and job.host == socket.gethostname() and ours:
            try:
                os.killpg(job.job_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def external_gpu_mem(self, job_pids: list[int | None]) -> dict[int, int]:
        assert self.port is not None
        if not any(not g.get("simulated") for g in self.port.inventory.get("gpus", [])):
            return {}  # simulated GPUs only: nothing to ask NVML
        info = probe(usage=True, max_age=2.0)
        if not any(g.processes for g in info.gpus):
            return {}
        ours: set[int] = set()
        for pid in job_pids:
            if pid:
                ours.add(pid)
                try:
                    ours.update(p.pid for p in psutil.Process(pid).children(True))
                except psutil.Error:
                    pass
        return {
            g.index: sum(p.used_mem for p in g.processes if p.pid not in ours) for g in info.gpus
        }

    def pool(self) -> PoolInfo:
        assert self.port is not None
        return probe(usage=True, simulate=remembered_simulation(self.port.inventory))

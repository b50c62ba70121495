"""What a run of a job uses, read by its supervisor: CPU, RAM and GPU memory of all of its
processes, now (written to the ledger while it runs) and over the run (recorded at its end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..store import JobInfo
from ..vocab.units import format_size
from .containment import Containment


@dataclass
class Usage:
    """What one run of a job used: CPU seconds, peak RAM and peak GPU memory of its tree,
    and what it uses now (CPU percent since the last reading, RSS)."""

    cpu_time: float = 0.0
    peak_rss: int = 0
    peak_gpu_mem: int | None = None  # None: not measured (no NVML, or a CPU job)
    cpu_reaped: float = 0.0  # CPU seconds of the ranks that have exited (from wait4)
    rss_now: int = 0
    cpu_now: float = 0.0
    since: float = field(default_factory=time.monotonic)  # the first reading's CPU is since then
    _last: tuple[float, dict[tuple[int, float], float]] | None = None

    def sample(self, tree: list[psutil.Process], gpus: bool) -> int:
        """Take one reading of the process tree; returns its RSS now."""
        rss = _rss(tree)
        self.rss_now = rss
        self.peak_rss = max(self.peak_rss, rss)
        seconds = _cpu_seconds(tree)
        self.cpu_time = max(self.cpu_time, sum(seconds.values()))
        now = time.monotonic()
        then, before = self._last or (self.since, {})
        if now > then:
            # per process (pid and start time): one that exited takes its seconds with it,
            # one that is new brings all of its own
            spent = sum(max(0.0, t - before.get(key, 0.0)) for key, t in seconds.items())
            self.cpu_now = 100.0 * spent / (now - then)
        self._last = (now, seconds)
        if gpus:
            from ..machine.gpu_watch import job_gpu_memory

            held = job_gpu_memory({p.pid for p in tree})
            if held:
                self.peak_gpu_mem = max(self.peak_gpu_mem or 0, sum(held.values()))
        return rss

    def reaped(self, rusage: Any) -> None:
        """Fold in a rank's own accounting from ``wait4`` (it includes what it waited for)."""
        self.reported(rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss)

    def reported(self, cpu: float, maxrss_kib: int) -> None:
        """Fold in a rank's CPU seconds and peak RSS (KiB): from ``wait4`` at its exit, or
        what its process said as it ended (``RESULT_REPORT``), the same figures."""
        self.cpu_reaped += cpu
        self.cpu_time = max(self.cpu_time, self.cpu_reaped)
        self.peak_rss = max(self.peak_rss, maxrss_kib * 1024)

    def columns(self, job: JobInfo) -> dict[str, Any]:
        """Ledger columns: totals over every attempt of the job, peaks over all of them."""
        gpu = self.peak_gpu_mem
        if job.peak_gpu_mem is not None:
            gpu = max(gpu or 0, job.peak_gpu_mem)
        return {
            "cpu_time": (job.cpu_time or 0.0) + self.cpu_time,
            "peak_rss": max(job.peak_rss or 0, self.peak_rss),
            "peak_gpu_mem": gpu,
        }


class Tree:
    """psutil handles of the job's processes, kept from one reading to the next."""

    def __init__(self, box: Containment) -> None:
        self.box = box
        self.known: dict[int, psutil.Process] = {}

    def now(self) -> list[psutil.Process]:
        pids = self.box.pids()
        for pid in list(self.known):
            if pid not in pids:
                del self.known[pid]
        for pid in pids - self.known.keys():
            try:
                self.known[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
        return list(self.known.values())


def own_memory(tree: list[psutil.Process]) -> int:
    """The memory the job's processes hold of their own (their unique set sizes): what a
    memory limit counts. A job forked from a warm process shares the modules that process
    imported ahead (torch: ~150 MiB of RSS) until it writes to them; those pages are the
    pool's, not the job's, and a job that never imports torch must not be stopped for them.
    Where a process's USS cannot be read, its RSS counts."""
    total = 0
    for p in tree:
        try:
            total += p.memory_full_info().uss
        except psutil.AccessDenied:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        except psutil.Error:
            continue
    return total


def _rss(tree: list[psutil.Process]) -> int:
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def _cpu_seconds(tree: list[psutil.Process]) -> dict[tuple[int, float], float]:
    """CPU seconds of each process, keyed by pid and start time (a reused pid is another)."""
    seconds = {}
    for p in tree:
        try:
            t = p.cpu_times()
            seconds[(p.pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            continue
    return seconds


def gpu_over_grant(tree: list[psutil.Process], grants: dict[int, int]) -> str | None:
    """Why a shared-GPU job is over its memory grant (measured through NVML), or None."""
    if not grants:
        return None
    try:
        from ..machine.gpu_watch import job_gpu_memory
    except ImportError:
        return None
    used = job_gpu_memory({p.pid for p in tree})
    for index, limit in grants.items():
        if used.get(index, 0) > limit:
            return (
                f"GPU out of memory: used {format_size(used[index])}, "
                f"limit {format_size(limit)} on GPU {index}"
            )
    return None

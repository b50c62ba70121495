"""What finished jobs used, the way ``sacct`` answers it: GPU-hours, CPU time, peak memory.

The supervisor of each job measures its process tree (peak RSS, CPU seconds,
GPU memory through NVML) and records it with the job's end; GPU-hours are the
GPUs granted times the time the job ran, and RAN is the time it ran, both over every
attempt (a retried, preempted or resized job ran several times).

>>> rows = history_table(store.finished_jobs(since=time.time() - 86400))  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .schema import JobInfo
from .units import format_duration, format_size

HEADER = (
    "ID",
    "NAME",
    "OWNER",
    "STATE",
    "ENDED",
    "RAN",
    "GPUS",
    "GPU-H",
    "CPU",
    "PEAK RAM",
    "PEAK GPU",
    "INPUT",
    "RESULT",
)


def cpu_words(seconds: float | None) -> str:
    """CPU time with a decimal under a minute (``0.4s``), else as a duration (``12m 04s``)."""
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 60 else format_duration(seconds)


def period_words(seconds: float) -> str:
    """``7 days``, ``12 hours``, ``30 minutes``: how far back a history goes."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return format_duration(seconds)


def usage_words(job: JobInfo) -> str:
    """What a finished job used, in one line: ``0.68 GPU-hours · CPU 39m 10s · peak RAM 3.1 GiB
    · input 1.0 GiB · result 409 MiB``.

    Figures that were not measured (peak GPU memory on simulated GPUs) are left out.
    """
    words = []
    if job.gpus:
        words.append(f"{job.gpu_hours:.2f} GPU-hours")
    if job.cpu_time is not None:
        words.append(f"CPU {cpu_words(job.cpu_time)}")
    if job.peak_rss:
        words.append(f"peak RAM {format_size(job.peak_rss)}")
    if job.peak_gpu_mem:
        words.append(f"peak GPU memory {format_size(job.peak_gpu_mem)}")
    if job.input_bytes is not None:
        words.append(f"input {format_size(job.input_bytes)}")
    if job.result_bytes is not None:
        words.append(f"result {format_size(job.result_bytes)}")
    return " · ".join(words)


def idle_gpu_hours(job: JobInfo) -> float:
    """GPU-hours a GPU kernel's lease held while no cell ran (its last progress report)."""
    metrics = (job.progress or {}).get("metrics") or {}
    value = metrics.get("idle_gpu_h")
    return float(value) if isinstance(value, int | float) else 0.0


def history_table(jobs: Iterable[JobInfo], now: float | None = None) -> list[tuple[str, ...]]:
    """One row of words per finished job, under ``HEADER``."""
    now = time.time() if now is None else now
    rows: list[tuple[str, ...]] = [HEADER]
    for job in jobs:
        ended = "-" if job.finished is None else format_duration(now - job.finished) + " ago"
        rows.append(
            (
                job.id,
                job.name[:24],
                job.owner,
                job.state,
                ended,
                format_duration(job.run_time),  # every attempt's, not the last one's
                f"{job.gpus:g}" if job.max_gpus is None else f"{job.gpus:g}–{job.max_gpus}",
                f"{job.gpu_hours:.2f}",
                cpu_words(job.cpu_time),
                format_size(job.peak_rss),
                format_size(job.peak_gpu_mem),
                format_size(job.input_bytes),
                format_size(job.result_bytes),
            )
        )
    return rows


@dataclass
class OwnerTotal:
    """One user's jobs in the period: how many, and what they used."""

    owner: str
    jobs: int = 0
    succeeded: int = 0
    gpu_hours: float = 0.0
    cpu_time: float = 0.0
    #: GPU kernels' leases (kind ``kernel``): their GPU-hours (in ``gpu_hours`` too), and
    #: the part of them held while no cell ran
    kernel_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    kernels: int = 0

    def words(self) -> str:
        text = (
            f"{self.owner}: {self.jobs} job{'s' if self.jobs != 1 else ''} "
            f"({self.succeeded} done), {self.gpu_hours:.2f} GPU-hours, "
            f"{cpu_words(self.cpu_time)} CPU"
        )
        if self.kernels:
            text += (
                f"; {self.kernels} GPU kernel{'s' if self.kernels != 1 else ''}: "
                f"{self.kernel_gpu_hours:.2f} GPU-hours, {self.idle_gpu_hours:.2f} of them idle"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "gpu_hours": self.gpu_hours,
            "cpu_time": self.cpu_time,
            "kernels": self.kernels,
            "kernel_gpu_hours": self.kernel_gpu_hours,
            "idle_gpu_hours": self.idle_gpu_hours,
        }


def totals_by_owner(jobs: Iterable[JobInfo]) -> list[OwnerTotal]:
    """Per-user sums, the heaviest GPU user first."""
    totals: dict[str, OwnerTotal] = {}
    for job in jobs:
        total = totals.setdefault(job.owner, OwnerTotal(job.owner))
        total.jobs += 1
        total.succeeded += job.state == "succeeded"
        total.gpu_hours += job.gpu_hours
        total.cpu_time += job.cpu_time or 0.0
        if job.kind == "kernel":
            total.kernels += 1
            total.kernel_gpu_hours += job.gpu_hours
            total.idle_gpu_hours += idle_gpu_hours(job)
    return sorted(totals.values(), key=lambda t: (-t.gpu_hours, t.owner))

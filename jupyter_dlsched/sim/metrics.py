"""Figures of merit for a replay: completion times, queueing, utilisation, fairness."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .results import JobOutcome, SimResult


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted ``values``, linearly interpolated.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        return math.nan
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one takes all.

    >>> jain_index([1.0, 1.0]), jain_index([1.0, 0.0])
    (1.0, 0.5)
    """
    total = sum(values)
    squares = sum(v * v for v in values)
    return (total * total) / (len(values) * squares) if squares else 1.0


def summarize(result: SimResult) -> dict[str, Any]:
    """One table row: ``policy, jobs, avg_jct, p50_jct, p99_jct, avg_queue, makespan,
    utilisation, preemptions_per_job, fairness`` (seconds; ``fairness`` is ``None``
    unless the trace names at least two owners), and with start estimates
    (``simulate(estimates=True)``) ``eta_p80_hit`` (share of jobs that started
    by their P80 estimate made at submission), ``eta_median_error`` (seconds
    between expected and real start, median), ``eta_sharpness`` (that median
    as a share of the average wait of the jobs estimated: lower is sharper),
    ``eta_uncertain`` (share of estimates shown as "start uncertain"),
    ``eta_given_p80_hit`` and ``eta_given_sharpness`` (the scores of the others,
    shown as a number), ``eta_deep`` (share of estimates uncertain for the work
    ahead of the job, not forecast: no start to score) and ``eta_jobs`` (jobs
    estimated).

    ``avg_queue`` is the mean time a job spent without GPUs, before its first
    start and after every preemption. ``utilisation`` counts useful work only
    (GPUs × duration of every job over GPUs × makespan): restart overhead is
    GPU time held but not work. Fairness is Jain's index over owners of their
    jobs' mean duration / JCT, so 1.0 means every owner's jobs were slowed
    down alike.
    """
    jobs = result.jobs
    n = len(jobs)
    jcts = sorted(j.jct for j in jobs)
    makespan = (max(j.finish for j in jobs) - min(j.submit for j in jobs)) if jobs else 0.0
    capacity = result.gpus * makespan
    work = result.work_gpu_seconds
    if math.isnan(work):
        work = sum(j.gpus * j.duration for j in jobs)
    row: dict[str, Any] = {
        "policy": result.policy,
        "jobs": n,
        "avg_jct": sum(jcts) / n if n else math.nan,
        "p50_jct": percentile(jcts, 50),
        "p99_jct": percentile(jcts, 99),
        "avg_queue": sum(j.queueing_delay for j in jobs) / n if n else math.nan,
        "makespan": makespan,
        "utilisation": work / capacity if capacity else 0.0,
        "preemptions_per_job": sum(j.preemptions for j in jobs) / n if n else 0.0,
        "fairness": owner_fairness(jobs),
    }
    if result.eta is not None:
        # start estimates made at submission: the share that started by the P80 bound
        row["eta_p80_hit"] = result.eta.hit
        row["eta_median_error"] = result.eta.median_error
        row["eta_sharpness"] = result.eta.sharpness
        # what users see: estimates too spread say "start uncertain", the rest a number
        row["eta_uncertain"] = result.eta.uncertain
        row["eta_given_p80_hit"] = result.eta.given_hit
        row["eta_given_sharpness"] = result.eta.given_sharpness
        row["eta_deep"] = result.eta.deep
        row["eta_jobs"] = result.eta.jobs
    return row


def owner_fairness(jobs: Sequence[JobOutcome]) -> float | None:
    by_owner: dict[str, list[float]] = {}
    for j in jobs:
        by_owner.setdefault(j.owner, []).append(j.duration / j.jct if j.jct > 0 else 1.0)
    if len(by_owner) < 2:
        return None
    return jain_index([sum(v) / len(v) for v in by_owner.values()])

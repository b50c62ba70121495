"""Start-time estimates of the waiting jobs, written beside their places in line.

A whole-queue decision (``engine.tick.decide``) knows the queue's order, the running
jobs and the capacity, and hands them on as a ``Forecasting``; the engine runs it
(``estimate``) once the decision's starts are launched, outside the ledger's write lock:
the forecast (``forecast``), with run times learnt from the ledger's finished jobs,
then the engine writes each waiting job's ``expected_start`` and ``start_p80``. It runs when places
in line are recomputed (something changed: a submit, an end, a priority), at most every
``engine.core.FORECAST_EVERY`` seconds (the latest decision's waits for it), and again when
a running job outlives the end the forecast assumed for it (``refresh_at``, handed back
as a wake-up), never on a decision that only looks at the head of a deep queue.

The work is bounded (``FORECAST_JOBS`` waiting jobs, ``FORECAST_BUDGET``
seconds): deeper in the queue a job has no estimate (``None``), which the
views show as no estimate rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..policy import Policy, QueuedJob, RunningJob
from ..store import Store
from ..vocab.resources import Capacity
from .replay import RunTimes, forecast

#: Waiting jobs simulated, the first in the queue's order.
FORECAST_JOBS = 200
#: Seconds (wall clock) the two forecast passes may take together.
FORECAST_BUDGET = 0.05
#: Finished jobs the run times are learnt from.
RUN_TIMES_WINDOW = 2000
#: An estimate that moved by less than this many seconds is not rewritten.
REWRITE_FROM = 1.0

Estimates = dict[str, tuple[float | None, float | None]]
#: ``(expected start, P80 start, job id)`` of the estimates to write.
Changes = list[tuple[float | None, float | None, str]]


def in_order(queued: Sequence[QueuedJob], order: Sequence[str]) -> list[QueuedJob]:
    """``queued`` in ``order`` (a decision's ``order``), any job it leaves out after."""
    by_id = {job.id: job for job in queued}
    ordered = [by_id[job_id] for job_id in order if job_id in by_id]
    if len(ordered) < len(by_id):
        placed = set(order)
        ordered += [job for job in queued if job.id not in placed]
    return ordered


@dataclass
class Forecasting:
    """The forecast a whole-queue decision asks for: what it saw, to forecast from later.

    ``ordered``: the waiting jobs in the queue's order; ``written``: the estimates each
    job has now (none for a job left out), updated in place by ``estimate``."""

    backend: str
    policy: Policy
    ordered: Sequence[QueuedJob]
    running: Sequence[RunningJob]
    capacity: Capacity
    now: float
    written: Estimates


def estimate(store: Store, asked: Forecasting) -> tuple[Changes, float | None]:
    """Forecast the start of the jobs waiting in ``asked.ordered`` (reading the ledger,
    taking no lock): the estimates that changed, for ``store.queue.set_start_estimates``, and
    when to forecast again if nothing happens (a running job assumed to end by then may
    not have), or ``None``.

    Only the first ``FORECAST_JOBS`` can get an estimate, so only they and the jobs
    that had one are looked at: the cost does not grow with the queue."""
    run_times = RunTimes(window=RUN_TIMES_WINDOW)
    run_times.learn(store.finished_run_times(store.db, asked.backend, RUN_TIMES_WINDOW))
    chosen = asked.ordered[:FORECAST_JOBS]
    made = forecast(
        asked.policy,
        chosen,
        asked.running,
        asked.capacity,
        asked.now,
        run_times,
        max_jobs=FORECAST_JOBS,
        budget_s=FORECAST_BUDGET,
    )
    written = asked.written
    changes: Changes = []
    for job in chosen:
        found = made.estimates.get(job.id)
        new = (found.expected, found.p80) if found is not None else (None, None)
        if _moved(written.get(job.id, (None, None)), new):
            changes.append((new[0], new[1], job.id))
            if found is None:
                del written[job.id]
            else:
                written[job.id] = new
    looked = {job.id for job in chosen}
    for job_id in [j for j in written if j not in looked]:
        changes.append((None, None, job_id))  # further back in line now: no estimate
        del written[job_id]
    return changes, made.refresh_at


def _moved(old: tuple[float | None, float | None], new: tuple[float | None, float | None]) -> bool:
    for a, b in zip(old, new, strict=True):
        if (a is None) != (b is None):
            return True
        if a is not None and b is not None and abs(a - b) >= REWRITE_FROM:
            return True
    return False

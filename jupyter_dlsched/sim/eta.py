"""How good are start-time estimates: each job's forecast at submission, against the replay.

With ``simulate(..., estimates=True)`` (``dlsched sim --eta``), the replay
makes, at the moment each job arrives, the forecast the live scheduler would
make (``jupyter_dlsched.forecast.replay``: the same policy run forward from the
replay's state, with run times learnt from the jobs finished so far), and
later compares it with when the job really started. The figure users care
about is the share of jobs that started by their P80 bound (target: at least
80 %); a bound can meet that by being uselessly loose, so beside it stands the
sharpness: the median error of the expected start as a share of the average
wait (0 is exact; 1 means the estimate is typically off by a whole wait).
Where the P80 is too far beyond the expected start, users are told the start is
uncertain instead of a number (``vocab.words.uncertain``): the share of such
estimates, and the hit rate and sharpness of the numbers given, are scored too.

A job with more work ahead of it in line than the forecast can promise
(``forecast.replay.AHEAD_LIMIT``) is told its start is uncertain without a
forecast, as live; such estimates are counted apart (``deep``).

A job gets no estimate when the forecast could not reach its start (nothing
has finished yet to learn run times from, or it is beyond the forecast's
bound on jobs simulated); those are counted apart, never as hits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..forecast.replay import RunTimes, StartEstimate, forecast
from ..policy import QueuedJob, RunningJob
from ..vocab.resources import Capacity
from ..vocab.words import uncertain


@dataclass
class EtaCalibration:
    """Start estimates made at submission (seconds from the trace start), and the score.

    ``hit``: the share of estimated jobs that started by their P80 bound;
    ``median_error``: the median of |first start − expected start|, seconds;
    ``sharpness``: ``median_error`` over the average wait (submission to first
    start) of the same jobs, 0 when both are 0; ``without``: jobs that got no
    estimate; ``uncertain``: the share of estimates shown as "start uncertain",
    and ``given_hit``, ``given_sharpness`` the same scores over the others (the
    estimates shown as a number); ``deep``: the share of estimates that are
    uncertain for the work ahead of the job (``forecast.replay.AHEAD_LIMIT``),
    with no expected start: counted in ``jobs`` and ``uncertain``, left out of
    ``hit``, ``median_error`` and ``sharpness`` (they promise no start).
    """

    estimates: dict[str, StartEstimate] = field(default_factory=dict)
    jobs: int = 0
    hit: float = math.nan
    median_error: float = math.nan
    sharpness: float = math.nan
    without: int = 0
    uncertain: float = math.nan
    given_hit: float = math.nan
    given_sharpness: float = math.nan
    deep: float = math.nan

    def score(self, first_starts: Iterable[tuple[str, float, float]]) -> None:
        """Score against ``(job id, submitted, first start)`` of every job replayed."""
        every: list[tuple[bool, float, float]] = []  # (hit, |error|, wait) per estimate
        given: list[tuple[bool, float, float]] = []
        total = deep = 0
        for job_id, submitted, start in first_starts:
            total += 1
            estimate = self.estimates.get(job_id)
            if estimate is None:
                continue
            if estimate.expected is None:
                deep += 1  # "start uncertain" for the work ahead: no start to score
                continue
            scored = (
                start <= estimate.p80 + 1e-6,
                abs(start - estimate.expected),
                start - submitted,
            )
            every.append(scored)
            if not uncertain(estimate.expected, estimate.p80, submitted):
                given.append(scored)
        self.jobs = len(every) + deep
        self.without = total - self.jobs
        self.hit, self.median_error, self.sharpness = _scores(every)
        self.given_hit, _, self.given_sharpness = _scores(given)
        self.uncertain = 1 - len(given) / self.jobs if self.jobs else math.nan
        self.deep = deep / self.jobs if self.jobs else math.nan


def _scores(scored: list[tuple[bool, float, float]]) -> tuple[float, float, float]:
    """Hit rate, median |error| and sharpness of ``(hit, |error|, wait)`` triples."""
    if not scored:
        return math.nan, math.nan, math.nan
    n = len(scored)
    errors = sorted(error for _, error, _ in scored)
    median = errors[n // 2]
    waited = sum(wait for _, _, wait in scored)
    # a share of the average wait, not of each job's: most jobs wait 0 on a light queue
    if waited > 0:
        sharpness = median / (waited / n)
    else:
        sharpness = 0.0 if median == 0 else math.inf
    return sum(hit for hit, _, _ in scored) / n, median, sharpness


class StartCalibration:
    """The replay's side of the calibration: a forecast per arrival, run times per finish.

    ``max_jobs`` bounds the forecast as live (the jobs ahead in the queue that
    are simulated); a job further back gets no estimate.
    """

    def __init__(self, policy: Any, max_jobs: int = 2000) -> None:
        self.policy = policy
        self.max_jobs = max_jobs
        self.run_times = RunTimes()
        self.result = EtaCalibration()

    def finished(self, owner: str, name: str, gpus: float, seconds: float) -> None:
        self.run_times.learn([(owner, name, gpus, seconds)])

    def submitted(
        self,
        new: Sequence[str],
        queued: Sequence[QueuedJob],
        running: Sequence[RunningJob],
        capacity: Capacity,
        t: float,
    ) -> None:
        """Forecast the start of the jobs in ``new`` (just arrived, already in ``queued``)."""
        if not len(self.run_times):
            return  # nothing has finished: a live scheduler could not say either
        # the replay's queue is sorted by the policy's own key: its order is the line
        made = forecast(
            self.policy,
            queued,
            running,
            capacity,
            t,
            self.run_times,
            targets=new,
            max_jobs=self.max_jobs,
            max_calls=100 * self.max_jobs,
            budget_s=math.inf,
        )
        for job_id in new:
            estimate = made.estimates.get(job_id)
            if estimate is not None:
                self.result.estimates[job_id] = estimate

"""Run times learnt from finished jobs: the estimate a policy may use instead of a time limit.

A live user rarely declares a time limit, and never an exact one; what the
scheduler does know is how long the jobs that already finished ran. A
``SizeModel`` keeps the most recent run times (seconds: a finished job's
GPU-seconds over its GPUs) by owner, job name and GPU count, by owner and
name, by owner and GPU count, by owner, and for everyone, and answers a
quantile of the most specific group that has seen enough jobs (the groups
of the start estimates' ``RunTimes``). A trace that names neither owners nor
jobs, as a Philly virtual cluster does, still tells jobs apart by GPU count. It never sees a job that has not
finished: the live scheduler passes the ledger's finished jobs, the
simulator each job as it ends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from .base import FinishedJob


class SizeModel:
    """Recent run times of finished jobs and a quantile of them per group.

    * ``window``: sizes kept per group, the most recent;
    * ``group_min``: finished jobs a group needs before it gives estimates;
    * ``quantile``: which quantile is the estimate (0.5: the median; higher is
      more cautious, e.g. for backfill, where running past the estimate delays
      the job that holds a reservation).

    >>> model = SizeModel(group_min=2)
    >>> model.learn([FinishedJob("ana", "step", 3.0), FinishedJob("ana", "step", 5.0)])
    True
    >>> model.estimate("ana", "step"), model.estimate("bob", "train")
    (3.0, 3.0)
    >>> model.learn([FinishedJob("ana", "", 80.0, gpus=4), FinishedJob("ana", "", 120.0, gpus=4)])
    True
    >>> model.estimate("ana", "", gpus=4), model.estimate("ana", "", gpus=1)
    (20.0, 5.0)
    >>> SizeModel().estimate("ana", "step") is None
    True
    """

    def __init__(self, window: int = 2000, group_min: int = 3, quantile: float = 0.5) -> None:
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile={quantile!r}: expected a fraction in (0, 1]")
        self.window = int(window)
        self.group_min = max(1, int(group_min))
        self.quantile = float(quantile)
        self.version = 0  # counts changes of any estimate
        self._sizes: dict[tuple[str, ...], deque[float]] = {}
        self._fresh: dict[tuple[str, ...], int] = {}
        self._estimates: dict[tuple[str, ...], float] = {}
        # answers by (owner, name, gpus) since the last ``learn``: a backfilling policy asks
        # for every waiting job at every decision, and a forecast decides hundreds of times
        # between two finishes
        self._answers: dict[tuple[str, str, float], float | None] = {}

    def learn(self, finished: Iterable[FinishedJob], replace: bool = False) -> bool:
        """Take in finished jobs (each once); with ``replace`` forget what came before.

        Returns whether any estimate changed. A group's estimate is recomputed
        when a quarter of its window is new, so a long replay does not redo it
        at every finish.
        """
        self._answers.clear()
        before = dict(self._estimates) if replace else None
        if replace:
            self._sizes.clear()
            self._fresh.clear()
            self._estimates.clear()
        changed = False
        touched: set[tuple[str, ...]] = set()
        for job in finished:
            length = job.duration
            if not (length > 0 and math.isfinite(length)):
                continue
            for key in _groups(job.owner, job.name, job.gpus):
                sizes = self._sizes.get(key)
                if sizes is None:
                    sizes = self._sizes[key] = deque(maxlen=self.window)
                sizes.append(length)
                self._fresh[key] = self._fresh.get(key, 0) + 1
                touched.add(key)
        for key in touched:
            sizes = self._sizes[key]
            if len(sizes) < self.group_min:
                continue
            if key in self._estimates and self._fresh[key] * 4 < len(sizes):
                continue
            ordered = sorted(sizes)
            value = ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]
            self._fresh[key] = 0
            if self._estimates.get(key) != value:
                self._estimates[key] = value
                changed = True
        if before is not None:
            changed = before != self._estimates  # the same history again changes nothing
        if changed:
            self.version += 1
        return changed

    def estimate(self, owner: str, name: str = "", gpus: float = 0.0) -> float | None:
        """Estimated seconds a job of ``owner`` named ``name`` on ``gpus`` GPUs runs (``0``:
        the GPU count does not count); ``None`` if nothing comparable has finished yet."""
        asked = (owner, name, gpus)
        if asked in self._answers:
            return self._answers[asked]
        estimates = self._estimates
        answer = None
        for key in _groups(owner, name, gpus):
            answer = estimates.get(key)
            if answer is not None:
                break
        self._answers[asked] = answer
        return answer


def _groups(owner: str, name: str, gpus: float) -> list[tuple[str, ...]]:
    """The groups a job counts in, the most specific first: owner, name and GPUs; owner
    and name; owner and GPUs; owner; everyone."""
    width = f"{gpus:g}" if gpus > 0 else ""
    keys: list[tuple[str, ...]] = []
    if name and width:
        keys.append((owner, name, width))
    if name:
        keys.append((owner, name))
    if width:
        keys.append((owner, "", width))
    keys += [(owner,), ()]
    return keys

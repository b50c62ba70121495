"""Run times learnt from finished jobs, by owner, name and GPUs (``RunTimes``): what the
forecast (``replay``) assumes each job runs."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..policy import QueuedJob


class RunTimes:
    """Seconds that finished jobs ran, grouped from the most specific on: by owner, name
    and GPUs; owner and name; owner and GPUs; owner; everyone.

    ``total(owner, name, q, elapsed, gpus=...)`` is the ``q``-quantile of the
    run times of the most specific group with at least ``group_min`` of them
    (everyone needs one), among those longer than ``elapsed``. GPUs matter:
    on shared clusters wide jobs run far longer than one-GPU jobs (on one
    Philly cluster the median 4-GPU job ran 25 h, the median 1-GPU job 5 min). A job that has outrun
    every run time seen is assumed to follow a heavy tail (Pareto, index 1:
    ``P(T > t | T > e) = e / t``), so its ``q``-quantile is ``elapsed / (1 - q)``.

    >>> times = RunTimes()
    >>> times.learn([("ana", "step", 1, 3.0)] * 3)
    >>> times.total("ana", "step", 0.5, gpus=1), times.total("ana", "step", 0.5, elapsed=4.0)
    (3.0, 8.0)
    >>> RunTimes().total("bob", "x", 0.5) is None
    True
    """

    def __init__(self, window: int = 2000, group_min: int = 3) -> None:
        self.window = int(window)
        self.group_min = max(1, int(group_min))
        self._recent: dict[tuple[Any, ...], deque[float]] = {}
        self._sorted: dict[tuple[Any, ...], list[float]] = {}
        # ``_estimated`` jobs by (job id, quantile), with the job each was made from: a
        # replay forecasts the same queue at every arrival, and copying each job anew (a
        # dataclass ``replace``) was a tenth of the forecast's time
        self.estimated: dict[tuple[str, float], tuple[QueuedJob, QueuedJob]] = {}

    def learn(
        self, finished: Iterable[tuple[str, str, float, float]], replace: bool = False
    ) -> None:
        """Take in ``(owner, name, gpus, seconds)`` of finished jobs (each once)."""
        if replace:
            self._recent.clear()
            self._sorted.clear()
        for owner, name, gpus, seconds in finished:
            if not (seconds > 0 and math.isfinite(seconds)):
                continue
            for key in _groups(owner, name, float(gpus)):
                recent = self._recent.get(key)
                if recent is None:
                    recent = self._recent[key] = deque(maxlen=self.window)
                    self._sorted[key] = []
                ordered = self._sorted[key]
                if len(recent) == recent.maxlen:
                    del ordered[bisect.bisect_left(ordered, recent[0])]
                recent.append(seconds)
                bisect.insort(ordered, seconds)

    def __len__(self) -> int:
        return len(self._sorted.get((), ()))

    def _group(
        self, owner: str, name: str, gpus: float
    ) -> tuple[tuple[Any, ...], list[float]] | None:
        *specific, everyone = _groups(owner, name, gpus)
        for key in specific:
            found = self._sorted.get(key)
            if found is not None and len(found) >= self.group_min:
                return key, found
        found = self._sorted.get(everyone)
        return (everyone, found) if found else None

    def total(
        self,
        owner: str,
        name: str,
        q: float,
        elapsed: float = 0.0,
        time_limit: float | None = None,
        gpus: float = 1.0,
    ) -> float | None:
        """Seconds a job of ``owner`` named ``name`` runs in all (``q``-quantile), given it
        has run ``elapsed`` already; at most ``time_limit``; ``None`` when nothing is known."""
        group = self._group(owner, name, float(gpus))
        if group is None:
            return time_limit
        _, found = group
        i = bisect.bisect_right(found, elapsed)
        longer = len(found) - i
        if longer:
            value = found[i + min(longer - 1, max(0, math.ceil(q * longer) - 1))]
        else:
            value = max(elapsed, 1.0) / (1.0 - min(q, 0.99))
        return value if time_limit is None else min(value, max(time_limit, elapsed))


def _groups(owner: str, name: str, gpus: float) -> tuple[tuple[Any, ...], ...]:
    """The groups a job's run time counts in, most specific first, everyone last."""
    by_owner: tuple[tuple[Any, ...], ...] = (("shape", owner, gpus), ("owner", owner))
    if name:
        by_owner = (("job", owner, name, gpus), ("name", owner, name), *by_owner)
    return (*by_owner, ())

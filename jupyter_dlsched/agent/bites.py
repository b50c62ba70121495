"""Limits that bite: each time one does it is counted, and logged once a minute for each
limit and user, with the figures.

A limit that protects everyone from one user (a connection cap, a page of the
queue, the queued-jobs cap, the metrics port's slots) acts silently for the
user it stops, so the service's log and its metrics say so instead: a line
``dlsched agent: limit connections_per_user: ben has 256 connections open ...``
at most once a minute for each (limit, user), saying how many more times it bit
since the last line, and ``dlsched_limit_refusals_total{limit}`` counting every
time (``machine/metrics.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jupyter_dlsched.agent")

#: Seconds between two log lines of one limit for one user.
LOG_EVERY = 60.0
#: (limit, user) pairs remembered for the rate limit of the log; older ones are forgotten.
MAX_REMEMBERED = 4096


class Bites:
    """The counts of each limit that bit, and the last time each was logged per user."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts: dict[str, int] = {}
        self._clock = clock
        #: (limit, user) -> (when it was last logged, times it bit since)
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

    def hit(self, limit: str, user: str, message: str, *args: Any) -> None:
        """``limit`` bit for ``user``; ``message % args`` says how (the figures)."""
        self.counts[limit] = self.counts.get(limit, 0) + 1
        now = self._clock()
        key = (limit, user)
        last, since = self._logged.get(key, (-LOG_EVERY, 0))
        if now - last < LOG_EVERY:
            self._logged[key] = (last, since + 1)
            return
        if key not in self._logged and len(self._logged) >= MAX_REMEMBERED:
            self._forget(now)
        self._logged[key] = (now, 0)
        more = f" ({since} more times since the last line)" if since else ""
        log.warning("dlsched agent: limit %s: " + message + "%s", limit, *args, more)

    def _forget(self, now: float) -> None:
        for key, (last, _) in list(self._logged.items()):
            if now - last >= LOG_EVERY:
                del self._logged[key]
        while len(self._logged) >= MAX_REMEMBERED:  # all recent: the oldest goes
            del self._logged[next(iter(self._logged))]

"""What the server extension holds while it runs: a Scheduler, the sampler, and cheap reads.

Handlers call these methods on the server's event loop; each is one or two short
SQLite reads. ``status`` is asked for by every open JupyterLab every couple of
seconds, so it is cached until the ledger changes (``PRAGMA data_version``) or a
second has passed.
"""

from __future__ import annotations

import copy
import getpass
import threading
import time
from pathlib import Path
from typing import Any

from ..pool import PoolInfo
from ..scheduler import Scheduler
from ..store import ACTIVE, STATES, TERMINAL
from .sampler import Sampler

#: Seconds a cached ``status`` answer may be reused while the ledger is unchanged.
STATUS_MAX_AGE = 1.0
#: Seconds one pool reading serves every open tab and the sampler. Longer than the core's
#: probe cache (1 s), so each reading starts from a fresh probe: ``Scheduler.pool()``
#: adds granted memory to simulated GPUs in the probe's cached object.
POOL_MAX_AGE = 1.1


class ServerState:
    """The scheduler and sampler of one Jupyter server.

    >>> state = ServerState(Scheduler(home="/tmp/dls"), sample_interval=5, history_retention=86400)  # doctest: +SKIP
    >>> state.status()["counts"]  # doctest: +SKIP
    {'queued': 0, 'running': 0, ...}
    """

    states = STATES

    def __init__(
        self, scheduler: Scheduler, sample_interval: float, history_retention: float
    ) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.sample_interval = sample_interval
        self.history_retention = history_retention
        self.user = getpass.getuser()
        self.sampler = Sampler(
            self.store, self.read_pool, interval=sample_interval, retention=history_retention
        )
        self._pool_lock = threading.Lock()
        self._pool: PoolInfo | None = None
        self._pool_at = 0.0
        self._status_lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._status_key: tuple[int, float] = (-1, 0.0)

    def start(self) -> None:
        self.scheduler.start()
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
        self.scheduler.close()

    # -- reads -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        version = self.store.data_version()
        now = time.monotonic()
        with self._status_lock:
            cached_version, cached_at = self._status_key
            if (
                self._status is not None
                and cached_version == version
                and now - cached_at < STATUS_MAX_AGE
            ):
                return self._status
        status = dict(self.scheduler.status())
        status.update(
            {
                "user": self.user,
                "sample_interval": self.sample_interval,
                "history_retention": self.history_retention,
                "time": time.time(),
            }
        )
        with self._status_lock:
            self._status, self._status_key = status, (version, now)
        return status

    def invalidate(self) -> None:
        # our own writes do not change this connection's data_version
        with self._status_lock:
            self._status = None

    def read_pool(self) -> PoolInfo:
        """The pool now, read at most once per ``POOL_MAX_AGE`` (a private copy)."""
        with self._pool_lock:
            now = time.monotonic()
            if self._pool is None or now - self._pool_at >= POOL_MAX_AGE:
                self._pool = copy.deepcopy(self.scheduler.pool())
                self._pool_at = now
            return copy.deepcopy(self._pool)

    def pool_json(self) -> dict[str, Any]:
        return self.read_pool().to_json()

    def job_json(self, job_id: str) -> dict[str, Any]:
        return self.scheduler.info(job_id).to_json()

    def jobs_json(
        self, states: list[str] | None, owner: str | None, limit: int, offset: int, order: str
    ) -> list[dict[str, Any]]:
        if order == "queue":
            # Queue order: running (newest first), then waiting jobs by their place in line,
            # then finished ones (newest first). Active jobs are few, so sort them here.
            wanted = states if states is not None else list(STATES)
            active = [s for s in wanted if s in ACTIVE]
            finished = [s for s in wanted if s in TERMINAL]
            rows = self.store.jobs(states=active, owner=owner, newest_first=True) if active else []
            rows.sort(key=lambda j: (j.state != "running", j.position or 1 << 30, -j.seq))
            if finished:
                rows += self.store.jobs(
                    states=finished, owner=owner, limit=offset + limit, newest_first=True
                )
            return [j.to_json() for j in rows[offset : offset + limit]]
        rows = self.store.jobs(
            states=states,
            owner=owner,
            limit=limit,
            offset=offset,
            newest_first=order == "newest",
        )
        return [j.to_json() for j in rows]

    def log_path(self, job_id: str) -> Path:
        return self.scheduler.log_path(job_id)

    def samples(
        self, since: float, until: float, source: str | None, max_rows: int
    ) -> list[dict[str, Any]]:
        rows = self.store.samples(since, until)
        if source:
            rows = [
                r for r in rows if r["source"] == source or r["source"].startswith(source + ":")
            ]
        if len(rows) > max_rows:
            stride = -(-len(rows) // max_rows)
            rows = rows[::stride]
        return rows

    # -- steering --------------------------------------------------------------------------

    def cancel(self, job_id: str) -> None:
        self.scheduler.cancel(job_id)
        self.invalidate()

    def set_priority(self, job_id: str, priority: int | str) -> None:
        self.scheduler.set_priority(job_id, priority)
        self.invalidate()

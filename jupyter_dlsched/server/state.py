"""What the server extension holds while it runs: a Scheduler, the sampler, and cheap reads.

Handlers call these methods on the server's event loop. Every open JupyterLab asks
for the status and the queue every couple of seconds, so answers are shared: an
answer is reused until a job changes (a new row in the ledger's ``events`` table,
which every submit, state change and priority change writes) or, for job lists
whose progress can move without an event, for at most ``JOBS_MAX_AGE`` seconds.
"""

from __future__ import annotations

import copy
import getpass
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

from ..client.scheduler import Scheduler
from ..machine.inventory import PoolInfo
from ..machine.sampling import Sampler
from ..nbjobs.record import read_record
from ..vocab.schema import ACTIVE, STATES, TERMINAL, JobInfo

#: Seconds a status answer may be reused while no job changed (the pool's shape can).
STATUS_MAX_AGE = 2.0
#: Seconds a job list may be reused while no job changed (progress moves without events).
JOBS_MAX_AGE = 1.0
#: Seconds the stage-in cache answer may be reused while no job changed (staging moves
#: without events).
CACHE_MAX_AGE = 1.0
#: Seconds one pool reading serves every open tab and the sampler (NVML and psutil are
#: asked at most about once a second, however many clients poll).
POOL_MAX_AGE = 1.1

T = TypeVar("T")


class AnswerCache:
    """Answers by key, valid while the ledger's last event is the same and for ``max_age``."""

    def __init__(self, max_age: float, size: int = 64) -> None:
        self.max_age = max_age
        self.size = size
        self._lock = threading.Lock()
        self._answers: OrderedDict[Hashable, tuple[int, float, Any]] = OrderedDict()

    def get(self, key: Hashable, last_event: int, compute: Callable[[], T]) -> T:
        now = time.monotonic()
        with self._lock:
            hit = self._answers.get(key)
            if hit is not None and hit[0] == last_event and now - hit[1] < self.max_age:
                self._answers.move_to_end(key)
                value: T = hit[2]
                return value
        value = compute()
        with self._lock:
            self._answers[key] = (last_event, now, value)
            self._answers.move_to_end(key)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._answers.clear()


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
        #: the server's folder: a notebook job's executed copy is opened by its path in it
        self.root_dir: str | None = None
        self.sample_interval = sample_interval
        self.history_retention = history_retention
        self.user = getpass.getuser()
        #: a pool shared by every user of the machine (its ledger is the service's)
        self.shared = scheduler.shared
        self.sampler = Sampler(
            self.store, self.read_pool, interval=sample_interval, retention=history_retention
        )
        self._pool_lock = threading.Lock()
        self._pool: PoolInfo | None = None
        self._pool_at = 0.0
        self._status_cache = AnswerCache(STATUS_MAX_AGE, size=1)
        self._jobs_cache = AnswerCache(JOBS_MAX_AGE)
        self._data_cache = AnswerCache(CACHE_MAX_AGE, size=1)

    def start(self) -> None:
        self.scheduler.start()
        if not self.shared:  # a shared pool's history would be the service's to record
            self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
        self.scheduler.close()

    def last_event(self) -> int:
        """The newest event's number: changes with every submit, state and priority change."""
        return self.store.last_event_seq()

    # -- reads -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self._status_cache.get("status", self.last_event(), self._compute_status)

    def _compute_status(self) -> dict[str, Any]:
        status = dict(self.scheduler.status())
        pool = status.get("pool") or {}
        status.update(
            {
                "user": self.user,
                # may cancel and reprioritise every job (one's own pool: always)
                "admin": bool(pool.get("admin", True)),
                "shared": self.shared,
                "sample_interval": self.sample_interval,
                "history_retention": self.history_retention,
                "time": time.time(),
            }
        )
        return status

    def metrics(self) -> bytes:
        """The pool's Prometheus metrics (a shared pool's come from its service)."""
        if self.shared:
            return str(self.scheduler.ask_service("metrics")["text"]).encode()
        from ..machine.metrics import exposition

        pool = self.read_pool()
        return exposition(
            self.store, pool if any(not g.simulated for g in pool.gpus) else None, time.time()
        )

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
        return self._job_json(self.scheduler.info(job_id), self._schedules())

    def _schedules(self) -> dict[str, dict[str, Any]]:
        """The schedule each job is the last run of, by job id (``--every``)."""
        return {
            s.last_job: {"id": s.id, "every": s.every, "next_run": s.next_run}
            for s in self.scheduler.schedules()
            if s.last_job
        }

    def _job_json(self, job: JobInfo, schedules: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """A job's JSON; a notebook job's with where its executed copy is (``nbjobs/``), the
        last run of a schedule with the schedule and its next run."""
        data = job.to_json()
        if job.id in schedules:
            data["schedule"] = schedules[job.id]
        if job.kind == "notebook" and job.uid == os.getuid():
            record = read_record(self.scheduler.log_path(job.id).parent)
            if record is not None:
                record["path"] = _in_root(self.root_dir, record["output"])
            data["notebook"] = record
        return data

    def jobs_json(
        self, states: list[str] | None, owner: str | None, limit: int, offset: int, order: str
    ) -> list[dict[str, Any]]:
        key = (tuple(states) if states is not None else None, owner, limit, offset, order)
        return self._jobs_cache.get(
            key, self.last_event(), lambda: self._jobs_json(states, owner, limit, offset, order)
        )

    def _jobs_json(
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
            schedules = self._schedules()
            return [self._job_json(j, schedules) for j in rows[offset : offset + limit]]
        rows = self.store.jobs(
            states=states,
            owner=owner,
            limit=limit,
            offset=offset,
            newest_first=order == "newest",
        )
        schedules = self._schedules()
        return [self._job_json(j, schedules) for j in rows]

    def cache_json(self) -> dict[str, Any]:
        """The stage-in cache (``Scheduler.cache_info()``), shared by every open tab."""
        return self._data_cache.get("cache", self.last_event(), self.scheduler.cache_info)

    def log_path(self, job_id: str) -> Path:
        return self.scheduler.log_path(job_id)

    def samples(
        self, since: float, until: float, source: str | None, max_rows: int
    ) -> list[dict[str, Any]]:
        """Utilisation rows in ``[since, until]``, each source thinned evenly to fit ``max_rows``
        (``store.usage.thinned_samples``: thinned in SQLite, never loaded whole into the server)."""
        if self.shared:  # recorded by the pool's service
            reply = self.scheduler.ask_service(
                "samples", since=since, until=until, source=source, max_rows=max_rows
            )
            return list(reply["samples"])
        return self.store.usage.thinned_samples(since, until, source, max_rows)

    def accounting(self, since: float) -> dict[str, Any]:
        """Per-user totals of the jobs that ended in the last ``since`` seconds."""
        from ..vocab.history import totals_by_owner

        start = time.time() - since
        jobs = self.store.finished_jobs(since=start)
        return {
            "since": start,
            "users": [
                {
                    "user": t.owner,
                    "jobs": t.jobs,
                    "succeeded": t.succeeded,
                    "gpu_hours": round(t.gpu_hours, 6),
                    "cpu_time": round(t.cpu_time, 3),
                }
                for t in totals_by_owner(jobs)
            ],
        }

    # -- steering --------------------------------------------------------------------------

    def cancel(self, job_id: str) -> None:
        self.scheduler.cancel(job_id)
        self._forget()

    def set_priority(self, job_id: str, priority: int | str) -> None:
        self.scheduler.set_priority(job_id, priority)
        self._forget()

    def requeue(self, job_id: str) -> str:
        """Run a finished job again; the new job's id."""
        new_id = self.scheduler.requeue_job(job_id).id
        self._forget()
        return new_id

    def _forget(self) -> None:
        # A cancel of a running job only sets a flag (no event yet); show it from now on.
        self._status_cache.clear()
        self._jobs_cache.clear()


def _in_root(root: str | None, path: str) -> str | None:
    """``path`` as JupyterLab names it (relative to the server's folder), or None outside it."""
    if root is None:
        return None
    base = Path(root).resolve()
    full = Path(path).resolve()
    if base not in full.parents:
        return None
    return full.relative_to(base).as_posix()

"""Utilisation history: a background thread that writes pool readings into the ledger.

One reading is a handful of rows (one per GPU, one for CPU, one for RAM), written in
one transaction; rows older than the retention are pruned now and then, so the
``samples`` table stays bounded at about ``retention / interval × (GPUs + 2)`` rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..store import Store
from .inventory import PoolInfo

log = logging.getLogger(__name__)

SampleRow = tuple[float, str, Any, Any, Any, Any]

#: Prune at most this often: deleting is a write, and history is only read in minutes.
PRUNE_EVERY_S = 60.0


def pool_rows(pool: PoolInfo, now: float) -> list[SampleRow]:
    """The sample rows for one pool reading.

    Sources are ``gpu:<index>`` (util %, memory, and per-job memory in ``data``),
    ``cpu`` (util %) and ``ram`` (memory).
    """
    rows: list[SampleRow] = []
    for gpu in pool.gpus:
        per_job: dict[str, int] = {}
        for process in gpu.processes:
            if process.job_id:
                per_job[process.job_id] = per_job.get(process.job_id, 0) + process.used_mem
        data: dict[str, Any] = {}
        if per_job:
            data["jobs"] = per_job
        if gpu.jobs:
            data["allocated"] = list(gpu.jobs)
        if gpu.simulated:
            data["simulated"] = True  # its line is the memory allocated, not a measurement
        util = gpu.reading if gpu.simulated else gpu.util
        rows.append((now, f"gpu:{gpu.index}", util, gpu.mem_used, gpu.mem_total, data or None))
    rows.append((now, "cpu", pool.cpu_percent, None, None, None))
    rows.append((now, "ram", None, pool.mem_used, pool.mem_total, None))
    return rows


class Sampler:
    """Reads the pool every ``interval`` seconds and stores it; keeps ``retention`` seconds.

    >>> sampler = Sampler(store, read_pool=scheduler.pool, interval=5, retention=86400)  # doctest: +SKIP
    >>> sampler.start(); ...; sampler.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        store: Store,
        read_pool: Callable[[], PoolInfo],
        interval: float,
        retention: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.read_pool = read_pool
        self.interval = interval
        self.retention = retention
        self.clock = clock
        self.samples_taken = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_prune = 0.0

    def sample_once(self) -> int:
        """Take one reading now; returns the number of rows written."""
        now = self.clock()
        rows = pool_rows(self.read_pool(), now)
        self.store.usage.add_samples(rows)
        self.samples_taken += 1
        if now - self._last_prune >= PRUNE_EVERY_S:
            self.store.usage.prune_samples(now - self.retention)
            self._last_prune = now
        return len(rows)

    def start(self) -> None:
        if self.interval <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="dlsched-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.store.close()  # this thread's connection

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:
                # A failed reading (NVML hiccup, locked ledger) must not end the history.
                log.exception("dlsched: utilisation sample failed")
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

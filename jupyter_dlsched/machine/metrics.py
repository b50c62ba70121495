"""Prometheus metrics of a pool, in the text exposition format (through ``prometheus_client``).

What the ledger knows, read when a scraper asks (nothing is kept between
scrapes, so every participant that can read the ledger answers the same):

=========================================  =========  =============================================
``dlsched_jobs{state}``                    gauge      jobs in each state
``dlsched_gpus``                           gauge      GPUs in the pool (``simulated="1"`` for each
                                                      simulated one)
``dlsched_gpu_allocated_ratio{gpu}``       gauge      share of each GPU granted to running jobs
``dlsched_gpu_utilization_ratio{gpu}``     gauge      measured compute use (real GPUs only)
``dlsched_gpu_memory_used_bytes{gpu}``     gauge      measured memory in use (real GPUs only)
``dlsched_gpu_outside_memory_bytes``       gauge      memory held by processes no job owns
``{gpu,user}``                                        (real GPUs only)
``dlsched_queue_wait_seconds``             histogram  submit-to-start wait of each job that started
``dlsched_user_gpus_allocated{user}``      gauge      GPUs held by each user's running jobs
``dlsched_user_gpu_seconds_total{user}``   counter    GPU-seconds each user's jobs have held
``dlsched_user_jobs_running{user}``        gauge      running jobs of each user
``dlsched_limit_refusals_total{limit}``    counter    times each limit of a shared pool's service
                                                      refused or cut a request (its service only)
=========================================  =========  =============================================

>>> from jupyter_dlsched.store import Store
>>> text = exposition(Store("/tmp/dls-demo"), None, now=0.0)  # doctest: +SKIP
>>> b"dlsched_jobs{state=\\"queued\\"}" in text  # doctest: +SKIP
True
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..vocab.history import idle_gpu_hours
from ..vocab.schema import STATES

if TYPE_CHECKING:
    from ..store import Store
    from .inventory import PoolInfo

#: The text format's content type (what a scrape is answered with).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Upper bounds of the wait histogram's buckets, in seconds: a second to a week.
WAIT_BUCKETS: tuple[float, ...] = (1, 10, 60, 300, 900, 1800, 3600, 14400, 43200, 86400, 604800)


class PoolCollector(Collector):
    """The metrics of one ledger at one moment (``collect`` reads it)."""

    def __init__(
        self,
        store: Store,
        pool: PoolInfo | None,
        now: float,
        limits: Mapping[str, int] | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.now = now
        #: how many times each of a service's limits bit (``agent/bites.py``)
        self.limits = limits

    def collect(self) -> Iterator[Metric]:
        store = self.store
        counts = store.count_jobs()
        jobs = GaugeMetricFamily("dlsched_jobs", "Jobs in each state.", labels=["state"])
        for state in STATES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs

        inventory = store.get_meta("inventory", {}) or {}
        cards = list(inventory.get("gpus") or [])
        gpus = GaugeMetricFamily(
            "dlsched_gpus", "GPUs in the pool, by whether they are simulated.", labels=["simulated"]
        )
        simulated = sum(1 for g in cards if g.get("simulated"))
        gpus.add_metric(["0"], len(cards) - simulated)
        gpus.add_metric(["1"], simulated)
        yield gpus

        if self.limits is not None:
            bit = CounterMetricFamily(
                "dlsched_limit_refusals",
                "Times each of the service's limits refused or cut a request.",
                labels=["limit"],
            )
            for limit, times in sorted(self.limits.items()):
                bit.add_metric([limit], times)
            yield bit

        # a success whose process still exits holds its GPUs until it is gone
        granted = [j for j in store.jobs(holding=True) if j.backend == "local"]
        running = [j for j in granted if j.state == "running"]
        allocated: dict[int, float] = defaultdict(float)
        per_user: dict[str, float] = defaultdict(float)
        running_per_user: dict[str, int] = defaultdict(int)
        held_now: dict[str, float] = defaultdict(float)
        sizes = {int(g.get("index", i)): int(g.get("mem_total") or 0) for i, g in enumerate(cards)}
        for job in running:
            running_per_user[job.owner] += 1
            if job.started is not None:
                held_now[job.owner] += max(0.0, self.now - job.started) * job.gpus
        for job in granted:
            placement = job.placement
            if placement is None:
                continue
            for at, index in enumerate(placement.gpus):
                share = 1.0
                if placement.shared and at < len(placement.gpu_mem) and sizes.get(index):
                    share = min(1.0, placement.gpu_mem[at] / sizes[index])
                allocated[index] += share
                per_user[job.owner] += share
        ratio = GaugeMetricFamily(
            "dlsched_gpu_allocated_ratio",
            "Share of each GPU granted to running jobs (1: all of it).",
            labels=["gpu"],
        )
        for i, card in enumerate(cards):
            index = int(card.get("index", i))
            ratio.add_metric([str(index)], min(1.0, allocated.get(index, 0.0)))
        yield ratio

        utilization = GaugeMetricFamily(
            "dlsched_gpu_utilization_ratio",
            "Measured compute use of each real GPU (never reported for simulated ones).",
            labels=["gpu"],
        )
        memory = GaugeMetricFamily(
            "dlsched_gpu_memory_used_bytes",
            "Measured memory in use on each real GPU (never reported for simulated ones).",
            labels=["gpu"],
        )
        outside = GaugeMetricFamily(
            "dlsched_gpu_outside_memory_bytes",
            "GPU memory held by processes no job of the pool owns, by GPU and Unix user.",
            labels=["gpu", "user"],
        )
        for gpu in self.pool.gpus if self.pool is not None else ():
            if gpu.simulated:
                continue
            if gpu.util is not None:
                utilization.add_metric([str(gpu.index)], gpu.util / 100.0)
            memory.add_metric([str(gpu.index)], gpu.mem_used)
            held: dict[str, int] = defaultdict(int)
            for process in gpu.processes:
                if process.job_id is None:
                    held[process.user or "unknown"] += process.used_mem
            for user, used in sorted(held.items()):
                outside.add_metric([str(gpu.index), user], used)
        yield utilization
        yield memory
        yield outside

        yield _histogram(store.wait_times())

        users = GaugeMetricFamily(
            "dlsched_user_gpus_allocated", "GPUs held by each user's running jobs.", labels=["user"]
        )
        for user, share in sorted(per_user.items()):
            users.add_metric([user], share)
        yield users
        seconds = CounterMetricFamily(
            "dlsched_user_gpu_seconds",
            "GPU-seconds each user's jobs have held (running ones up to now).",
            labels=["user"],
        )
        attained = store.attained_by_owner()
        for user in sorted(set(attained) | set(held_now)):
            seconds.add_metric([user], attained.get(user, 0.0) + held_now.get(user, 0.0))
        yield seconds
        active = GaugeMetricFamily(
            "dlsched_user_jobs_running", "Running jobs of each user.", labels=["user"]
        )
        for user, n in sorted(running_per_user.items()):
            active.add_metric([user], n)
        yield active

        leases = GaugeMetricFamily(
            "dlsched_kernel_leases",
            "GPU kernels' leases (jobs of kind kernel) waiting or holding their GPUs.",
            labels=["state"],
        )
        by_state = store.count_kind("kernel")
        for state in ("queued", "running"):
            leases.add_metric([state], by_state.get(state, 0))
        yield leases
        idle = GaugeMetricFamily(
            "dlsched_kernel_idle_gpu_seconds",
            "GPU-seconds each user's running GPU kernels have held while no cell ran.",
            labels=["user"],
        )
        idle_by_user: dict[str, float] = defaultdict(float)
        for job in running:
            if job.kind == "kernel":
                idle_by_user[job.owner] += 3600.0 * idle_gpu_hours(job)
        for user, held_idle in sorted(idle_by_user.items()):
            idle.add_metric([user], held_idle)
        yield idle


def _histogram(waits: Iterable[float]) -> HistogramMetricFamily:
    counts = [0] * len(WAIT_BUCKETS)
    total, n = 0.0, 0
    for wait in waits:
        wait = max(0.0, float(wait))
        total += wait
        n += 1
        for i, bound in enumerate(WAIT_BUCKETS):
            if wait <= bound:
                counts[i] += 1
                break
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(WAIT_BUCKETS, counts, strict=True):
        running += count
        buckets.append((_bound(bound), running))
    buckets.append(("+Inf", n))
    family = HistogramMetricFamily(
        "dlsched_queue_wait_seconds", "How long each job that started waited after submission."
    )
    family.add_metric([], buckets, sum_value=total)
    return family


def _bound(value: float) -> str:
    return str(int(value)) + ".0" if value == int(value) else repr(value)


def exposition(
    store: Store, pool: PoolInfo | None, now: float, limits: Mapping[str, int] | None = None
) -> bytes:
    """The pool's metrics now, as the text a Prometheus scrape is answered with."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(store, pool, now, limits))
    return bytes(generate_latest(registry))


def parse(text: str) -> dict[str, Any]:
    """Samples by metric family (``name -> [(labels, value), ...]``): for tests and checks,
    through ``prometheus_client``'s own parser (which refuses malformed text)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(dict(s.labels), s.value, s.name) for s in family.samples]
    return out

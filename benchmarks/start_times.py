"""Start-time forecast: what it costs a whole-queue decision with a deep queue.

    python benchmarks/start_times.py [--queued 10000] [--repeat 5]

On plain data (no ledger), the way ``engine.tick.decide`` calls it: 8 GPUs busy
with jobs of learnt run times, ``--queued`` jobs waiting (1, 2 or 4 GPUs,
three owners, names from a small set), run times learnt from 2,000 finished
jobs. For each built-in live policy it prints the time of one forecast
(both passes) under the live bounds (``start_times.FORECAST_JOBS`` jobs,
``FORECAST_BUDGET`` seconds), how many jobs got an estimate, and the same
without the time budget (what the job bound alone costs), next to one plain
whole-queue policy call for scale.
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import statistics
import time

from jupyter_dlsched.forecast.replay import RunTimes, forecast
from jupyter_dlsched.forecast.start_times import FORECAST_BUDGET, FORECAST_JOBS
from jupyter_dlsched.policy import QueuedJob, RunningJob, get_policy
from jupyter_dlsched.vocab.resources import Capacity, Placement, Request

GIB = 2**30
POLICIES = ("priority", "fifo", "fifo-ff", "sjf", "fair", "las", "gittins")


def setup(
    queued: int, seed: int = 0
) -> tuple[list[QueuedJob], list[RunningJob], Capacity, RunTimes]:
    rng = random.Random(seed)
    owners, names = ("ana", "bob", "cy"), ("train", "eval", "sweep", "prep")
    times = RunTimes()
    times.learn(
        [
            (
                rng.choice(owners),
                rng.choice(names),
                rng.choice([1, 2, 4]),
                rng.lognormvariate(6, 1.2),
            )
            for _ in range(2000)
        ]
    )
    capacity = Capacity.empty(8, 80 * GIB, 64, 512 * GIB)
    running = []
    for g in range(8):
        placement = Placement(gpus=(g,), gpu_mem=(80 * GIB,), cpus=(g,), cpu_share=1.0, mem=GIB)
        running.append(
            RunningJob(
                f"r{g}",
                g,
                0.0,
                -rng.uniform(0, 600),
                Request(1, None, 1, GIB),
                placement,
                owner=rng.choice(owners),
                name=rng.choice(names),
            )
        )
        capacity = capacity.take(placement)
    waiting = [
        QueuedJob(
            f"w{i}",
            100 + i,
            float(i),
            Request(rng.choice([1, 1, 2, 4]), None, 1, GIB),
            priority=rng.choice([0, 50, 50, 100]),
            owner=rng.choice(owners),
            name=rng.choice(names),
        )
        for i in range(queued)
    ]
    return waiting, running, capacity, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    queue, running, capacity, times = setup(args.queued)
    print(f"{args.queued} queued, 8 GPUs busy; Python {platform.python_version()}")
    print(f"bounds: {FORECAST_JOBS} jobs, {FORECAST_BUDGET * 1000:.0f} ms\n")
    print(
        "| policy | policy call, whole queue | forecast (live bounds) | estimated | forecast, job bound only | estimated |"
    )
    print("|---|---|---|---|---|---|")
    for name in POLICIES:
        policy = get_policy(name)
        began = time.perf_counter()
        decisions = policy(queue, running, capacity, 0.0)
        call = time.perf_counter() - began
        order = {job_id: i for i, job_id in enumerate(decisions.order)}
        ordered = sorted(queue, key=lambda j: order.get(j.id, math.inf))
        live, free = [], []
        for _ in range(args.repeat):
            began = time.perf_counter()
            bounded = forecast(
                policy,
                ordered,
                running,
                capacity,
                0.0,
                times,
                max_jobs=FORECAST_JOBS,
                budget_s=FORECAST_BUDGET,
            )
            live.append(time.perf_counter() - began)
            began = time.perf_counter()
            whole = forecast(
                policy,
                ordered,
                running,
                capacity,
                0.0,
                times,
                max_jobs=FORECAST_JOBS,
                budget_s=math.inf,
            )
            free.append(time.perf_counter() - began)
        print(
            f"| `{name}` | {call * 1000:.1f} ms | {statistics.median(live) * 1000:.1f} ms "
            f"(max {max(live) * 1000:.1f}) | {len(bounded.estimates)} "
            f"| {statistics.median(free) * 1000:.1f} ms | {len(whole.estimates)} |"
        )


if __name__ == "__main__":
    main()

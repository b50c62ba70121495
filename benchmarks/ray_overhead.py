"""What our queue adds on Ray: a no-op job through the ledger vs a plain Ray task.

Both paths run in the same process against the same Ray cluster, one call at a
time, so the difference is the cost of the queue (spec, ledger insert, policy
tick, claim, lease, log streaming, recording the result) and nothing else.

    python benchmarks/ray_overhead.py                 # a local Ray (2 CPUs) started here
    python benchmarks/ray_overhead.py --jobs 500 --address auto
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def noop() -> None:
    return None


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "mean_ms": statistics.fmean(ordered) * 1000}


def timed(call: Callable[[], Any], n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def through_queue(sched: Any, n: int, warmup: int) -> tuple[list[float], dict[str, list[float]]]:
    """Round trips through the queue, with where each one's time went (ledger timestamps)."""
    for _ in range(warmup):
        sched.submit(noop, cpus=1).result(timeout=120)
    samples: list[float] = []
    parts: dict[str, list[float]] = {"to_running": [], "running": [], "to_handle": []}
    for _ in range(n):
        wall, start = time.time(), time.perf_counter()
        handle = sched.submit(noop, cpus=1)
        handle.result(timeout=120)
        samples.append(time.perf_counter() - start)
        resolved = time.time()
        info = handle.info()
        parts["to_running"].append(info.started - wall)
        parts["running"].append(info.finished - info.started)
        parts["to_handle"].append(resolved - info.finished)
    return samples, parts


def start_local_ray(temp: str) -> None:
    import ray

    for attempt in range(3):
        try:
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=temp,
                _node_ip_address="127.0.0.1",
            )
            return
        except Exception:
            # Ray's raylet waits 15 s for its agents; on a busy machine that can run out
            ray.shutdown()
            if attempt == 2:
                raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="round trips per path")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--address", help="an existing Ray cluster (default: start one here)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # stay on loopback
    import ray

    from jupyter_dlsched.client.scheduler import Scheduler

    temp = tempfile.mkdtemp(prefix="dlsray", dir="/tmp")
    home = tempfile.mkdtemp(prefix="dlsched-bench-")
    try:
        if args.address:
            ray.init(address=args.address)
        else:
            start_local_ray(temp)
        remote_noop = ray.remote(num_cpus=1)(noop)
        plain = timed(lambda: ray.get(remote_noop.remote()), args.jobs, args.warmup)
        with Scheduler(home=home, backend="ray") as sched:
            queued, parts = through_queue(sched, args.jobs, args.warmup)
        rows = {
            "plain Ray task": percentiles(plain),
            "through the dlsched queue": percentiles(queued),
        }
        overhead = {
            k: rows["through the dlsched queue"][k] - rows["plain Ray task"][k]
            for k in ("p50_ms", "p99_ms", "mean_ms")
        }
        machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Ray {ray.__version__}"
        print(f"no-op round trip, {args.jobs} sequential calls each ({machine})\n")
        print("| path | p50 | p99 | mean |")
        print("|---|---:|---:|---:|")
        for name, row in rows.items():
            print(
                f"| {name} | {row['p50_ms']:.1f} ms | {row['p99_ms']:.1f} ms "
                f"| {row['mean_ms']:.1f} ms |"
            )
        print(
            f"| overhead of the queue | {overhead['p50_ms']:+.1f} ms "
            f"| {overhead['p99_ms']:+.1f} ms | {overhead['mean_ms']:+.1f} ms |"
        )
        labels = {
            "to_running": "submit → `running` in the ledger (spec, insert, tick, claim)",
            "running": "`running` → `succeeded` (Ray task, monitor, result recorded)",
            "to_handle": "`succeeded` → `result()` returns",
        }
        print("\nwhere the queue's round trip went\n")
        print("| part | p50 | p99 |")
        print("|---|---:|---:|")
        breakdown = {}
        for key, label in labels.items():
            breakdown[key] = percentiles(parts[key])
            print(
                f"| {label} | {breakdown[key]['p50_ms']:.1f} ms | {breakdown[key]['p99_ms']:.1f} ms |"
            )
        if args.json:
            with open(args.json, "w") as out:
                report = {"machine": machine, "jobs": args.jobs, **rows, "breakdown": breakdown}
                json.dump(report, out, indent=2)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

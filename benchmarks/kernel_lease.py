"""GPU kernels: what a lease adds to a kernel's start, and how fast a freed GPU moves on.

    python benchmarks/kernel_lease.py [--runs 5] [--json PATH]

Private temporary folders, one simulated GPU (``DLSCHED_SIMULATE_GPUS``); nothing
touches the user's state folder or kernelspecs. Real kernels through
``jupyter_client.KernelManager``:

* start: ``start_kernel()`` until ``wait_for_ready()`` returns, for the plain IPython
  kernelspec and for a GPU kernelspec (its lease queued, granted, then the kernel);
* shutdown → job running: ``shutdown_kernel()`` of a GPU kernel called, to the
  ``running`` event of a job that waited for its GPU;
* restart: ``restart_kernel()`` of a GPU kernel until ready again (the lease is kept).

Prints a Markdown table of medians (and the slowest run); ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlsched-kernel-bench-") as tmp:
        os.environ.update(
            DLSCHED_HOME=f"{tmp}/home",
            DLSCHED_SIMULATE_GPUS="1x16GiB",
            JUPYTER_DATA_DIR=f"{tmp}/data",
            JUPYTER_RUNTIME_DIR=f"{tmp}/runtime",
        )
        rows = measure(args.runs, Path(tmp))
    print("| what | median (s) | slowest (s) | runs |")
    print("|---|---|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.2f} | {max(values):.2f} | {len(values)} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def measure(runs: int, tmp: Path) -> dict[str, list[float]]:
    from ipykernel.kernelspec import install as install_plain
    from jupyter_client import KernelManager

    from jupyter_dlsched.agent.client import AgentClient, user_address
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

    install_plain(user=True, kernel_name="plain")
    install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="gpu")
    rows: dict[str, list[float]] = {
        "start, plain kernel": [],
        "start, GPU kernel (lease granted at once)": [],
        "restart, GPU kernel (lease kept)": [],
        "shutdown of a GPU kernel → waiting job running": [],
    }
    s = Scheduler(os.environ["DLSCHED_HOME"], loop=False)

    def started(name: str) -> tuple[Any, float]:
        km = KernelManager(kernel_name=name)
        t0 = time.perf_counter()
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        elapsed = time.perf_counter() - t0
        kc.stop_channels()
        return km, elapsed

    try:
        for _ in range(runs):
            km, elapsed = started("plain")
            rows["start, plain kernel"].append(elapsed)
            km.shutdown_kernel(now=True)

            km, elapsed = started("gpu")
            rows["start, GPU kernel (lease granted at once)"].append(elapsed)
            kc = km.client()
            kc.start_channels()
            t0 = time.perf_counter()
            km.restart_kernel()
            kc.wait_for_ready(timeout=120)
            rows["restart, GPU kernel (lease kept)"].append(time.perf_counter() - t0)
            kc.stop_channels()

            job = s.submit_command([sys.executable, "-c", "pass"], gpus=1)
            while s.info(job.id).waiting is None:
                time.sleep(0.05)
            asked = time.time()
            km.shutdown_kernel()
            while s.info(job.id).state == "queued":
                time.sleep(0.01)
            started_at = s.info(job.id).started or time.time()
            rows["shutdown of a GPU kernel → waiting job running"].append(started_at - asked)
            job.result(timeout=60)
    finally:
        for job in s.jobs(state=["queued", "running"]):
            s.cancel(job.id)
        s.close()
        try:
            AgentClient(user_address(Path(os.environ["DLSCHED_HOME"]))).call("stop")
        except Exception:
            pass
    return rows


if __name__ == "__main__":
    main()

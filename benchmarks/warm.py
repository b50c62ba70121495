"""A function job, and a ``python train.py`` command job, that import torch: submit -> torch
imported inside the job, with the pool's default settings (the launcher learns what jobs
import) against preloading turned off (``DLSCHED_PRELOAD=none``), in the same run, one job
at a time.

    python benchmarks/warm.py              # 10 jobs each way; p50 of jobs 3-9
    python benchmarks/warm.py --jobs 6
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: one pool, one setting: its jobs' submit -> torch-imported times, printed one a line
RUN = r"""
import sys, time
from pathlib import Path
from jupyter_dlsched.client.scheduler import Scheduler

def with_torch():
    import time
    import torch  # noqa: F401
    return time.time()

SCRIPT = "import time\nimport torch\nprint('IMPORTED', time.time(), flush=True)\n"

with Scheduler(sys.argv[1]) as s:
    train = Path(sys.argv[1]).parent / "train.py"
    train.write_text(SCRIPT)
    for _ in range(int(sys.argv[2])):
        asked = time.time()
        if sys.argv[3] == "function":
            imported = s.submit(with_torch, cpus=0.25).result(timeout=300)
        else:
            job = s.submit_command([sys.executable, str(train)], cpus=0.25)
            job.wait(timeout=300)
            [line] = [x for x in job.logs().splitlines() if x.startswith("IMPORTED")]
            imported = float(line.split()[1])
        print(imported - asked, flush=True)
    status = s.status()
print("preload", status.get("preload"), flush=True)
"""


def one_setting(preload: str | None, jobs: int, kind: str) -> tuple[list[float], str]:
    root = Path(tempfile.mkdtemp(prefix="dlsched-warm-bench-"))
    env = {**os.environ, "DLSCHED_SIMULATE_GPUS": "1x16GiB"}
    env.pop("DLSCHED_PRELOAD", None)
    if preload is not None:
        env["DLSCHED_PRELOAD"] = preload
    try:
        out = subprocess.run(
            [sys.executable, "-c", RUN, str(root / "home"), str(jobs), kind],
            env=env, capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
    finally:
        stop = "from jupyter_dlsched.agent.client import AgentClient, user_address\n"
        stop += f"AgentClient(user_address({str(root / 'home')!r})).call('stop')"
        subprocess.run([sys.executable, "-c", stop], env=env, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    lines = out.stdout.splitlines()
    times = [float(x) for x in lines if not x.startswith("preload")]
    learnt = next((x for x in lines if x.startswith("preload")), "")
    return times, learnt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    print(f"# {platform.node()} · {os.cpu_count()} cores · Python {sys.version.split()[0]}")
    print(f"# {args.jobs} jobs one at a time; p50 of jobs 3-{args.jobs - 1} (the first learns)\n")
    print(
        f"| job | setting | first job | p50 of jobs 3-{args.jobs - 1} | learnt |\n"
        "|---|---|---|---|---|"
    )
    each = []
    for kind, job in (("function", "function"), ("command", "`python train.py`")):
        for label, preload in (("default (learns)", None), ("DLSCHED_PRELOAD=none", "none")):
            times, learnt = one_setting(preload, args.jobs, kind)
            later = times[2 : args.jobs - 1] or times
            print(
                f"| {job} | {label} | {times[0] * 1000:.0f} ms "
                f"| {statistics.median(later) * 1000:.0f} ms "
                f"| {learnt.removeprefix('preload ')} |",
                flush=True,
            )
            each.append((f"{job}, {label}", times))
    # where the p50 comes from: each job's time
    print(f"\n| job, setting | {' | '.join(str(n + 1) for n in range(args.jobs))} |")
    print(f"|---|{'---|' * args.jobs}")
    for name, times in each:
        print(f"| {name}, ms | {' | '.join(f'{t * 1000:.0f}' for t in times)} |")


if __name__ == "__main__":
    main()

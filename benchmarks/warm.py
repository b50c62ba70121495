"""A function job, and a ``python train.py`` command job, that import torch: submit -> torch
imported inside the job, with the pool's default settings (the launcher learns what jobs
import) against preloading turned off (``DLSCHED_PRELOAD=none``), in the same run, one job
at a time. Then a GPU kernel ("Python 3 · 1 GPU", through ``jupyter_client.KernelManager``):
start -> ready with ``import torch`` done, the spare kernel (default) against a spawned one
(``DLSCHED_PRELOAD=none``), one kernel at a time, each start once the spare is ready; ready is the kernel's first
``kernel_info`` reply.

    python benchmarks/warm.py              # 10 jobs each way; p50 of jobs 3-9; 4 kernels
    python benchmarks/warm.py --jobs 6
    python benchmarks/warm.py --kernels-only --kernels 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_dlsched.vocab.units import format_size

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


#: one Jupyter "server" (this process), one setting: per kernel, seconds from the start to
#: its kernel process launched (the lease), to ready, to ``import torch`` done
KERNELS = r"""
import json, os, sys, time
from pathlib import Path
from jupyter_client import KernelManager
from jupyter_dlsched.kernels import control, spares
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="gpu")
for i in range(int(sys.argv[1])):
    waited = time.time()
    while i and spares.enabled() and not any("torch" in s["modules"] for s in spares.waiting()):
        time.sleep(0.05)
    waited = time.time() - waited
    km = KernelManager(kernel_name="gpu")
    asked = time.time()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    # ready: the kernel's first kernel_info reply, as a front end sees the kernel come up
    # (wait_for_ready would add its own 0.2 s or more of listening to IOPub)
    asked_info = kc.kernel_info()
    while kc.get_shell_msg(timeout=300)["parent_header"].get("msg_id") != asked_info:
        pass
    ready = time.time()
    asked_torch = kc.execute("import torch")
    while kc.get_shell_msg(timeout=300)["parent_header"].get("msg_id") != asked_torch:
        pass
    imported = time.time()
    launched = control.read(km.provisioner.folder, "kernel.json")["started"]
    print(json.dumps([launched - asked, ready - asked, imported - asked, waited]), flush=True)
    kc.stop_channels()
    km.shutdown_kernel()
while spares.enabled() and not any("torch" in s["modules"] for s in spares.waiting()):
    time.sleep(0.05)
print("spares", json.dumps(spares.waiting()), flush=True)
"""


def kernel_setting(preload: str | None, kernels: int) -> tuple[list[list[float]], list[Any]]:
    root = Path(tempfile.mkdtemp(prefix="dlsched-warm-kernels-"))
    env = {
        **os.environ,
        "DLSCHED_SIMULATE_GPUS": "1x16GiB",
        "DLSCHED_HOME": str(root / "home"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
    }
    env.pop("DLSCHED_PRELOAD", None)
    if preload is not None:
        env["DLSCHED_PRELOAD"] = preload
    try:
        out = subprocess.run(
            [sys.executable, "-c", KERNELS, str(kernels)],
            env=env, capture_output=True, text=True, timeout=1800, check=True, cwd=root,
        )  # fmt: skip
    finally:
        stop = "from jupyter_dlsched.agent.client import AgentClient, user_address\n"
        stop += f"AgentClient(user_address({str(root / 'home')!r})).call('stop')"
        subprocess.run([sys.executable, "-c", stop], env=env, capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    lines = out.stdout.splitlines()
    waiting = [json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("spares ")]
    return [json.loads(x) for x in lines if x.startswith("[")], (waiting or [[]])[0]


def kernel_rows(kernels: int) -> None:
    print(
        f"\n| GPU kernel | first start → torch imported | p50 of starts 2-{kernels}: "
        "lease granted, kernel launched | ready | torch imported |\n|---|---|---|---|---|"
    )
    notes: list[str] = []
    for label, preload in (("default (a spare)", None), ("DLSCHED_PRELOAD=none", "none")):
        rows, waiting = kernel_setting(preload, kernels)
        later = rows[1:] or rows
        p50 = [statistics.median(r[k] for r in later) * 1000 for k in range(3)]
        print(
            f"| {label} | {rows[0][2] * 1000:.0f} ms | {p50[0]:.0f} ms | {p50[1]:.0f} ms "
            f"| {p50[2]:.0f} ms |"
        )
        each = ", ".join(f"{r[2] * 1000:.0f}" for r in rows)
        spare = "; ".join(
            f"spare kernel {format_size(w['rss'])} with {', '.join(w['modules'])}" for w in waiting
        )
        notes.append(f"# {label}: start -> torch imported, each start (ms): {each}. {spare}")
    print("\n".join(["", *notes]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--kernels", type=int, default=4, help="GPU kernels each way")
    parser.add_argument("--kernels-only", action="store_true", help="only the GPU kernel rows")
    args = parser.parse_args()
    print(f"# {platform.node()} · {os.cpu_count()} cores · Python {sys.version.split()[0]}")
    if args.kernels_only:
        kernel_rows(args.kernels)
        return
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
    kernel_rows(args.kernels)


if __name__ == "__main__":
    main()

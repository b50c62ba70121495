"""Notebook-sized data through the queue, against Ray's object store and a plain memcpy.

Each row is measured in this run: a numpy argument submitted and its job's small result
read back (``submit -> result()``; with other bytes each time, then the same array again:
its file is there already), a PyTorch model as an argument, a big numpy result coming
back (from the job's return to ``result()``), a sweep whose members share one array, the
ledger's size after the runs; beside them a memcpy of the same bytes and Ray (``ray.put``
+ a task reading it, the task's result back) on the same machine.

    python benchmarks/data.py                          # 1 GiB argument, 400 MiB result
    python benchmarks/data.py --sizes-mib 256 --repeat 3 --no-ray
    python benchmarks/data.py --ledger-jobs 20         # the ledger after 20 jobs of 1 GiB
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MIB = 2**20


def total(a: Any) -> float:
    return float(a[:: max(1, a.size // 1024)].sum())  # touches the array, copies nothing


def model_weight(m: Any) -> float:
    return float(sum(float(p[0].sum()) for p in m.parameters()))


def make_result(n: int) -> Any:
    """A big array and the moment the job returns it (``result()`` is timed from there)."""
    return np.ones(n), time.time()


def best(samples: list[float]) -> str:
    return f"{min(samples):.3f} s (median {statistics.median(samples):.3f})"


def returned(call: Any, repeat: int) -> list[float]:
    """Seconds from the job's return to ``result()`` returned (one clock: this machine's)."""
    samples = []
    for _ in range(repeat):
        _, at = call()
        samples.append(time.time() - at)
    return samples


def fresh(x: Any) -> Any:
    """``x`` with other bytes each call (one element changed): nothing was written before."""
    x[0] += 1.0
    return x


def timed(call: Any, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, default=1024, help="the argument's size")
    parser.add_argument("--result-mib", type=int, default=None, help="default: 0.4 x size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true", help="leave Ray's rows out")
    parser.add_argument(
        "--ledger-jobs", type=int, default=0, help="only: the ledger after this many jobs"
    )
    args = parser.parse_args()
    os.environ.setdefault("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    # every job here imports numpy and torch: the launcher imports them once, ahead
    # (``docs/torch.md``), so the rows time the data, not an interpreter's imports
    os.environ.setdefault("DLSCHED_PRELOAD", "numpy,torch")
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.store import buffers

    size = args.sizes_mib * MIB
    result_size = (args.result_mib or max(1, args.sizes_mib * 4 // 10)) * MIB
    x = np.random.default_rng(0).random(size // 8)
    rows: list[tuple[str, str, str]] = []
    if args.ledger_jobs:
        print_table(ledger_rows(x, args.ledger_jobs), args)
        return
    rows.append(("memcpy", f"{args.sizes_mib} MiB", best(timed(lambda: x.copy(), args.repeat))))
    home = Path(tempfile.mkdtemp(prefix="dlsched-data-bench-")) / "home"
    try:
        with Scheduler(home) as s:
            s.submit(int, 1, cpus=0.25).result(timeout=300)  # the agent and a spare are up
            rows.append((
                "numpy argument (new bytes each time), submit -> result()",
                f"{args.sizes_mib} MiB",
                best(timed(
                    lambda: s.submit(total, fresh(x), cpus=0.25).result(timeout=600), args.repeat
                )),
            ))  # fmt: skip
            rows.append((
                "the same array submitted again, submit -> result()",
                f"{args.sizes_mib} MiB",
                best(timed(lambda: s.submit(total, x, cpus=0.25).result(timeout=600), args.repeat)),
            ))  # fmt: skip
            rows.append((
                "numpy result, job's return -> result()",
                f"{result_size // MIB} MiB",
                best(returned(
                    lambda: s.submit(make_result, result_size // 8, cpus=0.25).result(timeout=600),
                    args.repeat,
                )),
            ))  # fmt: skip
            try:
                import torch
            except ImportError:
                torch = None
            if torch is not None:
                model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(12)])
                mib = sum(p.numel() * p.element_size() for p in model.parameters()) // MIB
                rows.append((
                    "PyTorch model argument, submit -> result()",
                    f"{mib} MiB",
                    best(timed(
                        lambda: s.submit(model_weight, model, cpus=0.25).result(timeout=600),
                        args.repeat,
                    )),
                ))  # fmt: skip
                rows.append((
                    "`%%schedule --wait --out s` cell reading a torch tensor of the notebook, "
                    "cell run -> done",
                    f"{args.sizes_mib} MiB",
                    best(schedule_cell(s, size, torch, args.repeat)),
                ))  # fmt: skip
            folder = buffers.buffer_folder(s.home)
            before = {p.name for p in folder.iterdir()} if folder.exists() else set()
            shared = x + 1  # bytes no earlier row wrote
            sweep = s.map(
                lambda item: total(item[0]) * item[1], [(shared, k) for k in range(8)], cpus=0.25
            )
            for h in sweep:
                h.result(timeout=600)
            written = sum(p.stat().st_size for p in folder.iterdir() if p.name not in before)
            rows.append(
                (
                    "8-member sweep sharing one array: bytes written",
                    f"{args.sizes_mib} MiB",
                    f"{written / MIB:.0f} MiB",
                )
            )
            ledger = sum(p.stat().st_size for p in s.home.glob("ledger.sqlite*"))
            jobs = len(s.jobs())
            rows.append((f"ledger after {jobs} jobs", "", f"{ledger / MIB:.1f} MiB"))
        if not args.no_ray:
            rows += ray_rows(x, result_size, args)
    finally:
        stop_agent(home)
        shutil.rmtree(home.parent, ignore_errors=True)
        # the files are kept a day for a requeue: in memory, where nobody would find them
        shutil.rmtree(buffers.buffer_folder(home), ignore_errors=True)
    print_table(rows, args)


def ledger_rows(x: Any, jobs: int) -> list[tuple[str, str, str]]:
    """``jobs`` jobs one after another, each with new bytes of ``x``'s size, in a pool of
    their own: the ledger's size after them (SQLite file and its write-ahead log) and the
    buffer folder held once each job had ended. Their files go when their jobs end
    (``DLSCHED_PAYLOAD_KEEP=0s``): ``jobs`` GiB kept a day for a requeue would fill this
    machine's memory, and what is timed here is what the ledger keeps."""
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.store import buffers

    os.environ["DLSCHED_PAYLOAD_KEEP"] = "0s"
    home = Path(tempfile.mkdtemp(prefix="dlsched-data-ledger-")) / "home"
    most = 0
    try:
        with Scheduler(home) as s:
            folder = buffers.buffer_folder(s.home)
            for _ in range(jobs):
                s.submit(total, fresh(x), cpus=0.25).result(timeout=600)
                held = sum(p.stat().st_size for p in folder.iterdir()) if folder.exists() else 0
                most = max(most, held)
            ledger = sum(p.stat().st_size for p in s.home.glob("ledger.sqlite*"))
            count = len(s.jobs())
    finally:
        stop_agent(home)
        shutil.rmtree(home.parent, ignore_errors=True)
        shutil.rmtree(buffers.buffer_folder(home), ignore_errors=True)
    size = f"{x.nbytes // MIB} MiB each"
    return [
        (f"ledger after {count} jobs, each with a new argument", size, f"{ledger / MIB:.2f} MiB"),
        ("the buffer folder once each job had ended (kept 0 s)", size, f"max {most / MIB:.0f} MiB"),
    ]


def schedule_cell(s: Any, size: int, torch: Any, repeat: int) -> list[float]:
    """Seconds a ``%%schedule`` cell takes, in an IPython shell (a kernel's, without the
    messaging), to run on a ``size``-byte float32 tensor of the notebook and bring back its
    sum: new bytes each time (one element changed), as a notebook's tensor after a step."""
    from IPython.core.interactiveshell import InteractiveShell

    import jupyter_dlsched as dls
    from jupyter_dlsched.widgets.live import refresher

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_dlsched")
    dls.set_default_scheduler(s)
    shell.user_ns["big"] = big = torch.ones(size // 4)
    took = []
    try:
        for n in range(repeat):
            big[0] = n + 2.0
            expected = float(big.sum())  # float32: what the job's sum must give too
            start = time.perf_counter()
            shell.run_cell_magic("schedule", "--cpus 0.25 --wait --out s", "s = float(big.sum())")
            took.append(time.perf_counter() - start)
            if shell.user_ns.get("s") != expected:
                raise RuntimeError(f"the cell's sum came back as {shell.user_ns.get('s')!r}")
    finally:
        refresher.stop_all()
        del shell.user_ns["big"]
    return took


def stop_agent(home: Path) -> None:
    from jupyter_dlsched.agent.client import AgentClient, user_address
    from jupyter_dlsched.agent.protocol import AgentUnavailable

    try:
        AgentClient(user_address(home)).call("stop")
    except AgentUnavailable:
        pass


def ray_rows(x: Any, result_size: int, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    temp = tempfile.mkdtemp(prefix="ray-")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, logging_level="ERROR")
    try:
        remote_total = ray.remote(total)
        remote_result = ray.remote(make_result)
        ray.get(remote_total.remote(np.zeros(8)))
        rows = [
            (
                "Ray: numpy argument, put + task -> get",
                f"{x.nbytes // MIB} MiB",
                best(timed(lambda: ray.get(remote_total.remote(ray.put(fresh(x)))), args.repeat)),
            ),
            (
                "Ray: numpy result, task's return -> get",
                f"{result_size // MIB} MiB",
                best(
                    returned(lambda: ray.get(remote_result.remote(result_size // 8)), args.repeat)
                ),
            ),
        ]
        rows.append((
            "dlsched on Ray (object store): numpy argument, submit -> result()",
            f"{x.nbytes // MIB} MiB",
            on_ray(x, ray.get_runtime_context().gcs_address, args),
        ))  # fmt: skip
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return rows


def on_ray(x: Any, address: str, args: argparse.Namespace) -> str:
    """The argument row again, through a pool whose backend is this Ray cluster: the
    buffers go from their files into Ray's object store, the worker maps them."""
    import signal

    from jupyter_dlsched.backends.ray_driver import driver_alive
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.store import Store, buffers

    home = Path(tempfile.mkdtemp(prefix="dlsched-ray-bench-")) / "home"
    saved = {k: os.environ.get(k) for k in ("DLSCHED_BACKEND", "DLSCHED_RAY_ADDRESS")}
    os.environ.update(DLSCHED_BACKEND="ray", DLSCHED_RAY_ADDRESS=address)
    try:
        with Scheduler(home) as s:
            s.submit(int, 1, cpus=0.25).result(timeout=300)  # the driver joined
            return best(timed(
                lambda: s.submit(total, fresh(x), cpus=0.25).result(timeout=600), args.repeat
            ))  # fmt: skip
    finally:
        pid = Store(home).get_meta("ray_driver_pid")
        if isinstance(pid, int) and driver_alive(home):
            os.kill(pid, signal.SIGTERM)
        stop_agent(home)
        shutil.rmtree(buffers.buffer_folder(home), ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home.parent, ignore_errors=True)


def print_table(rows: list[tuple[str, str, str]], args: argparse.Namespace) -> None:
    print(f"# {platform.node()} · {os.cpu_count()} cores · Python {sys.version.split()[0]}")
    print(
        f"# best of {args.repeat} (median in brackets); DLSCHED_PRELOAD="
        f"{os.environ.get('DLSCHED_PRELOAD')}\n"
    )
    print("| what | size | time |\n|---|---|---|")
    for what, size, figure in rows:
        print(f"| {what} | {size} | {figure} |")


if __name__ == "__main__":
    main()

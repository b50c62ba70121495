"""REST latency of the server extension and the utilisation sampler's CPU cost.

    python benchmarks/rest.py [--jobs 100000] [--clients 8] [--requests 300]

Fills a private ledger with ``--jobs`` finished jobs (copies of one real finished
job) plus a few queued ones, starts ``jupyter server`` on loopback with the
extension and simulated GPUs, and lets ``--clients`` processes, each with its own
keep-alive connection, call ``GET status`` and the first page of ``GET jobs``
back to back. Then it times ``Sampler.sample_once`` (one pool reading written to
the ledger) in this process and reports its CPU per second at a 1 s interval.
Prints a Markdown table (the one quoted in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

SIMULATED = "4x16GiB"


def fill_ledger(home: Path, n_finished: int, n_queued: int) -> None:
    """One real job run to the end, copied ``n_finished`` times; one running, ``n_queued`` waiting."""
    from jupyter_dlsched.client.scheduler import Scheduler

    with Scheduler(home=home) as s:
        first = s.submit_command([sys.executable, "-c", "print('done')"], cpus=1, name="seed")
        first.wait(timeout=120)
        db = s.store.db
        columns = [r[1] for r in db.execute("PRAGMA table_info(jobs)") if r[1] not in ("seq", "id")]
        names = ", ".join(columns)
        with s.store.transaction() as w:
            w.execute(
                f"""WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
                    INSERT INTO jobs(id, {names})
                    SELECT printf('b%07d', i), {names} FROM n, jobs WHERE jobs.id = ?""",
                (n_finished - 1, first.id),
            )
        # one job holds every GPU, so the others wait in line
        s.submit_command(["sleep", "3600"], gpus=4, name="holds-all")
        for i in range(n_queued):
            s.submit_command(["true"], gpus=1, name=f"waits-{i}")


def cleanup(home: Path) -> None:
    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.local import launcher

    if home.exists():
        with Scheduler(home=home, loop=False) as s:
            for job in s.jobs(state=["queued", "running", "preempted"]):
                s.cancel(job.id)
        launcher.stop(home)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    home: Path, tmp: Path, sample_interval: float
) -> tuple[subprocess.Popen[bytes], int, str]:
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "DLSCHED_HOME": str(home),
        "DLSCHED_SIMULATE_GPUS": SIMULATED,
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ServerApp.allow_root=True",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp}",
            "--ServerApp.log_level=WARN",
            f"--DlschedApp.sample_interval={sample_interval}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "server.log").open("wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/dlsched/api/v1/status",
                headers={"Authorization": f"token {token}"},
            )
            urllib.request.urlopen(request, timeout=5).read()
            return process, port, token
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError((tmp / "server.log").read_text()[-2000:]) from None
            time.sleep(0.2)


def client(args: tuple[Any, ...]) -> tuple[list[float], list[float]]:
    """One client on its own keep-alive connection: back to back (rate 0) or ``rate`` per second."""
    port, token, path, n, rate, barrier = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"token {token}"}
    for _ in range(10):  # warm the connection and the server's caches
        conn.request("GET", path, headers=headers)
        conn.getresponse().read()
    barrier.wait()
    times, server = [], []
    begin = time.perf_counter()
    for i in range(n):
        if rate:
            # open loop: requests go out on a schedule, whether or not the last was slow
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        start = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
        timing = response.getheader("Server-Timing", "app;dur=nan")
        server.append(float(timing.split("dur=")[1]) / 1000)
    conn.close()
    return times, server


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def measure_rest(
    server_pid: int,
    port: int,
    token: str,
    path: str,
    clients: int,
    requests: int,
    rate: float = 0,
) -> dict[str, float]:
    import psutil

    server = psutil.Process(server_pid)
    cpu_before = sum(server.cpu_times()[:2])
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(clients)
        with ctx.Pool(clients) as pool:
            start = time.perf_counter()
            results = pool.map(client, [(port, token, path, requests, rate, barrier)] * clients)
            wall = time.perf_counter() - start
    cpu = sum(server.cpu_times()[:2]) - cpu_before
    times = [t for r, _ in results for t in r]
    server_times = [t for _, s in results for t in s]
    return {
        "server_p50_ms": 1000 * statistics.median(server_times),
        "server_p99_ms": 1000 * percentile(server_times, 99),
        "server_cpu_ms_per_request": 1000 * cpu / len(times),
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * percentile(times, 99),
        "max_ms": 1000 * max(times),
        "rps": len(times) / wall,
        "n": len(times),
    }


def measure_sampler(home: Path, seconds: float) -> dict[str, float]:
    """The sampler thread at a 1 s interval, as the server runs it: this process's CPU time.

    The scheduler loop is off here, so the process does nothing else; an idle window of
    the same length is subtracted. A full day of 1 s history is then pruned once, the
    work the sampler does at most once a minute.
    """
    import psutil

    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.server.state import ServerState

    os.environ["DLSCHED_SIMULATE_GPUS"] = SIMULATED
    me = psutil.Process()

    def cpu() -> float:
        times = me.cpu_times()
        return float(times.user + times.system)

    scheduler = Scheduler(home=home, loop=False)
    state = ServerState(scheduler, sample_interval=1.0, history_retention=24 * 3600.0)
    start = cpu()
    time.sleep(seconds)
    idle = cpu() - start
    start = cpu()
    state.sampler.start()
    time.sleep(seconds)
    state.sampler.stop()
    sampling = cpu() - start - idle
    readings = state.sampler.samples_taken
    rows = state.sampler.sample_once()
    now = time.time()
    day = [(now - 86400 + i, "cpu", 1.0, None, None, None) for i in range(86400)]
    scheduler.store.usage.add_samples(day)
    start = time.thread_time()
    scheduler.store.usage.prune_samples(now - 3600)
    prune = time.thread_time() - start
    scheduler.close()
    return {
        "rows": rows,
        "readings": readings,
        "seconds": seconds,
        "cpu_ms_per_reading": 1000 * sampling / max(1, readings),
        "prune_ms": 1000 * prune,
        "core_percent_at_1s": 100 * (sampling / seconds + prune / 60),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="per client and endpoint")
    parser.add_argument(
        "--rate",
        type=float,
        default=10.0,
        help="requests per second per client in the paced runs (an open sidebar polls 2/s)",
    )
    parser.add_argument("--sampler-seconds", type=float, default=30)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="dlsched-rest-"))
    home = tmp / "home"
    (tmp / "config").mkdir()
    os.environ["DLSCHED_SIMULATE_GPUS"] = SIMULATED
    try:
        start = time.perf_counter()
        fill_ledger(home, args.jobs, n_queued=5)
        print(f"ledger: {args.jobs} finished + 5 queued jobs in {time.perf_counter() - start:.1f}s")
        process, port, token = start_server(home, tmp, sample_interval=1.0)
        try:
            endpoints = {
                "status": "/dlsched/api/v1/status",
                "jobs, first page (50, newest)": "/dlsched/api/v1/jobs?limit=50",
                "jobs, the sidebar's queue": "/dlsched/api/v1/jobs?state=running,queued,preempted"
                "&order=queue&limit=200",
            }
            rest: dict[str, dict[str, float]] = {}
            # one paced client: the latency the machine gives when we do not compete with ourselves
            rest[f"status · 1 client, {args.rate:g}/s"] = measure_rest(
                process.pid, port, token, endpoints["status"], 1, args.requests, args.rate
            )
            for name, path in endpoints.items():
                rest[f"{name} · {args.clients} clients, {args.rate:g}/s each"] = measure_rest(
                    process.pid, port, token, path, args.clients, args.requests, args.rate
                )
            for name, path in endpoints.items():
                rest[f"{name} · {args.clients} clients back to back"] = measure_rest(
                    process.pid, port, token, path, args.clients, args.requests
                )
        finally:
            process.terminate()
            process.wait(15)
        sampler = measure_sampler(home, args.sampler_seconds)
    finally:
        cleanup(home)
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"{args.jobs} finished jobs, {args.clients} concurrent clients, keep-alive, loopback, "
        f"load average before: {load_before:.1f}\n"
    )
    print(
        "| GET · load | p50 (ms) | p99 (ms) | max (ms) | requests/s "
        "| in the server p50 / p99 (ms) | server CPU per request (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rest.items():
        print(
            f"| GET {name} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
            f"| {r['rps']:.0f} | {r['server_p50_ms']:.2f} / {r['server_p99_ms']:.2f} "
            f"| {r['server_cpu_ms_per_request']:.2f} |"
        )
    print()
    print("| sampler (4 simulated GPUs, 1 s interval) | value |")
    print("|---|---:|")
    print(f"| rows per reading | {sampler['rows']} |")
    print(
        f"| CPU per reading ({sampler['readings']} readings in {sampler['seconds']:g} s, "
        f"process CPU less idle) | {sampler['cpu_ms_per_reading']:.2f} ms |"
    )
    print(f"| prune of a day of 1 s history (once a minute) | {sampler['prune_ms']:.1f} ms |")
    print(f"| share of one core at 1 s | {sampler['core_percent_at_1s']:.2f} % |")
    print("\n" + json.dumps({"rest": rest, "sampler": sampler}))


if __name__ == "__main__":
    main()

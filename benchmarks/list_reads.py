"""A shared pool while one user reads the whole job list in a loop (attack 1 of #51), or
submits 1 GiB payloads in a loop (``--attack payloads``, the data path of #47), or reads
the state changes in a loop (``--attack changes``), makes as many schedules as it may
(``--attack schedules``, attack 3 of #51) or runs jobs that print without end on a small
disk (``--attack logs``, attack 4).

    sudo python benchmarks/list_reads.py [--rows 11858] [--seconds 20] [--json PATH]
    sudo python benchmarks/list_reads.py --attack payloads --rows 100 [--payload-mib 1024]
    sudo python benchmarks/list_reads.py --attack changes
    sudo python benchmarks/list_reads.py --attack schedules --rows 100
    sudo python benchmarks/list_reads.py --attack logs --rows 100     # a 40 MiB home

Root only: it creates two fresh Unix users, A and B, and starts ``dlsched service run``
with two simulated GPUs in a private temporary folder (both users and everything of theirs
are gone at the end). A fills the ledger with ``--rows`` jobs (one holds both GPUs, the
rest wait behind it; one ``map``), then:

* idle: B pings (``{"op": "ping"}``, every 10 ms) and submits (``submit_command(["true"])``,
  every 4th turn instead of a ping) for ``--seconds`` while A does nothing;
* attack: the same while A reads the whole job list in a loop from 4 connections of its
  own at once (raw protocol, each connection asking for the next page as soon as
  its last one came: A's line of list reads is never empty).

With ``--attack changes`` A reads every state change since the first from 4 connections in
a loop (``{"op": "changes", "since": 0}``, a page of up to 10,000 each). With ``--attack
schedules`` A asks for 20 schedules ``every: "1s"`` (each refused below the pool's minimum
interval), then for schedules at the minimum interval until refused (``max_schedules``).
With ``--attack logs`` the service's home is a 40 MiB tmpfs and A's jobs (two, one per GPU)
each write 100 MB to stdout. With ``--attack payloads`` A instead submits a ``--payload-mib`` numpy array (one element
changed each time: new bytes, a new file) as a job's argument, one after another.

Prints a Markdown table: B's ping and submit p50 / p99 / max in each phase, how many pages
A read (or payloads it submitted), and the service's CPU time per page read (its user +
system time over the attack, over the pages answered).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402
from agent import DLSCHED, system_python_env, unix_users, user_command  # noqa: E402
from core import Row, ms, pct, table  # noqa: E402

#: A's jobs: the first holds both GPUs, the rest wait behind it (one transaction).
FILL = r"""
import json, sys, time
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
print(json.dumps(len(s.map(time.sleep, [600.0] * int(sys.argv[1]), gpus=2, cpus=0.25))))
"""

#: A reads every page of the job list in a loop from ``n`` connections until stdin closes;
#: prints the pages it read and each page's wait.
READER = r"""
import json, select, socket, sys, time
from jupyter_dlsched.agent.protocol import Decoder, encode
path, n, rows, op = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
conns, decoders, offsets, sent = [], {}, {}, {}
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    conns.append(s)
    decoders[s], offsets[s] = Decoder(), (i * rows) // n  # spread over the list
def ask(s):
    sent[s] = time.monotonic()
    if op == "changes":
        s.sendall(encode({"op": "changes", "since": 0}))
    else:
        s.sendall(encode({"op": "jobs", "limit": 2**70, "offset": offsets[s]}))
for s in conns:
    ask(s)
print("reading", flush=True)
waits, total = [], 0
while True:
    ready, _, _ = select.select(conns + [sys.stdin], [], [], 60)
    if sys.stdin in ready:
        break
    for s in ready:
        data = s.recv(1 << 20)
        if not data:
            raise SystemExit("the service closed A's connection")
        decoders[s].feed(data)
        got = decoders[s].pop()
        if got is None:
            continue
        reply, _ = got
        assert reply["ok"], reply
        waits.append(time.monotonic() - sent[s])
        total += len(reply.get("jobs", reply.get("changes", ())))
        offsets[s] = reply.get("next_offset", 0) if reply.get("more") else 0
        ask(s)
print(json.dumps({"pages": len(waits), "rows": total, "waits": waits}), flush=True)
"""

#: A submits a ``MiB``-sized array as a job's argument in a loop until stdin closes; prints
#: how many were accepted, how many refused (and the first refusal), and each submit's time.
PAYLOADS = r"""
import json, select, sys, time
import numpy as np
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import DlschedError
s = dls.Scheduler(loop=False)
x = np.ones(int(sys.argv[1]) * 2**20 // 8)
print("reading", flush=True)
made, refused, first, times = 0, 0, None, []
while not select.select([sys.stdin], [], [], 0)[0]:
    x[0] = made + refused  # new bytes: a new file
    t = time.perf_counter()
    try:
        s.submit(len, x, cpus=0.25)
        made += 1
    except DlschedError as error:
        refused += 1
        first = first or str(error)
    times.append(time.perf_counter() - t)
print(json.dumps({"made": made, "refused": refused, "first": first, "waits": times}),
      flush=True)
"""

#: A asks for 20 schedules every second, then for schedules at the pool's minimum interval
#: until refused; waits for stdin to close, then prints what it was told.
SCHEDULES = r"""
import json, sys, time
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import DlschedError
s = dls.Scheduler(loop=False)
fast, made, refusal = 0, 0, None
for _ in range(20):
    try:
        s.submit(time.time, every="1s", cpus=0.25)
    except DlschedError as error:
        fast += 1
        refusal = refusal or str(error)
while True:
    try:
        s.submit(time.time, every="1m", cpus=0.25)
        made += 1
    except DlschedError as error:
        refusal = str(error)
        break
print("reading", flush=True)
sys.stdin.read()
print(json.dumps({"fast_refused": fast, "made": made, "refusal": refusal}), flush=True)
"""

#: A's two jobs (one per GPU) each write 100 MB to stdout; waits for stdin to close, then
#: prints their states and log sizes.
LOGS = r"""
import getpass, json, sys, time
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
for info in s.jobs(owner=getpass.getuser()):  # the jobs that held or waited for both GPUs
    s.get(info.id).cancel()
script = "import sys\nfor _ in range(100): sys.stdout.write('x' * (1 << 20))\n"
jobs = [s.submit_command([sys.executable, "-c", script], gpus=1, cpus=0.25) for _ in range(2)]
print("reading", flush=True)
sys.stdin.read()
out = [(j.state, len(j.logs())) for j in jobs]
print(json.dumps({"jobs": out}), flush=True)
"""

#: B pings every 10 ms, submitting instead every 4th turn, for ``seconds``.
PROBE = r"""
import json, sys, time
import jupyter_dlsched as dls
from jupyter_dlsched.agent.client import AgentClient
seconds = float(sys.argv[2])
client, s = AgentClient(sys.argv[1]), dls.Scheduler(loop=False)
client.call("ping")
s.submit_command(["true"], gpus=1, cpus=0.25).cancel()  # the submit path warmed up
pings, submits, ids = [], [], []
end, turn = time.monotonic() + seconds, 0
while time.monotonic() < end:
    turn += 1
    t = time.perf_counter()
    if turn % 4:
        client.call("ping")
        pings.append(time.perf_counter() - t)
    else:
        ids.append(s.submit_command(["true"], gpus=1, cpus=0.25).id)
        submits.append(time.perf_counter() - t)
    time.sleep(0.01)
for job_id in ids:
    s.get(job_id).cancel()
print(json.dumps({"pings": pings, "submits": submits}), flush=True)
"""


#: The users' scripts started (each ended before the users are removed).
SCRIPTS: list[Any] = []


def run_as(user: tuple[str, int, int], script: str, *args: str, **popen: Any) -> Any:
    _, uid, gid = user
    proc = subprocess.Popen(
        user_command(uid, gid, "/usr/bin/python3", "-c", script, *args),
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
        **popen,
    )
    SCRIPTS.append(proc)
    return proc


def stop(proc: Any) -> None:
    """End a process this script started (SIGTERM, then SIGKILL after 30 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def last_json(proc: Any, timeout: float, say: str | None = None) -> Any:
    out, _ = proc.communicate(say, timeout=timeout)
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"a user's script exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def drop_buffers(uids: list[int]) -> None:
    """Remove the users' buffer folders in shared memory (``store/buffers.py``)."""
    for uid in uids:
        for folder in Path("/dev/shm").glob(f"dlsched-{uid}-*"):
            shutil.rmtree(folder, ignore_errors=True)


def spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"{ms(pct(values, 0.5))} / {ms(pct(values, 0.99))} / {ms(max(values))}"


def measure(n_rows: int, seconds: float, attack: str = "reads", mib: int = 1024) -> list[Row]:
    from jupyter_dlsched.agent.client import AgentClient

    folder = Path(tempfile.mkdtemp(prefix="dlsched-reads-"))
    os.chmod(folder, 0o755)
    # clients trust a socket only in folders no other user can write: not under /tmp
    run = Path(tempfile.mkdtemp(prefix="dlsched-bench-", dir="/run"))
    os.chmod(run, 0o755)
    sock = str(run / "dlsched.sock")
    (folder / "service.toml").write_text("")
    if attack == "logs":  # the service's state on a small disk of its own
        (folder / "home").mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=40m,mode=700", "tmpfs", str(folder / "home")],
            check=True,
        )
    names = [f"dlreads{os.getpid() % 100000}{x}" for x in "ab"]
    env = system_python_env(DLSCHED_SOCKET=sock)
    rows: list[Row] = []
    try:
        with ExitStack() as stack:
            # on the way out, in this order: the users' scripts, the service, the users
            a, b = stack.enter_context(unix_users(names))
            # A's payloads are kept a day for a requeue, in memory: gone with the users
            stack.callback(drop_buffers, [a[1], b[1]])
            senv = {**os.environ, "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
            senv.pop("DLSCHED_SOCKET", None)
            with open(folder / "service.log", "ab") as log:
                service = subprocess.Popen(
                    [DLSCHED, "service", "run", "--home", str(folder / "home")]
                    + ["--socket", sock, "--config", str(folder / "service.toml")],
                    env=senv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            stack.callback(stop, service)
            stack.callback(lambda: [stop(p) for p in SCRIPTS])
            deadline = time.monotonic() + 60
            while True:
                try:
                    AgentClient(sock).call("ping")
                    break
                except Exception:
                    if service.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the service did not start") from None
                    time.sleep(0.05)
            t = time.perf_counter()
            last_json(run_as(a, FILL, str(n_rows), env=env), 600)
            took = time.perf_counter() - t
            counts = AgentClient(sock).call("count")["counts"]
            rows.append(
                (
                    "A's ledger",
                    f"{sum(counts.values()):,} rows (one `map` "
                    f"in {took:.1f} s; one job holds both GPUs)",
                    "",
                    "",
                )
            )
            proc = psutil.Process(service.pid)

            idle = last_json(run_as(b, PROBE, sock, str(seconds), env=env), seconds + 120)
            if attack in ("reads", "changes"):
                op = "jobs" if attack == "reads" else "changes"
                args: tuple[str, ...] = (READER, sock, "4", str(n_rows), op)
            elif attack == "payloads":
                args = (PAYLOADS, str(mib))
            else:
                args = (SCHEDULES if attack == "schedules" else LOGS,)
            reader = run_as(a, *args, env=env, stdin=subprocess.PIPE)
            assert reader.stdout is not None and reader.stdin is not None
            if reader.stdout.readline().strip() != "reading":
                raise RuntimeError("A's reader did not start")
            cpu = proc.cpu_times()
            attacked = last_json(run_as(b, PROBE, sock, str(seconds), env=env), seconds + 120)
            used = proc.cpu_times()
            read = last_json(reader, 120, say="stop\n")  # A stops reading
            busy = (used.user + used.system) - (cpu.user + cpu.system)
            target = "≤ 200 ms"
            doing = {
                "reads": "A reading from 4 connections",
                "changes": "A reading changes from 4 connections",
                "payloads": f"A submitting {mib} MiB payloads",
                "schedules": "A's schedules",
                "logs": "A's jobs printing 100 MB each",
            }[attack]
            for what, got in (("idle", idle), (doing, attacked)):
                p99 = pct(got["pings"], 0.99)
                verdict = "" if what == "idle" else ("met" if p99 <= 0.2 else "**missed**")
                rows.append(
                    (
                        f"B's ping p50 / p99 / max, {what} (n={len(got['pings'])})",
                        spread(got["pings"]),
                        target if verdict else "",
                        verdict,
                    )
                )
                p99 = pct(got["submits"], 0.99)
                verdict = "" if what == "idle" else ("met" if p99 <= 0.2 else "**missed**")
                rows.append(
                    (
                        f"B's submit p50 / p99 / max, {what} (n={len(got['submits'])})",
                        spread(got["submits"]),
                        target if verdict else "",
                        verdict,
                    )
                )
            if attack == "payloads":
                rows.append(
                    (
                        f"A's {mib} MiB submissions ({seconds:.0f} s)",
                        f"{read['made']} accepted, {read['refused']} refused; each took "
                        f"p50 {ms(pct(read['waits'], 0.5))}"
                        + (f" (first refusal: {read['first']})" if read["first"] else ""),
                        "",
                        "",
                    )
                )
                rows.append(("the service's CPU time over the attack", ms(busy), "", ""))
                return rows
            if attack == "schedules":
                rows.append(
                    (
                        "A's schedules",
                        f"{read['fast_refused']} of 20 `every: 1s` refused; "
                        f"{read['made']} made at 1m, then: {read['refusal']}",
                        "",
                        "",
                    )
                )
                rows.append(("the service's CPU time over the attack", ms(busy), "", ""))
                return rows
            if attack == "logs":
                home = shutil.disk_usage(folder / "home")
                rows.append(
                    (
                        "A's jobs: state, log bytes",
                        ", ".join(f"{state} {size:,}" for state, size in read["jobs"])
                        + f"; the home's disk {home.used / 2**20:.1f} of "
                        f"{home.total / 2**20:.0f} MiB used",
                        "",
                        "",
                    )
                )
                rows.append(("the service's CPU time over the attack", ms(busy), "", ""))
                return rows
            size = read["rows"] / max(read["pages"], 1)
            rows.append(
                (
                    f"A's pages read (4 connections, {seconds:.0f} s)",
                    f"{read['pages']:,} of {size:,.0f} rows; each waited p50 "
                    f"{ms(pct(read['waits'], 0.5))}",
                    "",
                    "",
                )
            )
            rows.append(
                (
                    "the service's CPU time per page (all its work over the attack / pages)",
                    f"{ms(busy / max(read['pages'], 1))} "
                    f"({ms(busy / max(read['rows'], 1) * 1000)} per 1000 rows)",
                    "",
                    "",
                )
            )
            return rows
    finally:
        if attack == "logs":
            subprocess.run(["umount", str(folder / "home")], check=False)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=11_858)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--attack", choices=("reads", "payloads", "changes", "schedules", "logs"), default="reads"
    )
    parser.add_argument("--payload-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        print("needs root and useradd (it creates two Unix users)", file=sys.stderr)
        return 2
    rows = measure(args.rows, args.seconds, args.attack, args.payload_mib)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

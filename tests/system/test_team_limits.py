"""A shared pool no user can slow, blind or fill: list reads, the metrics port, a job's log
and the service's own log of the limits that bite.

Real Unix users (``team_users``) talk to a real ``dlsched service run``; simulated
GPUs stand in for the hardware. No test asserts on speed: each asserts on what its
limit guarantees (a page's size, an order of replies, a scrape answered, a log cut).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from team_pool import Service, script_line, shared_pool, wait_for

from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.agent.link import AgentLink, RemoteLedger
from jupyter_dlsched.agent.reads import MAX_CHANGE_ROWS, MAX_JOB_ROWS


@pytest.fixture
def users(team_users):
    return team_users


@pytest.fixture
def service_factory() -> Iterator:
    with ExitStack() as stack:
        yield lambda config="", **options: stack.enter_context(shared_pool(config, **options))


@pytest.fixture
def service(service_factory) -> Service:
    return service_factory()


def _start(user, service: Service, script: str, *args: str) -> subprocess.Popen[str]:
    """``script`` as ``user`` in the background, talking to ``service``."""
    return subprocess.Popen(
        user.command("/usr/bin/python3", "-c", script, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        env=user.client_env(DLSCHED_SOCKET=str(service.socket)),
    )


#: A's jobs: the first holds both GPUs, the rest wait behind it (one transaction).
FILL = r"""
import json, sys, time
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
handles = s.map(time.sleep, [600.0] * int(sys.argv[1]), gpus=2, cpus=0.25)
print(json.dumps(len(handles)), flush=True)
"""

#: A connects ``n`` times and says so; at a line on stdin sends ``request`` on each
#: connection and says so; leaves a mark the moment its first reply begins to arrive, then
#: prints when each reply came (CLOCK_MONOTONIC, the same clock in every process).
SEND_AT_SIGNAL = r"""
import json, os, select, socket, sys, time
from jupyter_dlsched.agent.protocol import Decoder, encode, recv_message
path, n, request, mark = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
conns = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(path)
    s.sendall(encode({"op": "ping"}))
    assert recv_message(s, Decoder())[0]["ok"]
    conns.append(s)
print(json.dumps("connected"), flush=True)
sys.stdin.readline()
for s in conns:
    s.sendall(encode(request))
print(json.dumps("sent"), flush=True)
came = {}  # when each reply began to arrive, before any is read
while len(came) < n:
    ready, _, _ = select.select([s for s in conns if s not in came], [], [], 60)
    for s in ready:
        came[s] = time.monotonic()
    if not os.path.exists(mark):
        open(mark, "w").close()
out = []
for s in conns:
    reply, _ = recv_message(s, Decoder())
    rows = reply["jobs"] if "jobs" in reply else reply["changes"]
    out.append((came[s], len(rows), reply.get("more")))
print(json.dumps(out), flush=True)
"""

#: B waits for A's mark, then pings once and prints when its answer came.
PING_AT_MARK = r"""
import json, os, select, socket, sys, time
from jupyter_dlsched.agent.protocol import Decoder, encode, recv_message
path, mark = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(60)
s.connect(path)
s.sendall(encode({"op": "ping"}))
assert recv_message(s, Decoder())[0]["ok"]
print(json.dumps("connected"), flush=True)
while not os.path.exists(mark):
    time.sleep(0.0005)
s.sendall(encode({"op": "ping"}))
select.select([s], [], [], 60)
came = time.monotonic()
assert recv_message(s, Decoder())[0]["ok"]
print(json.dumps(came), flush=True)
"""


READ = {"op": "jobs", "limit": 2**70}


def test_a_users_list_reads_are_paged_and_wait_behind_each_other_not_before_everyone(
    service, users
):
    """Finding 1 of #51: each ``jobs`` request answered the whole ledger (any ``limit``),
    from the service's one thread, so a user reading in a loop stalled every other user."""
    a, b = users
    n = 3000
    filled = a.python(FILL, str(n), env={"DLSCHED_SOCKET": str(service.socket)}, timeout=300)
    assert filled.returncode == 0, filled.stderr
    root = AgentClient(str(service.socket))
    # a page is at most MAX_JOB_ROWS, whatever the limit asked; the reply says how to go on
    first = root.call("jobs", limit=2**70)
    page = MAX_JOB_ROWS
    assert len(first["jobs"]) == page and first["more"] and first["next_offset"] == page
    last = root.call("jobs", limit=2**70, offset=3000)
    assert len(last["jobs"]) == 0 and not last["more"]
    assert len(root.call("jobs", offset=2999)["jobs"]) == 1
    finished = root.call("finished", limit=2**70)
    assert not finished["more"]
    # state changes likewise, a page of MAX_CHANGE_ROWS; the client reads them all
    changes = root.call("changes", since=0, limit=2**70)
    assert len(changes["changes"]) == MAX_CHANGE_ROWS and changes["more"]
    ledger = RemoteLedger(AgentLink(root, shared=True))
    every = ledger.state_changes_since(0)
    assert len(every) >= n and [c[0] for c in every] == sorted({c[0] for c in every})

    # A's eight reads wait in the service's sockets at once (the service stopped meanwhile),
    # so its next turn finds them together; B pings the moment A's first reply arrives.
    # A's reads wait in A's line, one answered per turn of the service's loop, so B's ping
    # is answered before A's last read (it was answered after all eight, which the service
    # read in one turn and answered before looking at any other socket)
    replies, pinged = _b_answered_among_as_reads(a, b, service, READ)
    assert all(rows == page and more for _, rows, more in replies), replies
    assert pinged < max(at for at, _, _ in replies), (pinged, replies)
    # the same for the state changes since the start (a page of up to MAX_CHANGE_ROWS each):
    # they were answered from A's eight connections in one turn, ahead of B
    replies, pinged = _b_answered_among_as_reads(a, b, service, {"op": "changes", "since": 0})
    assert all(rows == MAX_CHANGE_ROWS and more for _, rows, more in replies), replies
    assert pinged < max(at for at, _, _ in replies), (pinged, replies)

    # the CLI reads every page: all of A's jobs are listed to B
    listed = b.python(
        "import sys; from jupyter_dlsched.cli.app import main; sys.exit(main(['queue', '--all']))",
        env={"DLSCHED_SOCKET": str(service.socket)},
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert sum(a.name in line for line in listed.stdout.splitlines()) == n, listed.stdout[-2000:]


def _b_answered_among_as_reads(
    a: Any, b: Any, service: Any, request: dict[str, Any]
) -> tuple[list[tuple[float, int, bool | None]], float]:
    """``_eight_reads_and_a_ping`` until B's answer came before A's last reply, three tries
    at most: on a loaded machine A's script may not run between its replies, which then
    all wait in its sockets before B pings. The old service, which answered all eight in
    one turn, fails every try."""
    for _ in range(3):
        replies, pinged = _eight_reads_and_a_ping(a, b, service, request)
        if pinged < max(at for at, _, _ in replies):
            break
    return replies, pinged


def _eight_reads_and_a_ping(
    a: Any, b: Any, service: Any, request: dict[str, Any]
) -> tuple[list[tuple[float, int, bool | None]], float]:
    """A sends ``request`` on eight connections at once while the service is stopped; B
    pings the moment A's first reply arrives. When each of A's replies and B's answer came."""
    folder = tempfile.mkdtemp(prefix="dlsched-mark-")
    os.chmod(folder, 0o777)
    mark = os.path.join(folder, "first")
    sock = str(service.socket)
    reader = _start(a, service, SEND_AT_SIGNAL, sock, "8", json.dumps(request), mark)
    pinger = _start(b, service, PING_AT_MARK, sock, mark)
    try:
        assert script_line(reader) == script_line(pinger) == "connected"
        assert service.proc is not None and reader.stdin is not None
        os.kill(service.proc.pid, signal.SIGSTOP)
        try:
            reader.stdin.write("go\n")
            reader.stdin.flush()
            assert script_line(reader) == "sent"
        finally:
            os.kill(service.proc.pid, signal.SIGCONT)
        replies, pinged = script_line(reader), script_line(pinger)
    finally:
        for proc in (pinger, reader):
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", folder], check=False)
    return [tuple(r) for r in replies], pinged


#: B holds ``n`` idle connections to the metrics port, opening a new one for each closed.
HOLD_IDLE = r"""
import json, select, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def connect():
    s = socket.create_connection((host, port), timeout=10)
    s.setblocking(False)
    return s
held = [connect() for _ in range(n)]
print(json.dumps(len(held)), flush=True)
while True:
    ready, _, _ = select.select(held + [sys.stdin], [], [], 1.0)
    if sys.stdin in ready:
        break
    for s in ready:
        try:
            gone = not s.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            gone = True
        if gone:
            s.close()
            held[held.index(s)] = connect()
"""


def test_idle_connections_to_the_metrics_port_do_not_stop_scrapes(service_factory, users):
    """Finding 2 of #51: sixteen idle connections took every scraper slot for 5 s each, so
    a user holding forty blinded Prometheus (1 scrape of 20 answered)."""
    import re
    import urllib.request

    a, b = users
    service = service_factory(args=("--metrics", "127.0.0.1:0"))
    found = wait_for(
        lambda: re.search(
            r"Prometheus metrics at http://(\S+):(\d+)/metrics", service.log.read_text()
        )
    )
    host, port = found.group(1), found.group(2)
    holder = _start(b, service, HOLD_IDLE, host, port, "100")
    answered = 0
    try:
        assert script_line(holder) == 100
        for _ in range(20):
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
                    answered += reply.status == 200 and b"dlsched_jobs" in reply.read()
            except OSError:
                pass
    finally:
        holder.kill()
        holder.wait()
    # before the fix 1 of 20 was answered; on a machine saturated by other work (four test
    # workers on two cores) one scrape of 20 was lost once in six whole runs, its cause not
    # confirmed (a scraper whose request arrives after 63 newer connections goes out first)
    assert answered >= 19


#: A user's script: ``n`` submissions one at a time of jobs that need both GPUs; prints how
#: many were refused and the first refusal.
SUBMIT_EACH = r"""
import json, sys, time
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import PermissionDenied
s = dls.Scheduler(loop=False)
refused = []
for _ in range(int(sys.argv[1])):
    try:
        s.submit(time.sleep, 600, gpus=2, cpus=0.25)
    except PermissionDenied as error:
        refused.append(str(error))
print(json.dumps({"refused": len(refused), "first": refused[0] if refused else None}))
"""


def test_a_limit_that_bites_is_logged_once_a_minute_per_user_and_counted_each_time(
    service_factory, users
):
    """Finding 4 of #51: the service's log said nothing of refusals at its limits (queued
    jobs, connections, list pages, the metrics port), and no metric counted them."""
    from jupyter_dlsched.machine.metrics import parse

    a, b = users
    service = service_factory("[limits]\nmax_queued = 2\n")
    env = {"DLSCHED_SOCKET": str(service.socket)}
    # one of A's jobs runs, two wait; the next four are refused; then B's three
    done = a.python(SUBMIT_EACH, "7", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["refused"] == 4, done.stdout
    done = b.python(SUBMIT_EACH, "5", env=env)
    assert done.returncode == 0, done.stderr
    refusal = json.loads(done.stdout)
    assert refusal["refused"] == 3 and "the limit per user is 2" in refusal["first"], refusal
    root = AgentClient(str(service.socket))
    root.call("jobs", limit=5000)  # an admin's too-long page is cut, and counted
    lines = [line for line in service.log.read_text().splitlines() if "limit max_queued" in line]
    assert len(lines) == 2, lines  # one for each user within the minute, with the figures
    assert any(a.name in line and "limit per user is 2" in line for line in lines), lines
    assert any(b.name in line for line in lines), lines
    assert "limit list_rows" in service.log.read_text()
    families = parse(root.call("metrics")["text"])
    counted = {s[0]["limit"]: s[1] for s in families["dlsched_limit_refusals"]}
    assert counted["max_queued"] == 7 and counted["list_rows"] == 1, counted


#: A command that writes 100 MB to its stdout as fast as it can.
FLOOD_STDOUT = (
    "import sys; line = b'x' * 1048575 + b'\\n'\n"
    "for _ in range(100):\n"
    "    sys.stdout.buffer.write(line)\n"
)

SUBMIT_FLOODS = r"""
import json, sys
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
ids = [s.submit_command([sys.executable, "-c", sys.argv[2]], cpus=0.25).id
       for _ in range(int(sys.argv[1]))]
print(json.dumps(ids))
"""

SUBMIT_ONE = r"""
import jupyter_dlsched as dls
print(dls.Scheduler(loop=False).submit_command(["true"], cpus=0.25).id)
"""


def test_a_jobs_output_stops_at_its_cap_and_never_fills_the_services_disk(users):
    """Finding 3 of #51: a job's stdout went straight to its log, which grew until the
    service's disk was full, and then every user's submissions were refused."""
    from conftest import small_disk

    a, b = users
    root = Path(tempfile.mkdtemp(prefix="dlsched-team-"))
    os.chmod(root, 0o755)
    with small_disk(root / "home", "40m"):
        service = Service(root, env={"DLSCHED_MAX_LOG_BYTES": "5MiB"})
        try:
            service.start()
            env = {"DLSCHED_SOCKET": str(service.socket)}
            # eight jobs of A's at once, 100 MB each: 5 MiB each is more than the disk spares
            done = a.python(SUBMIT_FLOODS, "8", FLOOD_STDOUT, env=env)
            assert done.returncode == 0, done.stderr
            ids = json.loads(done.stdout)
            ended = ("succeeded", "failed")
            wait_for(lambda: all(service.job(i)["state"] in ended for i in ids), timeout=120)
            logs = [(service.home / "spool" / i / "log").read_bytes() for i in ids]
            for log in logs:
                assert len(log) <= (5 << 20) + 4096, len(log)
                last = log.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode()
                assert last.startswith("[dlsched] the log stops here: "), last
            reasons = [log.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode() for log in logs]
            assert any("more than its cap of 5.0 MiB" in r for r in reasons), reasons
            assert any("is kept for the pool" in r for r in reasons), reasons
            # the disk kept its reserve: B's submission is accepted, and runs
            done = b.python(SUBMIT_ONE, env=env)
            assert done.returncode == 0, done.stderr
            [job_id] = done.stdout.split()
            wait_for(lambda: service.job(job_id)["state"] == "succeeded", timeout=60)
        finally:
            service.stop()
    subprocess.run(["rm", "-rf", str(root), str(service.run)], check=False)

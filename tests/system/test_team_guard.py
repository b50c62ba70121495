"""A shared pool under attack from one of its users: nobody can stall, starve or read another.

Real Unix users (``team_users``, ``other_user``) talk to a real ``dlsched service run``
the way an attacker on a team box would: raw sockets, floods, half-sent
messages, unread replies, planted sockets. Each test names the finding it
reproduces; simulated GPUs stand in for the hardware.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest
from team_pool import DLSCHED, RUN_ROOT, Service, script_line, shared_pool, wait_for


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
    """``script`` as ``user`` in the background, talking to ``service``; stdin holds it open."""
    return subprocess.Popen(
        user.command("/usr/bin/python3", "-c", script, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        env=user.client_env(DLSCHED_SOCKET=str(service.socket)),
    )


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            proc.kill()
            proc.wait()


CONNECT = r"""
import faulthandler, json, socket, sys, time
from jupyter_dlsched.agent.protocol import Decoder, encode, recv_message
faulthandler.dump_traceback_later(100, exit=True)  # a hang says where it is (stderr)

def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(path)
    return s

def ping(s):
    s.sendall(encode({"op": "ping"}))
    reply, _ = recv_message(s, Decoder())
    return reply
"""

FLOOD = (
    CONNECT
    + r"""
path, most, rate, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
held, refusal = [], None
while len(held) < most:
    s = connect(path)
    reply = ping(s)
    if not reply.get("ok"):
        refusal = reply["error"]["message"]
        s.close()
        break
    held.append(s)
print(json.dumps({"held": len(held), "refusal": refusal}), flush=True)
# bursts of connections that never read nor close: refusing one must not wait on it
kept, made = [], 0
for burst in range(int(seconds)):
    for _ in range(int(rate)):
        s = connect(path)
        s.sendall(encode({"op": "ping"}))  # and never reads the answer
        kept.append(s)
        made += 1
        if len(kept) > 200:
            kept.pop(0).close()
        time.sleep(1 / rate)
    print(json.dumps({"burst": burst}), flush=True)
last = connect(path)
reply = ping(last)
print(json.dumps({"made": made, "answered": bool(reply.get("ok")),
                  "refusal": reply.get("error", {}).get("message")}), flush=True)
sys.stdin.read()
"""
)

LATENCY = (
    CONNECT
    + r"""
path, seconds = sys.argv[1], float(sys.argv[2])
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
times = []
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    t = time.perf_counter()
    if n % 10 == 0:
        c = connect(path)  # a new connection now and then: accepting must not stall either
        assert ping(c).get("ok")
        c.close()
    else:
        s.jobs()
    times.append(time.perf_counter() - t)
    n += 1
    time.sleep(0.01)
print(json.dumps(times), flush=True)
"""
)


def test_a_user_flooding_connections_does_not_slow_another_users_requests(service, users):
    """Finding 2: refusing an over-cap connection waited on the socket inside the loop."""
    a, b = users
    flood = _start(b, service, FLOOD, str(service.socket), "400", "55", "6")
    measuring = None
    try:
        held = script_line(flood)
        # B holds every connection a user may have; the next is refused with the reason
        assert held["held"] == 256, held
        assert f"uid {b.uid} has 256 connections to this pool already" in held["refusal"]
        measuring = _start(a, service, LATENCY, str(service.socket), "6")
        admin = AgentClientRoot(service)
        after_burst = []
        for _ in range(6):
            script_line(flood)  # a burst of 55 connections in a second has just been made
            started = time.perf_counter()
            admin.call("ping")
            after_burst.append(time.perf_counter() - started)
        flooded = script_line(flood)
        times = sorted(script_line(measuring))
    finally:
        _end(flood)
        if measuring is not None:
            _end(measuring)
    # the old loop waited on each refused connection: every burst stalled it for a second
    # or more. Tests do not assert on speed: the figures are printed here, and measured
    # against the 200 ms target in benchmarks/list_reads.py; what is asserted is that every
    # request of A's and the admin's was answered through the flood
    assert len(after_burst) == 6
    assert flooded["made"] >= 200 and not flooded["answered"], flooded
    assert f"uid {b.uid} has 256 connections" in flooded["refusal"]
    p99 = times[int(len(times) * 0.99) - 1]
    assert len(times) >= 100
    print(
        f"admin after a burst: median {statistics.median(after_burst) * 1000:.1f} ms; "
        f"A's requests: p99 {p99 * 1000:.0f} ms, median {statistics.median(times) * 1000:.1f} ms"
    )


def _env(service: Service) -> dict[str, str]:
    return {"DLSCHED_SOCKET": str(service.socket)}


HOLD = (
    CONNECT
    + r"""
path, most = sys.argv[1], int(sys.argv[2])
held, refusal = [], None
while len(held) < most:
    s = connect(path)
    try:
        reply = ping(s)
    except OSError as error:
        reply = {"ok": False, "error": {"message": repr(error)}}
    if not reply.get("ok"):
        refusal = reply["error"]["message"]
        s.close()
        break
    held.append(s)
print(json.dumps({"held": len(held), "refusal": refusal}), flush=True)
for line in sys.stdin:  # each line: ping on every held connection, say how many answered
    print(json.dumps({"answered": sum(bool(ping(s).get("ok")) for s in held)}), flush=True)
"""
)


def test_at_the_descriptor_limit_the_service_refuses_new_connections_and_serves_the_rest(
    service_factory, users, other_user
):
    """Finding 3: under a 1024 descriptor limit four users' idle connections left clients
    hanging and the service spinning, logging "out of file descriptors" without end."""
    a, b = users
    service = service_factory(prefix=("prlimit", "--nofile=1024:1024", "--"))
    holders = [_start(user, service, HOLD, str(service.socket), "1000") for user in (a, b)]
    holders.append(_start(other_user, service, HOLD, str(service.socket), "1000"))
    try:
        held = [script_line(h) for h in holders]
        # 1024 descriptors less a reserve of 64, a quarter of that per user
        assert [h["held"] for h in held] == [240, 240, 240], held
        assert all("has 240 connections to this pool already" in h["refusal"] for h in held)
        # root (an admin, in this process) takes the rest, then the service is full
        mine = _start_root_holder(service)
        held_root = script_line(mine)
        holders.append(mine)
        assert held_root["held"] == 240, held_root
        assert "at its limit of 960 connections" in held_root["refusal"]
        cpu_before = _cpu(service)
        time.sleep(3)
        # full, the service idles: no loop spinning on a listener it cannot accept from
        assert _cpu(service) - cpu_before < 0.5
        # and every connection it has is still served
        for holder in holders:
            assert holder.stdin is not None
            holder.stdin.write("ping\n")
            holder.stdin.flush()
        assert [script_line(h)["answered"] for h in holders] == [240, 240, 240, 240]
    finally:
        for holder in holders:
            _end(holder)
    log = service.log.read_text()
    assert log.count("at its limit of 960 connections") <= 2, log[-2000:]
    assert len(log.splitlines()) < 50
    # once connections close, new ones are served again
    wait_for(
        lambda: service.as_user(a, "import jupyter_dlsched as dls; dls.jobs()").returncode == 0
    )


def _start_root_holder(service: Service) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, str(service.socket), "1000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cpu(service: Service) -> float:
    assert service.proc is not None
    times = psutil.Process(service.proc.pid).cpu_times()
    return float(times.user + times.system)


def _rss(service: Service) -> int:
    assert service.proc is not None
    return int(psutil.Process(service.proc.pid).memory_info().rss)


PARTIAL = r"""
import json, socket, struct, sys, time
path, n, declared, send = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    head = json.dumps({"op": "submit", "jobs": [{"files": {"payload.pkl": 0}}],
                       "blobs": [declared]}).encode()
    s.sendall(struct.pack(">I", len(head)) + head)
    s.setblocking(False)
    socks.append([s, 0])
chunk = b"x" * (1 << 20)
last = time.monotonic()
while time.monotonic() - last < 3 and any(sent < send for _, sent in socks):
    for entry in socks:
        if entry[1] >= send:
            continue
        try:
            entry[1] += entry[0].send(chunk[: send - entry[1]])
            last = time.monotonic()
        except BlockingIOError:
            pass
    time.sleep(0.001)
print(json.dumps([sent for _, sent in socks]), flush=True)
sys.stdin.read()
"""

UNREAD = r"""
import json, socket, struct, sys, time
from jupyter_dlsched.agent.protocol import encode
path, n, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = b"".join(encode({"op": "jobs"}) for _ in range(requests))
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(3)
    try:
        s.sendall(data)
    except TimeoutError:
        pass
    socks.append(s)
print(json.dumps(len(socks)), flush=True)
sys.stdin.read()
"""


def test_half_sent_attachments_and_unread_replies_are_bounded_per_user(service, users):
    """Finding 4: eight half-sent 256 MiB attachments took the service from 73 MiB to
    2.1 GiB; replies a client never reads piled up without limit."""
    a, b = users
    service.submit(a, 0, "a-row", n=300)  # rows that make every `jobs` reply ~0.5 MB
    wait_for(lambda: len(AgentClientRoot(service).call("jobs")["jobs"]) == 300)
    before = _rss(service)
    partial = _start(b, service, PARTIAL, str(service.socket), "8", str(256 << 20), str(200 << 20))
    unread = _start(b, service, UNREAD, str(service.socket), "8", "2000")
    try:
        sent = script_line(partial, timeout=180)
        script_line(unread, timeout=180)
        time.sleep(1)
        grown = _rss(service) - before
        # one message at a time goes on: B's first attachment, and a little of the rest
        assert sorted(sent)[-1] == 200 << 20 and sorted(sent)[-2] < 100 << 20, sent
        assert grown < 500 << 20, f"the service grew by {grown >> 20} MiB"
        # and A is served as ever
        done = a.python("import jupyter_dlsched as dls; print(len(dls.jobs()))", env=_env(service))
        assert done.returncode == 0 and done.stdout.split() == ["300"], done.stderr
    finally:
        _end(partial)
        _end(unread)


class AgentClientRoot:
    """The service as its admin (root, this process) calls it."""

    def __init__(self, service: Service) -> None:
        from jupyter_dlsched.agent.client import AgentClient

        self.client = AgentClient(str(service.socket))

    def call(self, op: str, **fields):
        return self.client.call(op, **fields)


SECRET = "s3cr3t-7c1f"

VICTIM = f"""
import json, os
os.environ["JPY_SESSION_NAME"] = "{SECRET}.ipynb"
import jupyter_dlsched as dls

def fail():
    import jupyter_dlsched as dls
    dls.progress(1, 2, {SECRET.replace("-", "_")}=1.0)
    raise ValueError("{SECRET} in the message")

def slow():
    import time
    import jupyter_dlsched as dls
    dls.progress(1, 2, {SECRET.replace("-", "_")}=1.0)
    time.sleep(120)

s = dls.Scheduler(loop=False)
failed = s.submit(fail, name="victim-failed", env={{"TOKEN": "{SECRET}"}})
retried = s.submit(fail, name="victim-retried", retries=1, env={{"TOKEN": "{SECRET}"}})
running = s.submit(slow, name="victim-running", env={{"TOKEN": "{SECRET}"}})
# a schedule whose job names the secret: another user lists no schedule of A's
s.submit(slow, name="victim-every", every="1h", begin="1h", env={{"TOKEN": "{SECRET}"}})
failed.wait(timeout=60)
retried.wait(timeout=60)
print(json.dumps([failed.id, retried.id, running.id]))
"""

#: How another user calls each request of the protocol: every request must be here.
WALK = r"""
import json, sys
from jupyter_dlsched.agent.client import AgentClient
path = sys.argv[1]
cases = json.loads(sys.argv[2])
out = {}
for op, fields in cases.items():
    try:
        out[op] = {"reply": AgentClient(path).call(op, **fields)}
    except Exception as error:
        out[op] = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(out))
"""


def _cases(failed: str, retried: str, running: str) -> dict[str, dict]:
    return {
        "hello": {},
        "ping": {},
        "submit": {"kind": "command", "options": {"name": "x"}, "jobs": []},
        "cancel": {"id": running},
        "priority": {"id": running, "priority": 10},
        "get": {"id": failed},
        "jobs": {},
        "finished": {},
        "count": {},
        "seq": {},
        "status": {},
        "changes": {"since": 0},
        "events": {},
        "meta": {"key": "inventory"},
        "progress": {"id": running, "progress": {"done": 1, "total": 1}},
        "ended": {"id": failed},
        "tick": {},
        "settings": {"policy": "fifo"},
        "cache": {},
        "metrics": {},
        "samples": {"since": 0},
        "requeue": {"id": failed},
        "ray": {"address": "127.0.0.1:1"},
        "schedules": {},
        "stop": {},
        "room": {},
    }


def test_every_request_shows_another_users_job_only_as_the_queue_does(service, users):
    """Finding 5: the raw ``events`` request returned another user's failure text."""
    from jupyter_dlsched.agent.service import Agent

    a, b = users
    victim = service.as_user(a, VICTIM)
    assert victim.returncode == 0, victim.stderr
    failed, retried, running = json.loads(victim.stdout)
    wait_for(lambda: (service.job(running).get("progress") or {}).get("metrics"))
    # the secret is in the ledger, for its owner and the admins
    assert SECRET in json.dumps(AgentClientRoot(service).call("events"))
    cases = _cases(failed, retried, running)
    with tempfile.TemporaryDirectory() as folder:
        requests = set(Agent(folder, socket_path=Path(folder) / "s.sock")._ops)
    assert set(cases) == requests, "a request without a case here could leak: add one"
    walked = b.python(WALK, str(service.socket), json.dumps(cases), env=_env(service))
    assert walked.returncode == 0, walked.stderr
    out = json.loads(walked.stdout)
    assert SECRET not in walked.stdout, [op for op in out if SECRET in json.dumps(out[op])]
    # what is public is still there
    jobs = {j["id"]: j for j in out["jobs"]["reply"]["jobs"]}
    assert jobs[failed]["state"] == "failed" and jobs[failed]["reason"] == "failed"
    # B lists only B's schedules (none); the admin sees A's
    assert out["schedules"]["reply"]["schedules"] == []
    assert len(AgentClientRoot(service).call("schedules")["schedules"]) == 1
    assert jobs[running]["name"] == "victim-running" and jobs[running]["owner"] == a.name
    retries = [e for e in out["events"]["reply"]["events"] if e["job_id"] == retried]
    assert "retry 1/1" in [e["reason"] for e in retries]
    assert out["room"]["reply"]["held"] == 0  # B's own payloads (none), never A's
    assert out["cancel"]["error"].startswith("PermissionDenied")
    assert service.job(running)["state"] == "running"


FAKE = r"""
import os, socket, sys
path, record = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
s.listen(8)
print("listening", flush=True)
s.settimeout(15)
try:
    while True:
        c, _ = s.accept()
        c.settimeout(2)
        try:
            data = c.recv(1 << 20)
        except OSError:
            data = b""
        with open(record, "ab") as f:
            f.write(data or b"<connected>")
        c.close()
except OSError:
    pass
"""

SUBMIT_ONE = """
import jupyter_dlsched as dls
try:
    dls.Scheduler(loop=False).submit(print, "payload", env={"TOKEN": "secret"})
    print("submitted")
except Exception as error:
    print(f"{type(error).__name__}: {error}")
"""


def test_a_client_refuses_a_socket_another_user_could_have_planted(users):
    """Finding 6: with the socket's folder writable by another user (sticky 1777, or a
    folder above it that the attacker owns), a user's payload went to the attacker."""
    a, b = users
    base = Path(tempfile.mkdtemp(prefix="dlsched-plant-", dir=RUN_ROOT))
    os.chmod(base, 0o755)
    record = base / "record"
    record.touch()
    os.chown(record, b.uid, b.gid)
    try:
        sticky = base / "sticky"
        sticky.mkdir(mode=0o1777)
        os.chmod(sticky, 0o1777)
        owned = base / "owned"
        owned.mkdir(mode=0o755)
        os.chown(owned, b.uid, b.gid)
        (owned / "run").mkdir(mode=0o755)  # root's folder, in a folder the attacker owns
        for socket_path in (sticky / "dlsched.sock", owned / "run" / "dlsched.sock"):
            if socket_path.parent.name == "run":
                # the attacker moves root's folder aside and puts their own in its place
                subprocess.run(b.command("mv", str(owned / "run"), str(owned / "old")), check=True)
                subprocess.run(b.command("mkdir", str(owned / "run")), check=True)
            fake = subprocess.Popen(
                b.command("/usr/bin/python3", "-c", FAKE, str(socket_path), str(record)),
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert fake.stdout is not None and fake.stdout.readline().strip() == "listening"
                done = a.python(SUBMIT_ONE, env={"DLSCHED_SOCKET": str(socket_path)})
                assert done.returncode == 0, done.stderr
                assert done.stdout.startswith("AgentUnavailable: refusing the shared pool"), (
                    done.stdout
                )
                assert "so another user could put a socket of their own in its place" in (
                    done.stdout
                )
            finally:
                fake.kill()
                fake.wait()
            assert record.read_bytes() == b"", "the client talked to the planted socket"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_service_refuses_a_socket_folder_others_can_write(tmp_path):
    """Finding 6, the service's side: it will not serve from where an impostor could sit."""
    folder = Path(tempfile.mkdtemp(prefix="dlsched-open-", dir=RUN_ROOT))
    os.chmod(folder, 0o1777)
    done = subprocess.run(
        [
            DLSCHED,
            "service",
            "run",
            "--home",
            str(tmp_path / "home"),
            "--socket",
            str(folder / "dlsched.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DLSCHED_SIMULATE_GPUS": "1x16GiB"},
    )
    try:
        assert done.returncode == 2, done.stderr
        assert f"{folder} is writable by others (uid 0, mode 1777)" in done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr
        assert not (folder / "dlsched.sock").exists()
    finally:
        folder.rmdir()


RAW_SUBMIT = r"""
import json, sys
from jupyter_dlsched.agent.client import AgentClient
argv = json.dumps({"argv": ["sh", "-c", "env | sort"]}).encode()
reply = AgentClient(sys.argv[1]).call(
    "submit", [argv], kind="command", options={"name": "bare"},
    jobs=[{"files": {"command.json": 0}}],
)
print(reply["ids"][0])
"""


def test_a_submission_without_its_context_runs_with_its_owners_environment_only(
    service_factory, users
):
    """Finding 7: a raw submission without ``context.json`` ran with the service's (root's)
    own environment."""
    import pwd

    _, b = users
    service = service_factory(env={"DLSCHED_SERVICE_CANARY": "only-the-service-has-this"})
    done = b.python(RAW_SUBMIT, str(service.socket), env=_env(service))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: service.job(job_id)["state"] in ("succeeded", "failed"))
    assert service.job(job_id)["state"] == "succeeded", service.job(job_id)
    env = dict(
        line.split("=", 1)
        for line in (service.home / "spool" / job_id / "log").read_text().splitlines()
        if "=" in line
    )
    assert "DLSCHED_SERVICE_CANARY" not in env
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert (env["USER"], env["HOME"]) == (b.name, pwd.getpwuid(b.uid).pw_dir)
    assert env["DLSCHED_JOB_ID"] == job_id


def test_a_client_gives_up_on_a_stopped_service_in_one_line(service, users):
    """Finding 9: a stopped service hung ``dlsched status`` for good."""
    _, b = users
    assert service.proc is not None
    os.kill(service.proc.pid, signal.SIGSTOP)
    try:
        status = b.python(
            "import sys; from jupyter_dlsched.cli import main; sys.exit(main())",
            "status",
            env={**_env(service), "DLSCHED_TIMEOUT": "2"},
            timeout=60,
        )
    finally:
        os.kill(service.proc.pid, signal.SIGCONT)
    assert status.returncode != 0
    assert status.stderr.strip() == (
        f"dlsched status: the shared pool at {service.socket} did not answer within 2 s (is it stopped "
        "or overloaded? DLSCHED_TIMEOUT sets how long to wait)"
    ), status.stderr
    # and once it runs again, so does the client
    again = b.python("import jupyter_dlsched as dls; print(len(dls.jobs()))", env=_env(service))
    assert again.returncode == 0 and again.stdout.split() == ["0"], again.stderr


def test_the_client_timeout_is_thirty_seconds_unless_set(monkeypatch):
    from jupyter_dlsched.agent.client import AgentClient, client_timeout
    from jupyter_dlsched.vocab.errors import SpecError

    monkeypatch.delenv("DLSCHED_TIMEOUT", raising=False)
    assert client_timeout() == 30.0 and AgentClient("/nowhere").timeout == 30.0
    monkeypatch.setenv("DLSCHED_TIMEOUT", "4.5")
    assert AgentClient("/nowhere").timeout == 4.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("DLSCHED_TIMEOUT", bad)
        with pytest.raises(SpecError, match="DLSCHED_TIMEOUT"):
            client_timeout()


def test_the_service_unit_raises_the_descriptor_limit():
    unit = subprocess.run([DLSCHED, "service", "unit"], capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0, unit.stderr
    assert "LimitNOFILE=65536" in unit.stdout

"""Team mode: one pool for every user of the machine, run by ``dlsched service run``.

Two real Unix users (created for the session; CI runs as root) use the
service the way people on a shared GPU box would: from their own Python, with
``DLSCHED_SOCKET`` pointing at it. Simulated GPUs stand in for the hardware.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import OtherUser, unix_user

from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.agent.protocol import AgentUnavailable

DLSCHED = os.path.join(os.path.dirname(sys.executable), "dlsched")

SUBMIT = """
import sys
import jupyter_dlsched as dls

def work(seconds, tag):
    import os, time
    time.sleep(seconds)
    return [tag, os.getuid()]

s = dls.Scheduler(loop=False)
seconds, tag, gpus = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1):
    h = s.submit(work, seconds, tag, gpus=gpus, name=tag)
    print(h.id, flush=True)
"""

RESULT = """
import json, sys
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
print(json.dumps(s.get(sys.argv[1]).result(timeout=float(sys.argv[2]))))
"""


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[OtherUser, OtherUser]]:
    with unix_user(f"dlsa{os.getpid()}") as a, unix_user(f"dlsc{os.getpid()}") as b:
        probe = a.python("import jupyter_dlsched, cloudpickle, psutil")
        if probe.returncode != 0:
            pytest.skip(
                "another user cannot import this checkout of the package (its folder or "
                f"virtual environment is private): {probe.stderr.strip()[-200:]}"
            )
        yield a, b


class Service:
    """``dlsched service run`` in a folder every user can reach, two simulated GPUs."""

    def __init__(self, root: Path, config: str = "") -> None:
        self.root = root
        self.home = root / "home"
        self.socket = root / "run" / "dlsched.sock"
        self.config = root / "service.toml"
        self.config.write_text(config)
        self.log = root / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
        env.pop("DLSCHED_SOCKET", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    DLSCHED,
                    "service",
                    "run",
                    "--home",
                    str(self.home),
                    "--socket",
                    str(self.socket),
                    "--config",
                    str(self.config),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._answers, timeout=60, what=lambda: self.log.read_text())

    def _answers(self) -> bool:
        try:
            AgentClient(str(self.socket)).call("ping")
        except AgentUnavailable:
            return False
        return True

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def job(self, job_id: str) -> dict:
        """The job's row as an admin (root) sees it."""
        return AgentClient(str(self.socket)).call("get", id=job_id)["job"]

    def events(self, job_id: str) -> list[dict]:
        return AgentClient(str(self.socket)).call("events", id=job_id)["events"]

    def as_user(self, user: OtherUser, script: str, *args: str, timeout: float = 120):
        return user.python(script, *args, env={"DLSCHED_SOCKET": str(self.socket)}, timeout=timeout)

    def submit(self, user: OtherUser, seconds: float, tag: str, gpus: float = 0, n: int = 1):
        done = self.as_user(user, SUBMIT, str(seconds), tag, str(gpus), str(n))
        assert done.returncode == 0, done.stderr
        return done.stdout.split()


@pytest.fixture
def service_factory() -> Iterator:
    started: list[Service] = []

    def make(config: str = "") -> Service:
        root = Path(tempfile.mkdtemp(prefix="dlsched-team-"))
        os.chmod(root, 0o755)
        service = Service(root, config)
        service.start()
        started.append(service)
        return service

    yield make
    for service in started:
        if service.proc is not None and service.proc.poll() is None:
            client = AgentClient(str(service.socket))
            for job in client.call("jobs", states=["queued", "running", "preempted"])["jobs"]:
                client.call("cancel", id=job["id"])
        service.stop()
        subprocess.run(["rm", "-rf", str(service.root)], check=False)


@pytest.fixture
def service(service_factory) -> Service:
    return service_factory()


def wait_for(predicate, timeout=60.0, step=0.05, what=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met in time {what()}")


def test_two_users_share_the_gpus_and_each_job_runs_as_its_owner(service, users):
    a, b = users
    [a_job] = service.submit(a, 3, "a-both-gpus", gpus=2)
    wait_for(lambda: service.job(a_job)["state"] == "running")
    [b_job] = service.submit(b, 0, "b-one-gpu", gpus=1)
    # A holds both GPUs: B's job waits for one, in one queue with A's
    wait_for(lambda: service.job(b_job)["waiting"] == "waiting for 1 GPU")
    assert service.job(a_job)["state"] == "running"
    b_result = service.as_user(b, RESULT, b_job, "60")
    assert b_result.returncode == 0, b_result.stderr
    assert json.loads(b_result.stdout) == ["b-one-gpu", b.uid]
    a_result = service.as_user(a, RESULT, a_job, "60")
    assert json.loads(a_result.stdout) == ["a-both-gpus", a.uid]
    a_row, b_row = service.job(a_job), service.job(b_job)
    assert (a_row["owner"], a_row["uid"]) == (a.name, a.uid)
    assert (b_row["owner"], b_row["uid"]) == (b.name, b.uid)
    assert b_row["started"] >= a_row["finished"]
    # each user's spool folder is their own, and no one else's
    for row, user in ((a_row, a), (b_row, b)):
        folder = service.home / "spool" / row["id"]
        assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (user.uid, 0o700)
        assert (folder / "result.pkl").stat().st_uid == user.uid


ATTACKS = """
import json, os, sys
import jupyter_dlsched as dls
from jupyter_dlsched.errors import PermissionDenied
s = dls.Scheduler(loop=False)
running, done, home = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}

def attempt(name, call):
    try:
        call()
        out[name] = "allowed"
    except PermissionDenied as error:
        out[name] = "denied: " + str(error)
    except PermissionError as error:
        out[name] = "os-denied: " + str(error)

attempt("cancel", lambda: s.cancel(running))
attempt("priority", lambda: s.set_priority(running, "high"))
attempt("result", lambda: s.get(done).result(timeout=10))
attempt("logs", lambda: open(os.path.join(home, "spool", done, "log")).read())
attempt("list spool", lambda: os.listdir(os.path.join(home, "spool")))
attempt("write home", lambda: open(os.path.join(home, "planted"), "w"))
attempt("write spool", lambda: open(os.path.join(home, "spool", "planted"), "w"))
attempt("plant result", lambda: open(os.path.join(home, "spool", done, "result.pkl"), "wb"))
attempt("read ledger", lambda: open(os.path.join(home, "ledger.sqlite"), "rb").read())
mine = s.submit_command(["true"], name="mine")
out["mine"] = mine.id
out["queue"] = sorted(j.owner for j in s.jobs())
out["env of theirs"] = s.get(running).info().env
print(json.dumps(out))
"""

IMPERSONATE = """
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
argv = json.dumps({"argv": ["true"]}).encode()
head = json.dumps({"op": "submit", "kind": "command", "owner": sys.argv[2], "uid": int(sys.argv[3]),
                   "options": {"name": "forged"}, "jobs": [{"files": {"command.json": 0}}],
                   "blobs": [len(argv)]}).encode()
s.sendall(struct.pack(">I", len(head)) + head + argv)
n = struct.unpack(">I", s.recv(4))[0]
print(s.recv(n).decode())
"""


def test_another_user_can_see_but_not_touch_a_job(service, users):
    a, b = users
    [done] = service.submit(a, 0, "a-secret", gpus=0)
    assert json.loads(service.as_user(a, RESULT, done, "60").stdout) == ["a-secret", a.uid]
    [running] = service.submit(a, 60, "a-long", gpus=1)
    wait_for(lambda: service.job(running)["job_pid"])
    attack = service.as_user(b, ATTACKS, running, done, str(service.home))
    assert attack.returncode == 0, attack.stderr
    out = json.loads(attack.stdout)
    assert out["cancel"].startswith(f"denied: job {running} belongs to {a.name}")
    assert out["priority"].startswith("denied:")
    assert out["result"].startswith("denied:")
    for name in ("logs", "list spool", "write home", "write spool", "plant result", "read ledger"):
        assert out[name].startswith("os-denied"), (name, out[name])
    assert out["queue"].count(a.name) == 2 and b.name in out["queue"]  # everyone sees the queue
    assert out["env of theirs"] == {}  # but not what is private to a job
    # B's own job is B's, whatever B's request claims
    forged = service.as_user(b, IMPERSONATE, str(service.socket), a.name, str(a.uid))
    forged_id = json.loads(forged.stdout)["ids"][0]
    assert (service.job(forged_id)["owner"], service.job(forged_id)["uid"]) == (b.name, b.uid)
    # the CLI says no in one line, with the usage-error status
    cli = b.python(
        "import sys; from jupyter_dlsched.cli import main; sys.exit(main())",
        "cancel",
        running,
        env={"DLSCHED_SOCKET": str(service.socket)},
    )
    assert cli.returncode == 2 and f"belongs to {a.name}" in cli.stderr, cli.stderr
    assert cli.stderr.count("\n") == 1
    # A's job and data are untouched
    assert service.job(running)["state"] == "running"
    assert not service.job(running)["cancel_requested"]
    assert service.job(running)["priority"] == 50
    assert json.loads(service.as_user(a, RESULT, done, "60").stdout) == ["a-secret", a.uid]
    assert not (service.home / "planted").exists()


def test_fair_share_starts_the_second_users_first_job_next(service, users):
    a, b = users
    a_jobs = service.submit(a, 1.5, "a-sweep", gpus=1, n=20)
    wait_for(lambda: service.job(a_jobs[1])["state"] == "running")
    b_jobs = service.submit(b, 0.5, "b-pair", gpus=1, n=2)
    wait_for(lambda: service.job(b_jobs[0])["state"] != "queued")
    started = {j: service.job(j)["started"] for j in a_jobs[2:]}
    b_start = service.job(b_jobs[0])["started"]
    # B's first job took the first GPU that came free (in the same decision as another of
    # A's when two came free at once), before the rest of A's queue
    assert all(s is None or s >= b_start for s in started.values()), (b_start, started)
    assert sum(s is not None and s <= b_start for s in started.values()) <= 1


def test_a_user_over_the_gpu_limit_waits_with_the_reason_shown(service_factory, users):
    a, b = users
    service = service_factory("[limits]\nmax_gpus = 1\n")
    first, second = service.submit(a, 30, "a-limited", gpus=1, n=2)
    wait_for(lambda: service.job(first)["state"] == "running")
    reason = wait_for(lambda: service.job(second)["waiting"])
    assert reason == f"{a.name} holds 1 GPU, the limit per user is 1"
    # the free GPU goes to B, who is under the limit
    [b_job] = service.submit(b, 0, "b-free-gpu", gpus=1)
    assert json.loads(service.as_user(b, RESULT, b_job, "60").stdout)[1] == b.uid
    assert service.job(second)["state"] == "queued"
    urgent = service.as_user(
        a,
        "import jupyter_dlsched as dls; dls.Scheduler(loop=False).submit(abs, 1, "
        "priority='urgent')",
    )
    assert "above the highest a user may ask for" in urgent.stderr


def test_killing_the_service_loses_no_job_of_either_user(service, users):
    a, b = users
    [a_job] = service.submit(a, 3, "a-survives", gpus=1)
    [b_job] = service.submit(b, 3, "b-survives", gpus=1)
    [a_next] = service.submit(a, 0, "a-next", gpus=1)
    wait_for(lambda: all(service.job(j)["job_pid"] for j in (a_job, b_job)))
    supervisors = [service.job(j)["supervisor_pid"] for j in (a_job, b_job)]
    service.kill9()
    assert all(psutil.pid_exists(pid) for pid in supervisors)
    service.start()
    assert json.loads(service.as_user(a, RESULT, a_job, "60").stdout) == ["a-survives", a.uid]
    assert json.loads(service.as_user(b, RESULT, b_job, "60").stdout) == ["b-survives", b.uid]
    assert json.loads(service.as_user(a, RESULT, a_next, "60").stdout) == ["a-next", a.uid]
    assert [service.job(j)["owner"] for j in (a_job, b_job, a_next)] == [a.name, b.name, a.name]
    assert all(service.job(j)["attempts"] == 1 for j in (a_job, b_job, a_next))

"""Team mode: one pool for every user of the machine, run by ``dlsched service run``.

Two real Unix users (created for the session; CI runs as root) use the
service the way people on a shared GPU box would: from their own Python, with
``DLSCHED_SOCKET`` pointing at it. Simulated GPUs stand in for the hardware.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import psutil
import pytest
from team_pool import RESULT, Service, shared_pool, wait_for


@pytest.fixture
def users(team_users):
    return team_users


@pytest.fixture
def service_factory() -> Iterator:
    with ExitStack() as stack:
        yield lambda config="": stack.enter_context(shared_pool(config))


@pytest.fixture
def service(service_factory) -> Service:
    return service_factory()


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


IDENTITY = """
import json, os
import jupyter_dlsched as dls

def who():
    import os, sys
    mask = os.umask(0)
    files = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            files.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return [os.getuid(), os.geteuid(), os.getgid(), sorted(os.getgroups()), oct(mask),
            os.environ["HOME"], os.environ["USER"], files,
            "jupyter_dlsched.agent.service" in sys.modules]

print(json.dumps(dls.Scheduler(loop=False).submit(who).result(timeout=60)))
"""


def test_a_job_runs_with_its_owners_identity_and_the_cli_names_the_pool(service, users):
    import grp
    import pwd

    _, b = users
    done = service.as_user(b, IDENTITY)
    assert done.returncode == 0, done.stderr
    uid, euid, gid, groups, umask, home, user, files, service_code = json.loads(done.stdout)
    # a fresh program of the owner's: nothing of the service's memory or open files
    assert not service_code
    assert not [f for f in files if str(service.home) in f and not f.endswith("/log")], files
    entry = pwd.getpwuid(b.uid)
    expected = sorted({entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if b.name in g.gr_mem})
    assert (uid, euid, gid, groups) == (b.uid, b.uid, b.gid, expected)
    assert (umask, home, user) == ("0o77", entry.pw_dir, b.name)
    status = b.python(
        "import sys; from jupyter_dlsched.cli import main; sys.exit(main())",
        "status",
        env={"DLSCHED_SOCKET": str(service.socket)},
    )
    assert status.returncode == 0, status.stderr
    assert f"pool: shared by every user of this machine, service at {service.socket}" in (
        status.stdout
    )
    assert f"(you: {b.name})" in status.stdout


ATTACKS = """
import json, os, sys
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import PermissionDenied
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
request = {"op": "submit", "kind": "command", "options": {"name": "forged"},
           "jobs": [{"files": {"command.json": 0}}], "blobs": [len(argv)]}
if sys.argv[2]:  # claim to be someone else
    request.update(owner=sys.argv[2], uid=int(sys.argv[3]))
head = json.dumps(request).encode()
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
    # a request that claims to be A's is refused at the door: a submit has no owner field
    # (whose a job is comes from the connection, never from the request)
    forged = service.as_user(b, IMPERSONATE, str(service.socket), a.name, str(a.uid))
    reply = json.loads(forged.stdout)
    assert reply["ok"] is False, reply
    assert reply["error"]["type"] == "ProtocolError", reply
    assert "no field 'owner'" in reply["error"]["message"], reply
    # and without the claim, B's job is B's
    honest = service.as_user(b, IMPERSONATE, str(service.socket), "", "-1")
    forged_id = json.loads(honest.stdout)["ids"][0]
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
    b_start, b_queued = (service.job(b_jobs[0])[k] for k in ("started", "submitted"))
    # A's jobs that started before B's was queued (B's submission took a while) are not in it
    started = {j: s for j in a_jobs[2:] if (s := service.job(j)["started"]) is None or s > b_queued}
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


def test_the_service_unit_runs_this_interpreter_and_spares_running_jobs():
    import os
    import subprocess
    import sys

    dlsched = os.path.join(os.path.dirname(sys.executable), "dlsched")
    unit = subprocess.run(
        [dlsched, "service", "unit", "--config", "/etc/dlsched/service.toml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stderr
    assert (
        f"ExecStart={sys.executable} -m jupyter_dlsched.cli service run --home /var/lib/dlsched "
        "--socket /run/dlsched/dlsched.sock --config /etc/dlsched/service.toml"
    ) in unit.stdout
    assert "KillMode=process" in unit.stdout and "[Install]" in unit.stdout


def test_a_user_at_the_running_limit_waits_with_the_reason_shown(service_factory, users):
    a, b = users
    service = service_factory(
        f"[limits]\nmax_running = 1\n\n[limits.users.{b.name}]\nmax_running = 2\n"
    )
    first, second = service.submit(a, 30, "a-cpu", gpus=0, n=2)
    wait_for(lambda: service.job(first)["state"] == "running")
    reason = wait_for(lambda: service.job(second)["waiting"])
    assert reason == f"{a.name} has 1 job running, the limit per user is 1"
    # B's own limit is 2: both of B's jobs run beside A's
    b_jobs = service.submit(b, 30, "b-cpu", gpus=0, n=2)
    wait_for(lambda: all(service.job(j)["state"] == "running" for j in b_jobs))
    assert service.job(second)["state"] == "queued"


PROGRESS = """
import json
import jupyter_dlsched as dls

def train():
    for step in range(3):
        dls.progress(step + 1, 3, loss=0.5 / (step + 1))
    return "trained"

h = dls.Scheduler(loop=False).submit(train)
print(json.dumps([h.result(timeout=60), h.info().progress]))
"""


def test_a_job_in_a_shared_pool_reports_progress_through_the_service(service, users):
    _, b = users
    done = service.as_user(b, PROGRESS)
    assert done.returncode == 0, done.stderr
    result, progress = json.loads(done.stdout)
    assert result == "trained"
    assert (progress["done"], progress["total"], progress["metrics"]) == (3.0, 3, {"loss": 0.5 / 3})


FIFO = """
import json
import jupyter_dlsched as dls

def plant():
    import os
    os.mkfifo(os.path.join(os.environ["DLSCHED_HOME"], "spool", os.environ["DLSCHED_JOB_ID"],
                           "error.json"))
    os._exit(3)

h = dls.Scheduler(loop=False).submit(plant)
print(json.dumps([h.wait(timeout=60).state, h.info().reason]))
"""


def test_a_fifo_a_job_leaves_for_its_error_report_does_not_hang_its_supervisor(service, users):
    _, b = users
    done = service.as_user(b, FIFO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["failed", "exit code 3"]


def test_a_user_cannot_queue_more_than_the_limit(service_factory, users):
    from team_pool import SUBMIT

    a, _ = users
    service = service_factory("[limits]\nmax_queued = 2\n")
    done = service.as_user(a, SUBMIT, "30", "a-many", "2", "4", "0.25")
    assert done.returncode != 0
    assert f"{a.name} has 2 jobs waiting; the limit per user is 2" in done.stderr
    first, *waiting = done.stdout.split()
    wait_for(lambda: service.job(first)["state"] == "running")
    assert [service.job(j)["state"] for j in waiting] == ["queued", "queued"]

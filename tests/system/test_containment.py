"""Every process a job starts is the job's: escapees are stopped with it, counted in its
memory, and hold its grant until they are gone; planted spool files fail the job.

The escapees are what real jobs leave behind: a grandchild in a session of its own
(``fork(); setsid(); fork()``, as ``setsid cmd &`` in a shell does) and a classic
double-fork daemon. Each case runs in this user's own pool and in a shared pool
(``dlsched service run`` as root, the job as a real other user), where each job also
has a cgroup of its own that must be gone afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import OtherUser, alive, wait_for

from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.client.scheduler import Scheduler

#: A job's main process that leaves a process running outside its process group.
#: argv: PIDFILE STYLE MIB MAIN_SECONDS; the escapee writes its pid to PIDFILE once it
#: starts, then holds MIB MiB; on SIGTERM it takes a second, then writes PIDFILE.gone (its exit time).
ESCAPER = r"""
import os, signal, sys, time
pidfile, style, mib, main_seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

def escapee():
    if style == "daemon":  # the textbook daemon: no terminal, no folder, no inherited files
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    def last_words(*_):
        time.sleep(1.0)
        with open(pidfile + ".gone.tmp", "w") as f:
            f.write(repr(time.time()))
        os.rename(pidfile + ".gone.tmp", pidfile + ".gone")
        os._exit(0)
    signal.signal(signal.SIGTERM, last_words)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    block = bytearray(mib * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    while True:
        time.sleep(1)

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        escapee()
    os._exit(0)  # the middle process exits: the escapee is nobody's child now
os.wait()
while not os.path.exists(pidfile):
    time.sleep(0.01)
time.sleep(main_seconds)
"""

STYLES = ["setsid", "daemon"]


def escaper(pidfile: Path, style: str, mib: int = 0, main_seconds: float = 600) -> list[str]:
    return ["/usr/bin/python3", "-c", ESCAPER, str(pidfile), style, str(mib), str(main_seconds)]


_started: list[int] = []


def escaped_pid(pidfile: Path) -> int:
    wait_for(pidfile.exists, timeout=60, what=lambda: "the escapee never started")
    pid = int(pidfile.read_text())
    assert alive(pid)
    _started.append(pid)
    return pid


@pytest.fixture(autouse=True)
def no_escapee_survives_a_failed_test() -> Iterator[None]:
    yield
    while _started:
        pid = _started.pop()
        try:
            if "pidfile, style" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, 9)
        except OSError:
            pass


def dlsched_cgroups(service) -> list[str]:
    """The job cgroups of ``service``'s pool still on this machine. Only its own: other pools
    (tests running beside this one, a pool whose supervisor was killed) have theirs."""
    from jupyter_dlsched.local.containment import PREFIX, home_token

    found = subprocess.run(
        ["find", "/sys/fs/cgroup", "-name", f"{PREFIX}{home_token(service.home)}-*"],
        capture_output=True,
        text=True,
    )
    return found.stdout.split()


# -- this user's own pool -------------------------------------------------------------------


@pytest.fixture(params=["agent", "no agent"])
def pool(request, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    """This user's pool, run by its pool agent (which forks supervisors) or without one
    (supervisors forked by the launcher or started as fresh interpreters)."""
    if request.param == "no agent":
        monkeypatch.setenv("DLSCHED_AGENT", "0")
    with Scheduler(home, lease_ttl=3.0, grace=2.0) as s:
        yield s


@pytest.mark.parametrize("style", STYLES)
def test_cancel_kills_the_processes_a_job_left_outside_its_group(pool, tmp_path, style):
    pidfile = tmp_path / "escapee"
    handle = pool.submit_command(escaper(pidfile, style), cpus=0.5)
    pid = escaped_pid(pidfile)
    assert os.getpgid(pid) != handle.info().job_pid  # it did leave the job's group
    handle.cancel()
    info = handle.wait(timeout=60)
    assert not alive(pid)
    assert info.state == "cancelled"
    assert info.reason == "cancelled by user; killed 1 process left behind"


@pytest.mark.parametrize("style", STYLES)
def test_the_time_limit_kills_the_processes_a_job_left_outside_its_group(pool, tmp_path, style):
    pidfile = tmp_path / "escapee"
    handle = pool.submit_command(escaper(pidfile, style), cpus=0.5, time_limit="3s")
    pid = escaped_pid(pidfile)
    info = handle.wait(timeout=60)
    assert not alive(pid)
    assert info.state == "timeout"
    assert info.reason == "time limit 3s reached; killed 1 process left behind"


def test_the_memory_limit_counts_a_grandchild_outside_the_group(pool, tmp_path):
    pidfile = tmp_path / "escapee"
    handle = pool.submit_command(escaper(pidfile, "setsid", mib=400), cpus=0.5, mem="200MiB")
    info = handle.wait(timeout=60)
    _started.append(pid := int(pidfile.read_text()))
    assert not alive(pid)
    assert info.state == "failed"
    assert info.reason.startswith("out of memory: used "), info.reason
    assert "limit 200 MiB; killed 1 process left behind" in info.reason


NEXT_JOB = r"""
import json, os, sys, time
started = time.time()
pid = int(open(sys.argv[1]).read())
try:
    with open(f"/proc/{pid}/stat") as f:
        running = f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
except FileNotFoundError:
    running = False
with open(sys.argv[2], "w") as f:
    json.dump({"started": started, "escapee_running": running,
               "gpus": os.environ["CUDA_VISIBLE_DEVICES"]}, f)
"""


def test_a_gpu_is_not_handed_on_while_a_finished_jobs_escapee_runs(home, monkeypatch, tmp_path):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    pidfile, seen = tmp_path / "escapee", tmp_path / "next.json"
    with Scheduler(home, lease_ttl=3.0, grace=2.0) as s:
        first = s.submit_command(escaper(pidfile, "setsid", main_seconds=0), gpus=1, cpus=0.5)
        second = s.submit_command(
            ["/usr/bin/python3", "-c", NEXT_JOB, str(pidfile), str(seen)], gpus=1, cpus=0.5
        )
        pid = escaped_pid(pidfile)
        done = first.wait(timeout=60)
        assert second.wait(timeout=60).state == "succeeded"
    assert done.state == "succeeded"  # its main process did its work and exited 0
    assert done.reason == "killed 1 process left behind"
    gone = float(Path(f"{pidfile}.gone").read_text())
    report = json.loads(seen.read_text())
    assert report["gpus"] == "0" and not report["escapee_running"]
    assert report["started"] >= gone  # the GPU went on only once the escapee had exited
    assert not alive(pid)


# -- a shared pool: the service (root) runs each job as its owner, in a cgroup of its own ---


SUBMIT = """
import json, sys
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
argv, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(s.submit_command(argv, **options).id)
"""

CANCEL = """
import sys
import jupyter_dlsched as dls
dls.Scheduler(loop=False).get(sys.argv[1]).cancel()
"""


@pytest.fixture
def team(team_users):
    from team_pool import shared_pool

    with shared_pool() as service:
        # stops take 2 s, not 10: what is tested is that they happen, and to every process
        AgentClient(str(service.socket)).call("settings", grace=2.0)
        yield service


@pytest.fixture
def drop(team_users) -> Iterator[Path]:
    """A folder the first team user writes into (the escapee's pid files)."""
    a, _ = team_users
    folder = Path(tempfile.mkdtemp(prefix="dlsched-drop-"))
    os.chmod(folder, 0o755)
    os.chown(folder, a.uid, a.gid)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def submit_as(service, user: OtherUser, argv: list[str], **options) -> str:
    done = service.as_user(user, SUBMIT, json.dumps(argv), json.dumps(options))
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def wait_ended(service, job_id: str) -> dict:
    terminal = ("succeeded", "failed", "cancelled", "timeout", "lost")
    return wait_for(
        lambda: (row := service.job(job_id))["state"] in terminal and row,
        timeout=90,
        what=lambda: service.job(job_id),
    )


def in_job_cgroup(pid: int) -> bool:
    """Whether ``pid`` sits in a job's cgroup (v2 subtree or v1 freezer / pids)."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return "/dlsched-" in text


@pytest.mark.parametrize("style", STYLES)
def test_a_shared_pools_cancel_kills_every_process_of_the_job(team, team_users, drop, style):
    a, _ = team_users
    pidfile = drop / "escapee"
    job = submit_as(team, a, escaper(pidfile, style), cpus=0.25)
    pid = escaped_pid(pidfile)
    assert in_job_cgroup(pid)
    done = team.as_user(a, CANCEL, job)
    assert done.returncode == 0, done.stderr
    row = wait_ended(team, job)
    assert not alive(pid)
    assert (row["state"], row["reason"]) == (
        "cancelled",
        "cancelled by user; killed 1 process left behind",
    )
    assert not alive(pid)
    assert dlsched_cgroups(team) == []


@pytest.mark.parametrize("style", STYLES)
def test_a_shared_pools_time_limit_kills_every_process_of_the_job(team, team_users, drop, style):
    a, _ = team_users
    pidfile = drop / "escapee"
    job = submit_as(team, a, escaper(pidfile, style), cpus=0.25, time_limit="3s")
    pid = escaped_pid(pidfile)
    row = wait_ended(team, job)
    assert not alive(pid)
    assert (row["state"], row["reason"]) == (
        "timeout",
        "time limit 3s reached; killed 1 process left behind",
    )
    assert not alive(pid)
    assert dlsched_cgroups(team) == []


def test_a_shared_pools_memory_limit_counts_a_grandchild(team, team_users, drop):
    a, _ = team_users
    pidfile = drop / "escapee"
    job = submit_as(team, a, escaper(pidfile, "setsid", mib=400), cpus=0.25, mem="200MiB")
    row = wait_ended(team, job)
    _started.append(pid := int(pidfile.read_text()))
    assert not alive(pid)
    assert row["state"] == "failed"
    assert row["reason"].startswith("out of memory: used "), row["reason"]
    assert row["reason"].endswith("limit 200 MiB; killed 1 process left behind")
    assert dlsched_cgroups(team) == []


def test_a_shared_pools_gpus_wait_for_a_finished_jobs_escapee(team, team_users, drop):
    a, b = team_users
    pidfile, seen = drop / "escapee", drop / "next.json"
    # both jobs ask for the whole pool (two GPUs): the second can only start after the first
    first = submit_as(team, a, escaper(pidfile, "daemon", main_seconds=0), gpus=2, cpus=0.25)
    pid = escaped_pid(pidfile)
    second = submit_as(
        team, a, ["/usr/bin/python3", "-c", NEXT_JOB, str(pidfile), str(seen)], gpus=2, cpus=0.25
    )
    done = wait_ended(team, first)
    assert wait_ended(team, second)["state"] == "succeeded"
    assert (done["state"], done["reason"]) == ("succeeded", "killed 1 process left behind")
    gone = float(Path(f"{pidfile}.gone").read_text())
    report = json.loads(seen.read_text())
    assert report["gpus"] == "0,1" and not report["escapee_running"]
    assert report["started"] >= gone
    assert not alive(pid)
    assert dlsched_cgroups(team) == []


def test_a_crashed_supervisors_cgroup_is_removed_by_the_next_one(team, team_users, drop):
    from jupyter_dlsched.local.containment import PREFIX, Cgroup, home_token

    a, _ = team_users
    [(parent, _kind), *_] = Cgroup.parents()
    # what a supervisor killed with -9 leaves: the cgroup of an attempt that no longer runs
    stale = parent / f"{PREFIX}{home_token(team.home)}-deadbeef-1"
    stale.mkdir()
    try:
        job = submit_as(team, a, ["true"], cpus=0.25)
        assert wait_ended(team, job)["state"] == "succeeded"
        assert not stale.exists()
        assert dlsched_cgroups(team) == []
    finally:
        if stale.exists():
            stale.rmdir()


def test_a_sweep_never_removes_the_cgroup_of_a_job_claimed_while_it_sweeps(tmp_path):
    """A supervisor's sweep read the running attempts, then listed the cgroups: a job
    claimed in between (its supervisor creating its cgroup right after the claim) had its
    new cgroup removed under it, and its process failed to enter it ("cannot enter the
    job's cgroup")."""
    from jupyter_dlsched.local.containment import PREFIX, Cgroup, home_token, sweep_cgroups

    if not Cgroup.parents():
        pytest.skip("needs root and a cgroup hierarchy")
    [(parent, _kind), *_] = Cgroup.parents()
    mine = f"{PREFIX}{home_token(tmp_path)}-"
    stale, claimed = parent / f"{mine}deadbeef-1", parent / f"{mine}newjob-1"
    stale.mkdir()

    def running() -> list[tuple[str, int]]:
        # what the ledger says at the moment of the read; the next claim and its cgroup
        # come just after it
        claimed.mkdir()
        return []

    try:
        assert sweep_cgroups(tmp_path, running) == 1
        assert not stale.exists()
        assert claimed.exists()
    finally:
        for path in (stale, claimed):
            if path.exists():
                path.rmdir()


def test_the_service_unit_delegates_a_cgroup_subtree():
    dlsched = os.path.join(os.path.dirname(sys.executable), "dlsched")
    unit = subprocess.run(
        [dlsched, "service", "unit"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Delegate=yes" in unit.stdout.splitlines()


# -- what a running job uses now ------------------------------------------------------------

BURN = r"""
import sys, time
block = bytearray(120 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
open(sys.argv[1], "w").close()
end = time.time() + 60
while time.time() < end:
    sum(range(10000))
"""


def test_a_running_job_shows_its_cpu_and_memory_now_and_none_after(pool, home, tmp_path):
    ready = tmp_path / "ready"
    handle = pool.submit_command(["/usr/bin/python3", "-c", BURN, str(ready)], cpus=1)
    wait_for(ready.exists, timeout=60)
    info = wait_for(
        lambda: (
            (i := pool.get(handle.id).info()).rss_now
            and i.rss_now >= 100 * 2**20
            and i.cpu_now
            and i
        ),
        timeout=30,
        what=lambda: handle.info(),
    )
    assert info.cpu_now > 10
    dlsched = os.path.join(os.path.dirname(sys.executable), "dlsched")
    env = {**os.environ, "DLSCHED_HOME": str(home)}
    shown = subprocess.run(
        [dlsched, "queue", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    [row] = [j for j in json.loads(shown.stdout) if j["id"] == handle.id]
    assert row["cpu_now"] > 0 and row["rss_now"] >= 100 * 2**20
    table = subprocess.run([dlsched, "queue"], capture_output=True, text=True, env=env, timeout=60)
    line = next(line for line in table.stdout.splitlines() if handle.id in line)
    assert "cpu " in line and "MiB" in line
    handle.cancel()
    ended = handle.wait(timeout=60)
    assert (ended.cpu_now, ended.rss_now) == (None, None)


# -- files the job's owner plants in its spool folder -----------------------------------------

#: A first attempt that plants KIND under NAME in its own spool folder, then fails (so the
#: job runs again in the same folder): what a user can do to the supervisor of the next run.
PLANT = r"""
import os, sys
name, kind, target = sys.argv[1], sys.argv[2], sys.argv[3]
folder = os.path.join(os.environ["DLSCHED_HOME"], "spool", os.environ["DLSCHED_JOB_ID"])
path = os.path.join(folder, name)
if os.path.lexists(path):
    os.unlink(path)
if kind == "symlink":
    os.symlink(target, path)
elif kind == "fifo":
    os.mkfifo(path)
elif kind == "hardlink":
    os.link(target, path)
elif kind == "folder":
    os.mkdir(path)
sys.exit(1)
"""

PLANTED = [
    ("log", "symlink", "a symbolic link"),
    ("log", "fifo", "a FIFO"),
    ("log", "hardlink", "a hard link"),
    ("stop-requested", "folder", "a folder"),
]


@pytest.mark.parametrize(("name", "kind", "what"), PLANTED)
def test_a_file_the_owner_plants_in_the_spool_folder_fails_the_next_run(
    team, team_users, drop, name, kind, what
):
    a, _ = team_users
    # the link's target: a file of the owner's own (a hard link needs one), or root's
    target = drop / "precious"
    target.write_text("keep me\n")
    if kind == "hardlink":
        os.chown(target, a.uid, a.gid)
    argv = ["/usr/bin/python3", "-c", PLANT, name, kind, str(target)]
    job = submit_as(team, a, argv, cpus=0.25, retries=1)
    row = wait_ended(team, job)
    folder = team.home / "spool" / job
    assert row["state"] == "failed"  # not "lost (lease expired)": its supervisor said why
    assert row["reason"] == f"its spool folder holds a planted {name} ({what}): {folder / name}"
    assert row["attempts"] == 2
    assert target.read_text() == "keep me\n"  # never written through the link
    assert dlsched_cgroups(team) == []


HOLD_FLAG = r"""
import os, sys, time
folder = os.path.join(os.environ["DLSCHED_HOME"], "spool", os.environ["DLSCHED_JOB_ID"])
os.mkdir(os.path.join(folder, "stop-requested"))
open(sys.argv[1], "w").close()
time.sleep(600)
"""


def test_a_job_whose_stop_flag_is_a_folder_is_still_cancelled(team, team_users, drop):
    a, _ = team_users
    ready = drop / "ready"
    job = submit_as(team, a, ["/usr/bin/python3", "-c", HOLD_FLAG, str(ready)], cpus=0.25)
    wait_for(ready.exists, timeout=60, what=lambda: team.job(job))
    done = team.as_user(a, CANCEL, job)
    assert done.returncode == 0, done.stderr
    row = wait_ended(team, job)
    assert (row["state"], row["reason"]) == ("cancelled", "cancelled by user")
    assert dlsched_cgroups(team) == []


# -- a delegated cgroup-v2 subtree -----------------------------------------------------------

V2_BOX = r"""
import json, os, sys, time
from jupyter_dlsched.local.containment import Containment

box = Containment.create("v2test", 1, sys.argv[1], cgroup=True)
kind = box.cgroup.kind
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    box.join()
    if os.fork() == 0:
        os.setsid()
        escapee = os.fork()
        if escapee == 0:
            time.sleep(600)
        os.write(write, f"{escapee}\n".encode())
        os._exit(0)
    time.sleep(600)
box.add(pid)
escapee = int(os.read(read, 64))
while box.pids() != {pid, escapee}:  # the job process and its escaped grandchild
    time.sleep(0.01)
members = sorted({pid, escapee} & box.cgroup.pids())
killed = sorted(box.kill_all())
path = str(box.cgroup.path)
box.close()
print(json.dumps({"kind": kind, "members": members, "killed": killed, "left": os.path.exists(path)}))
"""


def test_a_delegated_cgroup_v2_subtree_holds_and_kills_a_jobs_processes(tmp_path):
    unified = Path("/sys/fs/cgroup/unified")
    if os.geteuid() != 0 or not (unified / "cgroup.controllers").exists():
        pytest.skip("needs root and a cgroup-v2 hierarchy at /sys/fs/cgroup/unified")
    if not (Path("/sys/fs/cgroup/memory") / "cgroup.procs").exists():
        pytest.skip("the v2 hierarchy here holds the memory controller: nothing is moved in it")
    # a stand-in for the service's delegated subtree; only the v2 membership of a process
    # started for the test changes (its memory cgroup is the v1 one, untouched)
    service = unified / f"dlsched-test-{os.getpid()}"
    service.mkdir()
    try:
        done = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {service}/cgroup.procs && exec "$0" -c "$1" "$2"',
                sys.executable,
                V2_BOX,
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
    finally:
        service.rmdir()
    assert report["kind"] == "v2"
    assert len(report["members"]) == 2  # both in the job's cgroup, the escapee too
    assert set(report["members"]) <= set(report["killed"])
    assert not report["left"]
    assert not any(alive(pid) for pid in report["members"])


FORKING = r"""
import os, sys, time
from pathlib import Path
from jupyter_dlsched.local.containment import Cgroup

group = Cgroup(Path(sys.argv[1]), sys.argv[2])
pid = os.fork()
if pid == 0:
    group.join()
    while True:  # keeps forking while it is being killed: the kill must still empty the group
        if os.fork() == 0:
            os.setsid()
            time.sleep(600)
            os._exit(0)
        time.sleep(0.002)
while len(group.pids()) < 20:
    time.sleep(0.01)
killed = group.kill_all()
print(len(killed), len(group.pids()), group.remove())
"""


@pytest.mark.parametrize("kind", ["freezer", "pids"])
def test_a_v1_cgroup_is_emptied_while_its_processes_keep_forking(kind):
    parent = Path("/sys/fs/cgroup") / kind
    if os.geteuid() != 0 or not (parent / "cgroup.procs").exists():
        pytest.skip(f"needs root and the cgroup-v1 {kind} hierarchy")
    path = parent / f"dlsched-test-{os.getpid()}-{kind}"
    path.mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-c", FORKING, str(path), kind],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        killed, left, removed = done.stdout.split()
    finally:
        if path.exists():
            path.rmdir()
    assert int(killed) >= 20 and (int(left), removed) == (0, "True")


def test_a_supervisor_whose_state_folder_is_removed_stops_its_job(tmp_path, monkeypatch):
    """Nothing could record or stop such a job again: it must not run on for good."""
    import shutil

    from jupyter_dlsched.client.scheduler import Scheduler
    from jupyter_dlsched.store import Store

    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    home = tmp_path / "home"
    with Scheduler(home, lease_ttl=2.0, grace=1.0) as s:
        job = s.submit_command([sys.executable, "-c", "import time; time.sleep(300)"])
        info = wait_for(lambda: (i := s.get(job.id).info()).job_pid and i, timeout=60)
    # the pool's agent may write a file into it meanwhile (as under a user's rm -rf): again
    wait_for(lambda: shutil.rmtree(home, ignore_errors=True) or not home.exists(), timeout=30)
    Store(home)  # and an agent still running makes a new, empty ledger where it was
    wait_for(lambda: not psutil.pid_exists(info.job_pid), timeout=30, what=lambda: "job")
    wait_for(lambda: not _alive(info.supervisor_pid), timeout=30, what=lambda: "supervisor")


def _alive(pid: int | None) -> bool:
    if pid is None or not psutil.pid_exists(pid):
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leave_a_process_holding(pidfile: str) -> str:
    """A function job whose work is done but which left a process running in a session
    of its own that ignores SIGTERM (it goes only at the grace's SIGKILL)."""
    import signal
    import time

    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_a_success_whose_escapee_still_runs_shows_its_gpu_taken(home, monkeypatch, tmp_path):
    """Its result is given before its grant is released: until the escapee is gone the
    pool, the status and the metrics count its GPU as taken, by that job."""
    import time

    from jupyter_dlsched.machine.metrics import exposition, parse

    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    pidfile = tmp_path / "escapee"
    with Scheduler(home, lease_ttl=3.0, grace=6.0) as s:
        handle = s.submit(leave_a_process_holding, str(pidfile), gpus=1, cpus=0.5)
        assert handle.result(timeout=60) == "0"
        pid = escaped_pid(pidfile)
        assert s.info(handle.id).state == "succeeded"
        assert s.pool().gpus[0].jobs == [handle.id]
        assert s.status()["gpus"]["busy"] == 1
        scraped = parse(exposition(s.store, None, time.time()).decode())
        assert scraped["dlsched_gpu_allocated_ratio"] == [
            ({"gpu": "0"}, 1.0, "dlsched_gpu_allocated_ratio")
        ]
        wait_for(lambda: not alive(pid), timeout=30, what=lambda: "the escapee was never killed")
        wait_for(lambda: s.pool().gpus[0].jobs == [], timeout=30)
        assert s.status()["gpus"]["busy"] == 0
    assert s.info(handle.id).reason == "killed 1 process left behind"

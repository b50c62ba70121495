"""A shared pool's service against what users and admins get wrong, or try on purpose.

Payloads are deleted once their jobs can no longer run and are capped per
user; a full disk still lets a job be cancelled; every ``service.toml`` value
is checked at start; a state folder users cannot reach is refused; malformed
raw requests get protocol errors, never an internal error. Two real Unix users
(created for the session; CI runs as root) act through their own Python.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import small_disk
from team_pool import DLSCHED, SUBMIT, Service, shared_pool, wait_for

from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.agent.config import ServiceConfig
from jupyter_dlsched.store import RESERVE_NAME

MiB = 2**20


@pytest.fixture
def users(team_users):
    return team_users


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A temporary folder every user can reach (pytest's own are private to root)."""
    root = Path(tempfile.mkdtemp(prefix="dlsched-open-"))
    os.chmod(root, 0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def blob_rows(service: Service) -> tuple[int, int]:
    """``(rows, bytes)`` of the service ledger's ``blobs`` table, read as root."""
    db = sqlite3.connect(service.home / "ledger.sqlite", timeout=30)
    try:
        return tuple(
            db.execute("SELECT COUNT(*), COALESCE(SUM(length(data)), 0) FROM blobs").fetchone()
        )
    finally:
        db.close()


def log_tracebacks(service: Service) -> list[str]:
    text = service.log.read_text(errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or "failed:" in line]


# -- disk: payloads deleted, collected, capped; cancel on a full disk -------------------------

RUN_THREE = """
import json
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
handles = s.map(len, [b"a" * 300_000, b"b" * 300_000]) + [s.submit(len, b"c" * 300_000)]
print(json.dumps([h.result(timeout=60) for h in handles]))
"""


def test_a_jobs_payload_is_deleted_once_it_has_ended_and_its_keep_is_over(users):
    a, _ = users
    with shared_pool(env={"DLSCHED_PAYLOAD_KEEP": "0"}) as service:
        done = service.as_user(a, RUN_THREE)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [300_000] * 3
        # the ends are recorded before the results are read: nothing is left in the ledger
        assert blob_rows(service) == (0, 0)


REQUEUE = """
import json, sys, time
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
first = s.submit(len, b"k" * 300_000)
first.result(timeout=60)
again = s.requeue(first.id)
out = [again.result(timeout=60)]
time.sleep(float(sys.argv[1]))
s.submit(len, b"").result(timeout=60)  # a later job's end deletes what is past its keep
try:
    s.requeue(first.id)
    out.append("requeued")
except dls.SpecError as error:
    out.append(str(error))
print(json.dumps(out))
"""


def test_an_ended_jobs_payload_is_kept_for_a_requeue_then_deleted(users):
    a, _ = users
    with shared_pool(env={"DLSCHED_PAYLOAD_KEEP": "3s"}) as service:
        done = service.as_user(a, REQUEUE, "4")
        assert done.returncode == 0, done.stderr
        again, refused = json.loads(done.stdout)
        assert again == 300_000  # the requeued job ran the kept payload
        assert "a job whose payload is still kept (an ended job's is kept 3s" in refused
        # the 300 kB payload is gone; only the last small job's files are still kept
        assert blob_rows(service)[1] < 10_000


HOLD = """
import sys
import jupyter_dlsched as dls

def hold(data, seconds):
    import time
    time.sleep(seconds)
    return len(data)

s = dls.Scheduler(loop=False)
gpus = float(sys.argv[3])
print(s.submit(hold, b"x" * int(sys.argv[1]), float(sys.argv[2]), gpus=gpus).id)
"""


def test_a_restarted_service_collects_the_payloads_nobody_needs(users):
    a, _ = users
    with shared_pool(env={"DLSCHED_PAYLOAD_KEEP": "0"}) as service:
        running = service.as_user(a, HOLD, "1000", "120", "2").stdout.strip()
        wait_for(lambda: service.job(running)["state"] == "running")
        waiting = service.as_user(a, HOLD, "200000", "0", "1").stdout.strip()
        service.stop()
        db = sqlite3.connect(service.home / "ledger.sqlite", timeout=30)
        with db:
            # what older code left: a payload of a job long gone, and no counts at all
            db.execute("INSERT INTO blobs(hash, data) VALUES('leftover', zeroblob(500000))")
            db.execute("DELETE FROM blob_refs")
        db.close()
        assert blob_rows(service)[1] > 700_000
        service.start()
        assert "deleted 1 leftover payloads (488 KiB)" in service.log.read_text()
        rows, size = blob_rows(service)
        assert 200_000 < size < 300_000, "the waiting and running jobs keep theirs"
        assert service.job(waiting)["state"] == "queued"
        for job_id in (running, waiting):
            AgentClient(str(service.socket)).call("cancel", id=job_id)
        wait_for(lambda: blob_rows(service) == (0, 0))


def test_a_user_over_the_payload_limit_is_refused_with_the_figures(users):
    a, b = users
    with shared_pool("[limits]\nmax_payload_bytes = '1MiB'\n") as service:
        first = service.as_user(a, HOLD, "700000", "120", "0")
        assert first.returncode == 0, first.stderr
        second = service.as_user(a, HOLD, "700000", "0", "0")
        assert second.returncode != 0
        message = second.stderr.strip().splitlines()[-1]
        figures = (
            rf"{a.name}'s queued payloads take 68\d KiB; the limit per user is 1(\.0)? MiB; "
            r"this request adds 68\d KiB"
        )
        assert re.search(figures, message), message
        # another user's own share is untouched
        other = service.as_user(b, HOLD, "700000", "0", "0")
        assert other.returncode == 0, other.stderr
        # once A's job has ended, its payload no longer counts
        AgentClient(str(service.socket)).call("cancel", id=first.stdout.strip())
        wait_for(lambda: service.job(first.stdout.strip())["state"] == "cancelled")
        again = service.as_user(a, HOLD, "700000", "0", "0")
        assert again.returncode == 0, again.stderr


CANCEL = """
import json, sys
import jupyter_dlsched as dls
s = dls.Scheduler(loop=False)
print(json.dumps([s.cancel(job_id).state for job_id in sys.argv[1:]]))
"""


def fill(path: Path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * MiB)
                f.flush()
        except OSError:
            pass


@pytest.fixture
def small_service() -> Iterator[Service]:
    """A shared pool whose folder is a 48 MiB tmpfs (in a folder every user can reach)."""
    root = Path(tempfile.mkdtemp(prefix="dlsched-small-"))
    os.chmod(root, 0o755)
    with small_disk(root / "disk", "48m") as mount:
        os.chmod(mount, 0o755)
        service = Service(mount)
        try:
            service.start()
            yield service
        finally:
            for ballast in mount.glob("ballast*"):
                ballast.unlink()
            if service.proc is not None and service.proc.poll() is None:
                client = AgentClient(str(service.socket))
                for job in client.call("jobs", states=["queued", "running"])["jobs"]:
                    client.call("cancel", id=job["id"])
            service.stop()
    subprocess.run(["rm", "-rf", str(root), str(service.run)], check=False)


def test_a_job_can_be_cancelled_on_a_full_disk(small_service, users):
    a, _ = users
    service = small_service
    running = service.as_user(a, HOLD, "1000", "300", "2").stdout.strip()
    wait_for(lambda: service.job(running)["state"] == "running")
    waiting = service.as_user(a, HOLD, "1000", "0", "1").stdout.strip()
    # the disk full and its reserve spent: the journal emptied first, so writes need space
    db = sqlite3.connect(service.home / "ledger.sqlite", timeout=30)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    fill(service.root / "ballast")
    (service.home / RESERVE_NAME).unlink(missing_ok=True)
    fill(service.root / "ballast-2")
    done = service.as_user(a, CANCEL, waiting, running)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["cancelled", "running"]
    wait_for(lambda: service.job(running)["state"] == "cancelled", timeout=90)
    assert service.proc is not None and service.proc.poll() is None


# -- service.toml: every value checked at start ------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "allowed"),
    [
        ("admin_group = 5", "admin_group=5", "a non-empty string"),
        ("admin_group = ''", "admin_group=''", "a non-empty string"),
        ("[limits]\nmax_gpus = nan", "limits.max_gpus=nan", "a number of GPUs from 0 to 4096"),
        ("[limits]\nmax_gpus = inf", "limits.max_gpus=inf", "from 0 to 4096"),
        ("[limits]\nmax_gpus = -1", "limits.max_gpus=-1", "from 0 to 4096"),
        ("[limits]\nmax_gpus = true", "limits.max_gpus=True", "from 0 to 4096"),
        ("[limits]\nmax_gpus = '2'", "limits.max_gpus='2'", "from 0 to 4096"),
        ("[limits]\nmax_running = 1.5", "limits.max_running=1.5", "a whole number of jobs"),
        ("[limits]\nmax_queued = inf", "limits.max_queued=inf", "a whole number of jobs"),
        ("[limits]\nmax_priority = nan", "limits.max_priority=nan", "low=0, normal=50"),
        ("[limits]\nmax_payload_bytes = 'lots'", "limits.max_payload_bytes='lots'", "a size"),
        ("[limits]\nmax_payload_bytes = -1", "limits.max_payload_bytes=-1", "a size"),
        ("[limits]\nmax_cache_bytes = 'lots'", "limits.max_cache_bytes='lots'", "a size"),
        ("[limits]\nmax_cache_bytes = true", "limits.max_cache_bytes=True", "a size"),
        ("[limits.users]\nana = 5", "limits.users.ana=5", "a table"),
        ("[limits.users.ana]\nmax_gpus = nan", "limits.users.ana.max_gpus=nan", "from 0 to"),
        ("limits = 3", "limits=3", "a table of limits"),
        ("policy = 5", "policy=5", "one of fair, fifo"),
        ("policy = 'nope'", "policy='nope'", "one of fair, fifo"),
        ("policy_params = 3", "policy_params=3", "a table of policy parameters"),
        (
            "policy = 'priority'\n[policy_params]\nreserve_after = 'x'",
            "policy_params.reserve_after='x'",
            "a finite number of at least 0",
        ),
        (
            "policy = 'priority'\n[policy_params]\naging_step = nan",
            "policy_params.aging_step=nan",
            "a finite number",
        ),
        (
            "policy = 'priority'\n[policy_params]\npreempt = 1",
            "policy_params.preempt=1",
            "true or false",
        ),
        (
            "policy = 'las'\n[policy_params]\nthresholds = [1, inf]",
            "policy_params.thresholds=inf",
            "a list of finite numbers",
        ),
        ("[policy_params]\nbogus = 1", "fair policy parameters", "valid parameters"),
        ("[weights]\nana = nan", "weights.ana=nan", "a number above zero"),
        ("[weights]\nana = inf", "weights.ana=inf", "a number above zero"),
        ("[weights]\nana = 0", "weights.ana=0", "a number above zero"),
        ("weights = 3", "weights=3", "a table of weights"),
        ("polic = 'fair'", "polic='fair'", "one of policy"),
        ("min_schedule_interval = 'soon'", "min_schedule_interval='soon'", "a duration"),
        ("[limits]\nmax_schedules = -1", "limits.max_schedules=-1", "a whole number"),
        # a typo of a name would weigh, limit or make an admin of nobody, in silence
        (
            "[weights]\n'@dlsnosuchgroup' = 2",
            "weights.@dlsnosuchgroup='dlsnosuchgroup'",
            "a group of this machine (no such group)",
        ),
        (
            "[weights]\ndlsnosuchuser = 2",
            "weights.dlsnosuchuser='dlsnosuchuser'",
            "a user of this machine (no such user)",
        ),
        ("[weights]\n'' = 2", "weights.=''", "a user of this machine (an empty name"),
        (
            "[limits.users.dlsnosuchuser]\nmax_gpus = 1",
            "limits.users.dlsnosuchuser='dlsnosuchuser'",
            "a user of this machine (no such user)",
        ),
        (
            "admin_group = 'dlsnosuchgroup'",
            "admin_group='dlsnosuchgroup'",
            "a group of this machine (no such group)",
        ),
        # a fraction of a byte, and a limit of no bytes that refuses every submission
        (
            "[limits]\nmax_cache_bytes = 1.5",
            "limits.max_cache_bytes=1.5",
            "a size of at least one whole byte",
        ),
        (
            "[limits]\nmax_payload_bytes = 0",
            "limits.max_payload_bytes=0",
            "a size of at least one whole byte",
        ),
        (
            "[limits]\nmax_payload_bytes = '0.5'",
            "limits.max_payload_bytes='0.5'",
            "a size of at least one whole byte",
        ),
        ("policy = [", "config=", "TOML"),
    ],
)
def test_a_bad_service_toml_value_stops_the_start_in_one_line(tmp_path, toml, key, allowed):
    config = tmp_path / "service.toml"
    config.write_text(toml + "\n")
    done = subprocess.run(
        [
            DLSCHED,
            "service",
            "run",
            "--home",
            str(tmp_path / "home"),
            "--socket",
            str(tmp_path / "s.sock"),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("dlsched service: ")
    assert key in lines[0] and allowed in lines[0], lines[0]
    assert not (tmp_path / "home").exists() and not (tmp_path / "s.sock").exists()


def test_a_good_service_toml_is_read_as_written(tmp_path):
    config = tmp_path / "service.toml"
    config.write_text(
        "policy = 'las'\nadmin_group = 'root'\n[policy_params]\nthresholds = [60, 600.5]\n"
        "preempt = false\n[weights]\nroot = 2\n'@root' = 0.5\n"
        "[limits]\nmax_gpus = 2.5\nmax_running = 3\nmax_payload_bytes = '50MiB'\n"
        "max_cache_bytes = '2GiB'\n[limits.users.root]\nmax_payload_bytes = 1000\n"
    )
    loaded = ServiceConfig.load(config)
    assert (loaded.policy, loaded.admin_group) == ("las", "root")
    assert loaded.policy_params == {"thresholds": [60, 600.5], "preempt": False}
    assert loaded.weights == {"root": 2.0, "@root": 0.5}
    assert loaded.limits.max_gpus == 2.5 and loaded.limits.max_running == 3
    assert loaded.limits.max_payload_bytes == 50 * MiB
    ana = loaded.limits_for("root")
    assert (ana.max_payload_bytes, ana.max_gpus, ana.max_priority) == (1000, 2.5, 100)
    assert loaded.limits.max_cache_bytes == ana.max_cache_bytes == 2 * 2**30


def test_a_directory_service_that_fails_makes_a_peer_a_plain_user(monkeypatch):
    import grp

    def broken(name: str):
        raise OSError(5, "the directory service did not answer")

    monkeypatch.setattr(grp, "getgrnam", broken)
    config = ServiceConfig(admin_group="dlsched-admin")
    assert config.is_admin(12345, service_uid=0) is False
    assert config.is_admin(0, service_uid=0) is True


# -- a state folder users cannot reach -----------------------------------------------------------


def test_a_home_users_cannot_reach_is_refused_at_start_with_the_folder_and_mode(open_folder):
    from team_pool import RUN_ROOT

    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    (open_folder / "none.toml").write_text("")
    run = Path(tempfile.mkdtemp(prefix="dlsched-test-", dir=RUN_ROOT))  # a socket folder of root's
    os.chmod(run, 0o755)
    try:
        done = subprocess.run(
            [
                DLSCHED,
                "service",
                "run",
                "--home",
                str(closed / "pool" / "home"),
                "--socket",
                str(run / "s.sock"),
                "--config",
                str(open_folder / "none.toml"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        subprocess.run(["rm", "-rf", str(run)], check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert f"{closed} is drwx------ (0700), which other users cannot pass through" in line, line
    assert not (closed / "pool").exists(), "nothing is created in a refused home"


FAILS = """
import jupyter_dlsched as dls

def works():
    return 1

h = dls.Scheduler(loop=False).submit(works)
try:
    h.result(timeout=60)
    print("returned")
except BaseException as error:
    print(type(error).__name__, error)
"""


def test_a_failed_job_raises_its_failure_when_its_report_cannot_be_read(users):
    a, _ = users
    root = Path(tempfile.mkdtemp(prefix="dlsched-closed-"))
    os.chmod(root, 0o755)
    service = Service(root)
    service.home = root / "closed" / "home"
    try:
        service.start()
        # an admin closes a folder above the pool's state folder while it serves
        os.chmod(root / "closed", 0o700)
        done = service.as_user(a, FAILS)
        assert done.returncode == 0, done.stderr
        out = done.stdout.strip()
        assert out.startswith("JobFailed job "), out
        assert "TimeoutError" not in out and "belongs to" not in out, out
        assert "cannot read its error report" in out and "Permission denied" in out, out
    finally:
        service.stop()
        subprocess.run(["rm", "-rf", str(root), str(service.run)], check=False)


# -- malformed raw requests and names ------------------------------------------------------------

RAW = """
import json, sys
from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.vocab.errors import DlschedError
client = AgentClient(sys.argv[1])
# every field a submit needs, so that its jobs' files reach the handler's own checks
whole = {"kind": "command", "default_name": "x", "origin": "", "options": {}, "inline": False,
         "backend": "local"}
requests = [
    ("submit", [b"x"], {**whole, "jobs": [{"files": {"command.json": 7}}]}),
    ("submit", [b"x"], {**whole, "jobs": [{"files": ["command.json"]}]}),
    ("submit", [b"x"], {**whole, "jobs": [{"files": {"command.json": True}}]}),
    ("submit", [b"x"], {**whole, "jobs": ["command.json"]}),
    ("jobs", [], {"offset": 10**30}),
    ("jobs", [], {"states": [{}]}),
    ("jobs", [], {"ids": [{}]}),
    ("finished", [], {"since": "yesterday"}),
    ("changes", [], {"since": 10**30}),
    ("changes", [], {"wait": float("nan")}),
    ("events", [], {"since": -10**30}),
    ("events", [], {"since": 10**30}),
]
out = []
for op, blobs, fields in requests:
    try:
        client.call(op, blobs, **fields)
        out.append([op, "answered", ""])
    except DlschedError as error:
        out.append([op, type(error).__name__, str(error)])
print(json.dumps(out))
"""


def test_malformed_raw_requests_get_protocol_errors_and_no_traceback(users):
    _, b = users
    with shared_pool() as service:
        done = service.as_user(b, RAW, str(service.socket))
        assert done.returncode == 0, done.stderr
        replies = json.loads(done.stdout)
        kinds = [kind for _, kind, _ in replies]
        assert kinds == ["ProtocolError"] * 4 + ["SpecError"] * 8, replies
        assert all("the pool agent failed" not in words for _, _, words in replies)
        assert "offset=1000000000000000000000000000000 is invalid" in replies[4][2]
        assert "states=[{}] is invalid: expected a list of job states" in replies[5][2]
        # the service goes on, and logged nothing of it
        assert service.as_user(b, SUBMIT, "0", "b-after", "0", "1", "0.25").returncode == 0
        assert log_tracebacks(service) == []


NAMES = """
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import DlschedError
s = dls.Scheduler(loop=False)
for kwargs in ({"name": "\\u202e"}, {"name": "report\\u202etxt.exe"}, {"priority": 101}):
    try:
        s.submit(abs, 1, **kwargs)
        print("accepted")
    except DlschedError as error:
        print(type(error).__name__, error)
"""


def test_bidi_names_and_priorities_over_the_cap_are_refused_in_plain_words(users):
    _, b = users
    with shared_pool() as service:
        done = service.as_user(b, NAMES)
        assert done.returncode == 0, done.stderr
        bidi, hidden, priority = done.stdout.strip().splitlines()
        assert bidi.startswith("SpecError name=") and "bidirectional controls (U+202E" in bidi
        assert hidden.startswith("SpecError name=") and "U+202E found" in hidden
        assert priority == (
            "PermissionDenied priority 101 is above the highest a user may ask for in this "
            "pool, high (100); an admin can raise it"
        )

"""Nothing another user could write is ever trusted: state folders, the ledger, spool files.

The attack these tests replay: user B prepares a state folder (or a folder above
one), user A points ``DLSCHED_HOME`` at it, and B swaps A's result for a pickle
whose unpickling runs a command as A. Each variant must be refused before
anything is read, with nothing run and no mode changed on B's files.
"""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import jupyter_dlsched as dls
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local import launcher
from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.errors import UnsafeStateFolder


class RunsACommand:
    """What an attacker plants: unpickling it runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def double(x: int) -> int:
    return 2 * x


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp that another user can use (pytest's own tmp folders are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="dlsched-attack-"))
    os.chmod(path, 0o1777)  # like /tmp: anyone may create, only owners rename
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)
    launcher.stop(path / "home")
    launcher.stop(path / "b-owned" / "home")


def test_a_new_state_folder_and_its_ledger_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    home = tmp_path / "home"
    with Scheduler(home) as s:
        assert s.submit(double, 21).result(timeout=60) == 42
        job = s.jobs()[0]
    try:
        assert mode(home) == 0o700
        assert mode(home / "spool") == 0o700
        assert mode(home / "spool" / job.id) == 0o700
        for path in [home / "ledger.sqlite", *(home / "spool" / job.id).iterdir()]:
            assert mode(path) == 0o600, path
        for suffix in ("-wal", "-shm"):
            side = home / f"ledger.sqlite{suffix}"
            if side.exists():
                assert mode(side) == 0o600
    finally:
        launcher.stop(home)


def test_a_state_folder_others_can_write_is_refused_and_left_as_it_is(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    with pytest.raises(UnsafeStateFolder, match="other users can write to it"):
        Store(home)
    assert mode(home) == 0o777, "the scheduler must not chmod a folder it refuses"
    assert not (home / "ledger.sqlite").exists()


def test_a_ledger_others_can_write_is_refused(tmp_path):
    Store(tmp_path / "home").close()
    os.chmod(tmp_path / "home" / "ledger.sqlite", 0o666)
    with pytest.raises(UnsafeStateFolder, match="ledger.sqlite"):
        Store(tmp_path / "home")


def test_a_result_that_is_a_symbolic_link_is_refused_not_unpickled(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    marker = tmp_path / "ran"
    planted = tmp_path / "planted.pkl"
    planted.write_bytes(pickle.dumps(RunsACommand(marker)))
    home = tmp_path / "home"
    try:
        with Scheduler(home) as s:
            handle = s.submit(double, 21)
            assert handle.result(timeout=60) == 42
            result = home / "spool" / handle.id / "result.pkl"
            result.unlink()
            result.symlink_to(planted)
            again = Scheduler(home, loop=False)
            with pytest.raises(UnsafeStateFolder, match="symbolic link"):
                again.get(handle.id).result(timeout=5)
            again.close()
    finally:
        launcher.stop(home)
    assert not marker.exists()


def test_a_state_folder_of_another_user_is_refused_before_anything_runs(
    other_user, shared_tmp, monkeypatch
):
    """The reported attack: B makes the folder and plants a result; A (root) points at it."""
    home = shared_tmp / "home"
    marker = shared_tmp / "ran-as-root"
    prepared = other_user.run(
        "import os, sys; home = sys.argv[1]; os.makedirs(home + '/spool/aaaaaaaa', 0o700);"
        "open(home + '/spool/aaaaaaaa/result.pkl', 'wb').write(bytes.fromhex(sys.argv[2]))",
        str(home),
        pickle.dumps(RunsACommand(marker)).hex(),
    )
    assert prepared.returncode == 0, prepared.stderr
    assert os.stat(home).st_uid == other_user.uid
    modes_before = {p: mode(p) for p in [home, *home.rglob("*")]}

    monkeypatch.setenv("DLSCHED_HOME", str(home))
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    dls.set_default_scheduler(None)
    with pytest.raises(UnsafeStateFolder, match=f"belongs to uid {other_user.uid}"):
        dls.submit(double, 1)
    with pytest.raises(UnsafeStateFolder):
        dls.get("aaaaaaaa")
    dls.set_default_scheduler(None)

    assert not marker.exists()
    assert not (home / "ledger.sqlite").exists()
    assert {p: mode(p) for p in [home, *home.rglob("*")]} == modes_before


def test_a_folder_above_the_state_folder_owned_by_another_user_is_refused(other_user, shared_tmp):
    """B owns a folder above A's state folder, so B could rename A's folder away."""
    parent = shared_tmp / "b-owned"
    parent.mkdir()
    os.chown(parent, other_user.uid, other_user.gid)
    with pytest.raises(UnsafeStateFolder, match=f"the folder above it, {parent}"):
        Store(parent / "home")


def test_another_user_cannot_reach_or_swap_a_private_result(other_user, shared_tmp, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    home = shared_tmp / "home"
    marker = shared_tmp / "ran-as-root"
    with Scheduler(home) as s:
        handle = s.submit(double, 21)
        assert handle.result(timeout=60) == 42
        spool = home / "spool" / handle.id
        attack = other_user.run(
            "import os, sys\n"
            "spool, payload = sys.argv[1], bytes.fromhex(sys.argv[2])\n"
            "failures = []\n"
            "for attempt in (\n"
            "    lambda: os.rename(spool, spool + '.old'),\n"
            "    lambda: open(spool + '/result.pkl', 'wb').write(payload),\n"
            "    lambda: open(os.path.dirname(os.path.dirname(spool)) + '/ledger.sqlite', 'r+b'),\n"
            "    lambda: os.listdir(os.path.dirname(spool)),\n"
            "):\n"
            "    try:\n"
            "        attempt()\n"
            "    except PermissionError:\n"
            "        failures.append('refused')\n"
            "print(' '.join(failures))\n",
            str(spool),
            pickle.dumps(RunsACommand(marker)).hex(),
        )
        assert attack.stdout.split() == ["refused"] * 4, attack.stderr
        fresh = Scheduler(home, loop=False)
        assert fresh.get(handle.id).result(timeout=5) == 42
        fresh.close()
    assert not marker.exists()


def test_the_cli_says_in_one_line_why_a_state_folder_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    dlsched = Path(sys.executable).with_name("dlsched")
    done = subprocess.run(
        [str(dlsched), "--home", str(home), "status"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "other users can write to it" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def read_staged(name: str) -> str:
    return (Path(dls.data(name)) / "a.txt").read_text()[:3]


def test_several_schedulers_in_one_process_never_corrupt_the_ledger(tmp_path, monkeypatch):
    """Checking the ledger's files must never open and close them: closing any descriptor of
    a database file drops this process's SQLite locks, and another process then rewrites
    pages under a connection here ("database disk image is malformed")."""
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    home, source = tmp_path / "home", tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_text("x" * 100_000)
    looping = Scheduler(home)
    submitter = Scheduler(home, loop=False)
    try:
        for i in range(5):
            job = submitter.submit(read_staged, "d", stage_in={"d": str(source)}, name=f"j{i}")
            assert job.result(timeout=60) == "xxx"
        assert Store(home).integrity_check() == "ok"
    finally:
        looping.close()
        submitter.close()
        launcher.stop(home)

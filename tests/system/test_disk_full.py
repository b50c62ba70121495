"""A full disk: the job that filled it fails with the reason, the rest of the queue goes on,
submitting says clearly what is wrong, and everything recovers once space is back.

The state folder lives on a small tmpfs (mounting needs root; CI runs as root).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import small_disk

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local import launcher
from jupyter_dlsched.store import RESERVE_BYTES, RESERVE_NAME
from jupyter_dlsched.vocab.errors import LedgerUnavailable

MiB = 2**20


@pytest.fixture
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 24 MiB tmpfs holding DLSCHED_HOME."""
    with small_disk(tmp_path / "disk", "24m") as mount:
        home = mount / "home"
        monkeypatch.setenv("DLSCHED_HOME", str(home))
        monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
        try:
            yield home
        finally:
            launcher.stop(home)


def write_forever() -> None:
    """Fill the disk holding the pool's state folder with a file (a job's output to its log
    stops short of the disk's last tenth: ``local/logcap.py``)."""
    import os

    with open(os.path.join(os.environ["DLSCHED_HOME"], "spew"), "wb") as f:
        while True:
            f.write(b"x" * 65536)
            f.flush()


def answer() -> int:
    return 42


def empty_journal(s: Scheduler) -> None:
    """Move the ledger's write-ahead log into the ledger and cut it to nothing, so that the
    next write needs new disk space (a long-lived pool agent's log has room left in it)."""
    s.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def fill_past_the_reserve(s: Scheduler, home: Path) -> None:
    """A full disk with the reserve spent: the journal emptied, the disk filled, then the
    reserve's space filled too (the pool agent puts the reserve back while there is room
    for three of it, so it is taken away only once the disk is full)."""
    empty_journal(s)
    fill(home / "ballast")
    (home / RESERVE_NAME).unlink(missing_ok=True)
    fill(home / "ballast-2")


def fill(path: Path) -> None:
    """Write zeros into ``path`` until the disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * MiB)
                f.flush()
        except OSError:
            pass


def test_the_job_that_fills_the_disk_fails_saying_so_and_the_queue_goes_on(small_home, caplog):
    with caplog.at_level(logging.WARNING), Scheduler(small_home, lease_ttl=3.0) as s:
        assert (small_home / RESERVE_NAME).stat().st_size == RESERVE_BYTES
        spewer = s.submit(write_forever)
        spewer.wait(timeout=120)
        info = s.info(spewer.id)
        assert info.state == "failed"
        assert "no space left on device" in info.reason.lower(), info.reason
        # the reserve let the ledger record that; a job that needs no disk still runs
        assert not (small_home / RESERVE_NAME).exists()
        assert s.submit(answer).result(timeout=60) == 42
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], "no tracebacks from the scheduler loop on a full disk"


def test_submitting_to_a_full_disk_is_a_clear_error_and_writes_nothing(small_home):
    with Scheduler(small_home, loop=False) as s:
        before = s.store.count_jobs()
        fill_past_the_reserve(s, small_home)
        big = b"x" * (2 * MiB)  # more than the ledger's journal holds already
        with pytest.raises(LedgerUnavailable, match="the disk is full") as caught:
            s.submit(len, big)
        assert "Free some space" in str(caught.value)
        assert s.store.count_jobs() == before

        for ballast in small_home.glob("ballast*"):
            ballast.unlink()
        s.store.reserve.refill()
        assert (small_home / RESERVE_NAME).exists(), "the reserve comes back with the space"
        assert s.submit(len, big).id


def test_the_cli_says_in_one_line_that_the_disk_is_full(small_home):
    with Scheduler(small_home, loop=False) as s:
        fill_past_the_reserve(s, small_home)
    dlsched = str(Path(sys.executable).with_name("dlsched"))
    long_argv = ["python3", "-c", "pass", *(["x" * 1000] * 1200)]
    done = subprocess.run(
        [dlsched, "submit", "--", *long_argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "disk is full" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

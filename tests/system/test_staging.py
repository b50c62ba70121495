"""Data staged while a job waits: real files, real stagers and supervisors, a real ledger.

A job declaring ``stage_in`` starts only once its inputs are in the cache, and
then reads them through ``dls.data`` and ``DLSCHED_DATA_<NAME>``; the cache is
shared, evicts the least recently used entry no job uses, notices a changed
source, and a source that cannot be staged fails the job before it holds a GPU.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import small_disk, wait_for

import jupyter_dlsched as dls
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local import launcher
from jupyter_dlsched.vocab.errors import SpecError

MiB = 2**20
DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def make_folder(path: Path, files: int, size: int, seed: bytes = b"") -> Path:
    """A folder of ``files`` files of ``size`` bytes (one in a subfolder), distinct content."""
    (path / "part").mkdir(parents=True, exist_ok=True)
    block = hashlib.sha256(seed + path.name.encode()).digest() * (MiB // 32)
    for i in range(files):
        target = path / ("part" if i == 0 else "") / f"shard-{i:03d}.bin"
        with open(target, "wb") as f:
            f.write(i.to_bytes(8, "little"))
            left = size - 8
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)
    return path


def folder_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def read_input(name: str) -> dict[str, Any]:
    """Runs in the job: what ``dls.data`` and the environment say, and the data's digest."""
    path = dls.data(name)
    return {
        "path": str(path),
        "env": os.environ.get(f"DLSCHED_DATA_{name.upper()}"),
        "digest": folder_digest(path)
        if path.is_dir()
        else hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def hold_until(flag: str) -> str:
    """Runs in the job: keep its resources until the test creates ``flag``."""
    while not os.path.exists(flag):
        time.sleep(0.05)
    return "released"


def reasons(sched: Scheduler, job_id: str) -> list[str]:
    return [e["reason"] for e in sched.store.events(job_id)]


def test_job_is_staged_while_a_blocker_runs_and_starts_in_the_tick_after_it(
    sched: Scheduler, tmp_path: Path
) -> None:
    source = make_folder(tmp_path / "imagenet", files=10, size=20 * MiB)  # 200 MiB
    # a bounded read rate keeps the copy going long enough to watch its progress
    sched.configure_cache(max_rate="200MB")
    flag = tmp_path / "release"
    blocker = sched.submit(hold_until, str(flag), gpus=2, name="blocker")
    wait_for(lambda: blocker.state == "running")
    job = sched.submit(read_input, "train", gpus=1, stage_in={"train": str(source)})

    seen: set[str] = set()

    def staged() -> bool:
        info = job.info()
        if info.waiting:
            seen.add(info.waiting)
        return any("train staged" in r for r in reasons(sched, job.id))

    wait_for(staged, timeout=60, step=0.02)
    assert job.state == "queued"
    assert any(re.fullmatch(r"staging data \d+ %, [\d.]+ [kMG]B/s", w) for w in seen), seen
    assert sched.cache_info()["in_use"] == 1  # the waiting job holds its entry

    flag.touch()
    result = job.result(timeout=60)
    assert blocker.result(timeout=10) == "released"

    events = sched.store.events()
    blocker_end = next(
        e["seq"] for e in events if e["job_id"] == blocker.id and e["to_state"] == "succeeded"
    )
    staged_at = next(e["seq"] for e in events if e["job_id"] == job.id and "staged" in e["reason"])
    starts_after = [e for e in events if e["seq"] > blocker_end and e["to_state"] == "running"]
    assert staged_at < blocker_end
    assert starts_after[0]["job_id"] == job.id  # the first start once the GPUs were free

    info = sched.cache_info()
    assert Path(result["path"]).is_relative_to(info["folder"])
    assert result["env"] == result["path"]
    assert Path(result["path"]).name == "imagenet"
    assert result["digest"] == folder_digest(source)
    assert info["entries"] == 1 and info["bytes"] == 10 * 20 * MiB and info["in_use"] == 0


def test_a_second_job_with_the_same_input_hits_the_cache(sched: Scheduler, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "ds", files=3, size=MiB)
    first = sched.submit(read_input, "ds", stage_in={"ds": str(source)}).result(timeout=60)
    second_job = sched.submit(read_input, "ds", stage_in={"ds": source})
    second = second_job.result(timeout=60)
    assert second["path"] == first["path"]
    assert any("ds found in the cache" in r for r in reasons(sched, second_job.id))
    info = sched.cache_info()
    assert (info["entries"], info["hits"], info["misses"]) == (1, 1, 1)
    assert info["items"][0]["hits"] == 1


def test_the_cap_evicts_the_least_recently_used_entry_no_job_is_using(
    sched: Scheduler, tmp_path: Path
) -> None:
    sources = {n: make_folder(tmp_path / n, files=2, size=5 * MiB) for n in "abcd"}  # 10 MiB each
    sched.configure_cache(max_size=25 * MiB)  # room for two

    def paths() -> set[str]:
        return {Path(i["source"]).name for i in sched.cache_info()["items"]}

    flag = tmp_path / "release-a"
    holder = sched.submit(hold_until, str(flag), stage_in={"x": str(sources["a"])})
    wait_for(lambda: holder.state == "running")
    sched.submit(read_input, "x", stage_in={"x": str(sources["b"])}).result(timeout=60)
    assert paths() == {"a", "b"}
    # a is the least recently used, but a running job uses it: b goes
    sched.submit(read_input, "x", stage_in={"x": str(sources["c"])}).result(timeout=60)
    assert paths() == {"a", "c"}
    flag.touch()
    holder.result(timeout=30)
    sched.submit(read_input, "x", stage_in={"x": str(sources["d"])}).result(timeout=60)
    assert paths() == {"c", "d"}
    info = sched.cache_info()
    assert info["evictions"] == 2 and info["bytes"] <= 25 * MiB
    on_disk = {p.name for p in Path(info["folder"]).iterdir()}
    assert on_disk == {Path(i["path"]).parent.name for i in info["items"]}  # nothing left over


def test_a_source_that_changed_is_staged_again(sched: Scheduler, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "ds", files=2, size=MiB)
    before = sched.submit(read_input, "ds", stage_in={"ds": str(source)}).result(timeout=60)
    (source / "shard-001.bin").write_bytes(b"new content")
    job = sched.submit(read_input, "ds", stage_in={"ds": str(source)})
    after = job.result(timeout=60)
    assert after["path"] != before["path"]
    assert after["digest"] == folder_digest(source) != before["digest"]
    assert any("ds staged" in r for r in reasons(sched, job.id))
    assert sched.cache_info()["misses"] == 2


def test_a_url_source_is_read_through_fsspec(sched: Scheduler, tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    source = make_folder(tmp_path / "remote", files=2, size=MiB)
    result = sched.submit(read_input, "ds", stage_in={"ds": source.as_uri()}).result(timeout=60)
    assert result["digest"] == folder_digest(source)
    assert sched.cache_info()["items"][0]["source"] == source.as_uri()


def test_a_missing_source_fails_the_job_before_it_takes_a_gpu(
    sched: Scheduler, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-folder"
    job = sched.submit(read_input, "train", gpus=1, stage_in={"train": str(missing)})
    with pytest.raises(dls.JobFailed):
        job.result(timeout=60)
    info = job.info()
    assert info.reason == f"stage-in 'train': {missing} does not exist"
    assert info.started is None and info.placement is None
    assert "running" not in [e["to_state"] for e in sched.store.events(job.id)]


def test_a_killed_stager_is_replaced_and_its_partial_copy_removed(
    sched: Scheduler, tmp_path: Path
) -> None:
    source = make_folder(tmp_path / "ds", files=2, size=8 * MiB)
    sched.configure_cache(max_rate="4MB")  # four seconds of copying
    job = sched.submit(read_input, "ds", stage_in={"ds": str(source)})

    def stager() -> Any:
        rows = sched.store.cache.active_stagings()
        return rows[0] if rows and rows[0]["stager_pid"] and rows[0]["done_bytes"] else None

    first = wait_for(stager)
    os.kill(first["stager_pid"], signal.SIGKILL)
    sched.configure_cache(max_rate="1GB")
    result = job.result(timeout=60)
    assert result["digest"] == folder_digest(source)
    assert sched.store.cache.staging(first["source_id"])["attempt"] == 2
    cache = Path(sched.cache_info()["folder"])
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


def test_inputs_are_checked_when_submitted(
    sched: Scheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SpecError, match="input name"):
        sched.submit(print, stage_in={"1st": "/data"})
    with pytest.raises(SpecError, match="differ in more than case"):
        sched.submit(print, stage_in={"train": "/a", "TRAIN": "/b"})
    with pytest.raises(SpecError, match="stage_in"):
        sched.submit(print, stage_in=["/data"])
    monkeypatch.chdir(tmp_path)
    job = sched.submit(hold_until, "/", stage_in={"ds": "relative/data"})
    assert job.info().stage_in == {"ds": str(tmp_path / "relative" / "data")}
    sched.cancel(job.id)


def test_data_outside_a_job_says_how_to_declare_it() -> None:
    with pytest.raises(dls.DataNotStaged, match=r"stage_in=\{'train': PATH\}"):
        dls.data("train")


@pytest.fixture
def small_cache(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs to hold the cache."""
    with small_disk(tmp_path / "cachefs", "8m") as mount:
        yield mount


def test_a_full_disk_fails_the_job_and_frees_the_partial_copy(
    sched: Scheduler, tmp_path: Path, small_cache: Path
) -> None:
    source = make_folder(tmp_path / "big", files=3, size=4 * MiB)  # 12 MiB into 8 MiB
    sched.configure_cache(folder=small_cache, max_size="1GiB")
    job = sched.submit(read_input, "big", gpus=1, stage_in={"big": str(source)})
    with pytest.raises(dls.JobFailed):
        job.result(timeout=60)
    reason = job.info().reason
    assert reason.startswith("stage-in 'big': no space left on device in the cache folder"), reason
    assert job.info().started is None
    wait_for(lambda: not any(small_cache.iterdir()), timeout=10)
    used = os.statvfs(small_cache)
    assert used.f_blocks - used.f_bfree < 64  # the partial copy's blocks are free again
    assert sched.cache_info()["entries"] == 0
    # the queue goes on: a job that fits is staged into the same cache
    fits = make_folder(tmp_path / "small", files=1, size=MiB)
    assert sched.submit(read_input, "s", stage_in={"s": str(fits)}).result(timeout=60)["digest"]


def test_the_cli_flag_stages_data_for_a_command(home: Path, tmp_path: Path) -> None:
    source = make_folder(tmp_path / "ds", files=2, size=MiB)
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    out = subprocess.run(
        [
            DLSCHED,
            "submit",
            "--stage-in",
            f"train={source}",
            "--wait",
            "--",
            "sh",
            "-c",
            'ls -R "$DLSCHED_DATA_TRAIN"',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "shard-000.bin" in out.stdout and "shard-001.bin" in out.stdout
    bad = subprocess.run(
        [DLSCHED, "submit", "--stage-in", "train", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "expected NAME=PATH" in bad.stderr
    launcher.stop(home)


def test_a_ledger_from_before_staging_opens_and_its_jobs_have_no_inputs(tmp_path: Path) -> None:
    import sqlite3

    from jupyter_dlsched.store import Store
    from jupyter_dlsched.vocab.migrations import MIGRATIONS

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = sqlite3.connect(home / "ledger.sqlite")
    for script in MIGRATIONS[:2]:
        db.executescript(script)
    db.execute("INSERT INTO meta VALUES('schema_version', '2')")
    db.execute(
        "INSERT INTO jobs(id, name, kind, owner, uid, state, priority, gpus, cpus, mem, "
        "submitted) VALUES('oldjob22', 'old', 'command', 'ann', 0, 'queued', 50, 1, 1, 0, 1)"
    )
    db.commit()
    db.close()
    (home / "ledger.sqlite").chmod(0o600)
    store = Store(home)
    assert store.get("oldjob22").stage_in == {}
    assert store.job_data_paths("oldjob22") == {}
    assert store.cache.waiting_inputs(store.db) == []

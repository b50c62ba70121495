"""The SLURM backend against a real single-node SLURM (two pretend GPUs, no accounting).

The cluster (munged, slurmctld, slurmd, all in the foreground) is started once for
the module with everything in one temporary folder, and stopped after. It needs
root and Debian's ``slurmctld slurmd slurm-client munge`` packages (CI installs
them); otherwise the module is skipped.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from slurm_cluster import SKIP_WITHOUT_SLURM, running_cluster, tool, until

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.store import TERMINAL
from jupyter_dlsched.vocab.errors import JobTimeout, RemoteTraceback, SpecError

pytestmark = SKIP_WITHOUT_SLURM
pytest.importorskip("submitit")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimpleNamespace]:
    with running_cluster() as started:
        yield started


@pytest.fixture
def sched(
    cluster: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Scheduler]:
    monkeypatch.setenv("DLSCHED_HOME", str(tmp_path / "dlsched"))
    monkeypatch.delenv("DLSCHED_SIMULATE_GPUS", raising=False)
    monkeypatch.setenv("DLSCHED_BACKEND", "slurm")
    with Scheduler(home=tmp_path / "dlsched", poll=0.5) as s:
        yield s
        for job in s.jobs(state=["queued", "running", "preempted"]):
            s.cancel(job.id)
        until(lambda: all(j.state in TERMINAL for j in s.jobs()), timeout=30)


def slurm_id(s: Scheduler, job_id: str) -> str:
    import json

    return str(json.loads((s.store.spool(job_id) / "slurm.json").read_text())["slurm_id"])


def scontrol(job: str) -> str:
    return tool("scontrol", "show", "job", job)


# -- what runs inside the jobs (found through the job's sys.path) ------------------------------


def double(x: int) -> int:
    print(f"doubling {x}", flush=True)
    return 2 * x


def visible_gpus() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def rank_info() -> dict[str, str]:
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
    return {k: os.environ[k] for k in keys}


def fail_loudly() -> None:
    raise ValueError("the learning rate is negative")


def wait_for(path: str, value: Any = None) -> Any:
    print("waiting", flush=True)
    deadline = time.time() + 60
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)
    return value


# -- the tests ---------------------------------------------------------------------------------


def test_function_on_one_pretend_gpu_returns_its_result_output_and_node(
    sched: Scheduler,
) -> None:
    h = sched.submit(double, 21, gpus=1)
    assert h.result(timeout=60) == 42
    info = h.info()
    assert (info.state, info.backend, info.host, info.exit_code) == (
        "succeeded",
        "slurm",
        "localhost",
        0,
    )
    assert len(info.devices) == 1
    assert info.submitted <= info.started <= info.finished
    logs = h.logs()
    assert "doubling 21" in logs
    assert f"submitted to SLURM as job {slurm_id(sched, h.id)}" in logs
    assert "submitit INFO" not in logs
    gpu = sched.submit(visible_gpus, gpus=1).result(timeout=60)
    assert gpu in ("0", "1")


def mapped_sum(x: Any) -> tuple[float, list[str]]:
    """The sum of ``x``, and the data files this job process maps."""
    import numpy as np

    with open("/proc/self/maps") as maps:
        files = sorted({line.split()[-1] for line in maps if "/dlsched-" in line})
    return float(np.sum(x)), files


def test_a_big_array_reaches_a_slurm_job_as_a_file_in_the_state_folder(
    sched: Scheduler,
) -> None:
    """The nodes see the pool's state folder (docs/slurm.md): a job's big buffers are
    written there once and mapped by the job, not pickled into its payload."""
    import numpy as np

    x = np.arange(2**20, dtype=np.float64)  # 8 MiB
    h = sched.submit(mapped_sum, x, gpus=0)
    total, maps = h.result(timeout=120)
    assert total == float(x.sum())
    folder = sched.home / "buffers"
    [data] = [p for p in folder.glob("dlsched-*/*") if p.stat().st_size == x.nbytes]
    assert str(data) in maps, maps  # mapped from the file, not read into the job's memory
    assert data.stat().st_mode & 0o777 == 0o600
    payload = sched.home / "spool" / h.id / "payload.pkl"
    blob = payload.read_bytes() if payload.exists() else b""
    assert len(blob) < 2**20  # the payload names the file; the bytes are not in it


def test_schedule_cell_runs_as_a_slurm_job(sched: Scheduler) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    import jupyter_dlsched as dls
    from jupyter_dlsched.notebook.cells import CellResult

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_dlsched")
    dls.set_default_scheduler(sched)
    try:
        shell.user_ns["x"] = 20
        shell.run_cell_magic(
            "schedule", "--gpus 1 --out y", "import os\ny = x + 1\nprint('in cell job')\ny * 2"
        )
        handle = shell.user_ns["_job"]
        result = handle.result(timeout=60)
        assert isinstance(result, CellResult) and result.value == 42
        assert handle.info().backend == "slurm"
        assert "in cell job" in handle.logs()
    finally:
        dls.set_default_scheduler(None)
        for name in ("x", "y", "_job"):  # the shell is the process's, shared with other files
            shell.user_ns.pop(name, None)


def slurms_reason(handle: Any) -> str | None:
    """The job's waiting words once they carry SLURM's reason, beyond its first "None"."""
    waiting = handle.info().waiting or ""
    if waiting.startswith("SLURM: None"):
        assert "has not considered it yet" in waiting  # said, not a bare "None"
        return None
    return waiting if waiting.startswith("SLURM:") else None


def test_two_gpu_jobs_run_at_once_and_a_third_waits_with_slurms_reason(
    sched: Scheduler, tmp_path: Path
) -> None:
    release = str(tmp_path / "release")
    first, second, third = (sched.submit(wait_for, release, i, gpus=1) for i in range(3))
    until(lambda: first.state == "running" and second.state == "running")
    assert sorted(first.devices + second.devices) == [0, 1]
    # SLURM's reason, once its scheduler has looked at the job ("None" until then)
    waiting = until(lambda: slurms_reason(third))
    assert third.state == "queued"
    assert waiting.startswith("SLURM: Resources") or waiting.startswith("SLURM: Priority")
    assert "PENDING" in scontrol(slurm_id(sched, third.id))
    Path(release).touch()
    assert [h.result(timeout=60) for h in (first, second, third)] == [0, 1, 2]


def test_after_becomes_a_slurm_dependency(sched: Scheduler, tmp_path: Path) -> None:
    release = str(tmp_path / "release")
    first = sched.submit(wait_for, release, "first", cpus=1)
    then = sched.submit(double, 4, after=[first.id])
    until(lambda: (sched.store.spool(then.id) / "slurm.json").exists())
    assert f"afterok:{slurm_id(sched, first.id)}" in scontrol(slurm_id(sched, then.id))
    time.sleep(0.5)
    assert then.state == "queued"
    Path(release).touch()
    assert then.result(timeout=60) == 8
    assert first.info().finished <= then.info().started


def test_distributed_job_runs_one_task_per_gpu_with_torchruns_variables(
    sched: Scheduler,
) -> None:
    h = sched.submit(rank_info, gpus=2, distributed=True)
    assert h.result(timeout=60) == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
    }
    logs = h.logs()
    assert "rank 0 of 2" in logs and "rank 1 of 2" in logs
    assert sorted(h.devices) == [0, 1]


def test_dlsched_queue_lists_slurm_jobs(sched: Scheduler) -> None:
    h = sched.submit(double, 5)
    assert h.result(timeout=60) == 10
    cli = Path(sys.executable).with_name("dlsched")
    out = subprocess.run(
        [str(cli), "queue", "--all", "--json"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert h.id in out.stdout and '"slurm"' in out.stdout


def test_cancel_ends_running_and_queued_slurm_jobs(sched: Scheduler, tmp_path: Path) -> None:
    running = sched.submit(time.sleep, 60, gpus=2)
    queued = sched.submit(time.sleep, 60, gpus=2)
    until(lambda: running.state == "running")
    until(lambda: (sched.store.spool(queued.id) / "slurm.json").exists())
    assert running.cancel() and queued.cancel()
    for h in (running, queued):
        with pytest.raises(concurrent.futures.CancelledError):
            h.result(timeout=30)
        assert h.info().state == "cancelled"
        until(lambda h=h: "JobState=CANCELLED" in scontrol(slurm_id(sched, h.id)), timeout=30)


def test_time_limit_ends_the_job_as_timeout(sched: Scheduler) -> None:
    h = sched.submit(time.sleep, 60, time_limit="2s")
    with pytest.raises(JobTimeout):
        h.result(timeout=60)
    info = h.info()
    assert info.state == "timeout" and "time limit" in info.reason
    # SLURM keeps limits in whole minutes and enforces them coarsely: the monitor ends it
    assert "TimeLimit=00:01:00" in scontrol(slurm_id(sched, h.id))


def test_failing_function_raises_its_own_traceback(sched: Scheduler) -> None:
    h = sched.submit(fail_loudly)
    with pytest.raises(ValueError, match="learning rate is negative") as caught:
        h.result(timeout=60)
    assert isinstance(caught.value.__cause__, RemoteTraceback)
    assert "fail_loudly" in caught.value.__cause__.tb
    assert h.info().reason == "ValueError: the learning rate is negative"
    assert "Traceback" in h.logs()


def test_command_job_records_exit_code_output_and_gpu(sched: Scheduler) -> None:
    ok = sched.submit_command(["sh", "-c", 'echo "gpu=$CUDA_VISIBLE_DEVICES"'], gpus=1)
    bad = sched.submit_command(["sh", "-c", "echo failing; exit 3"])
    assert ok.result(timeout=60) == 0
    assert "gpu=0" in ok.logs() or "gpu=1" in ok.logs()
    with pytest.raises(Exception, match="exit code 3"):
        bad.result(timeout=60)
    assert bad.info().exit_code == 3
    assert "failing" in bad.logs()


def test_pool_shows_the_partitions_nodes_and_gpus_as_a_slurm_cluster(sched: Scheduler) -> None:
    pool = sched.pool()
    data = pool.to_json()
    assert data["cluster"]["kind"] == "slurm"
    assert [(n["name"], n["gpus"], n["cpus"]) for n in data["cluster"]["nodes"]] == [
        ("localhost", 2, 4)
    ]
    assert [g.name for g in pool.gpus] == ["GPU 0 on localhost", "GPU 1 on localhost"]
    assert repr(pool).startswith("SLURM cluster")
    assert sched.status()["backend"] == "slurm"


def test_priority_becomes_nice_and_changes_reach_slurm(sched: Scheduler, tmp_path: Path) -> None:
    release = str(tmp_path / "release")
    blocker = sched.submit(wait_for, release, gpus=2)
    low = sched.submit(double, 1, gpus=2, priority="low")
    until(lambda: blocker.state == "running")
    until(lambda: (sched.store.spool(low.id) / "slurm.json").exists())
    assert "Nice=100" in scontrol(slurm_id(sched, low.id))
    sched.set_priority(low.id, "high")
    until(lambda: "Nice=0" in scontrol(slurm_id(sched, low.id)), timeout=30)
    Path(release).touch()
    assert low.result(timeout=60) == 2


def test_a_share_of_a_gpu_is_refused_without_shards(sched: Scheduler) -> None:
    before = len(sched.jobs())
    with pytest.raises(SpecError, match="offers no GPU shards"):
        sched.submit(double, 1, gpus=0.5)
    assert len(sched.jobs()) == before, "refused when submitted: nothing stored"
    with pytest.raises(SpecError, match="sbatch options"):
        Scheduler(home=sched.home, backend="slurm", extra="constraint=a100", loop=False)


def test_another_participant_takes_over_a_running_job(sched: Scheduler, tmp_path: Path) -> None:
    release = tmp_path / "release"
    h = sched.submit(wait_for, str(release), "taken over")
    until(lambda: h.state == "running")
    sched.close()
    with Scheduler(home=sched.home, backend="slurm", poll=0.5) as s:
        release.touch()
        assert s.get(h.id).result(timeout=60) == "taken over"
        assert s.get(h.id).info().attempts == 1


OTHER_USER_SCRIPT = """
import sys
from jupyter_dlsched.client.scheduler import Scheduler
with Scheduler(home=sys.argv[1], backend="slurm", poll=0.5) as s:
    h = s.submit_command(["sh", "-c", "echo ran as $(id -un)"])
    print(h.result(timeout=60), h.logs())
"""


def test_command_job_of_another_unix_user_runs_as_that_user(
    cluster: SimpleNamespace, other_user: Any, tmp_path: Path
) -> None:
    # the other user cannot run this virtual environment's interpreter (it lives in
    # root's home), so it runs Debian's with this package and its dependencies on the path
    site = next(p for p in sys.path if p.endswith("site-packages"))
    package = str(Path(__file__).resolve().parents[2])
    probe = other_user.run(
        "import sys; sys.path[:0] = sys.argv[1:]; import jupyter_dlsched.client.scheduler, submitit",
        package,
        site,
    )
    if probe.returncode != 0:
        pytest.skip(f"the system Python cannot import jupyter_dlsched: {probe.stderr[-200:]}")
    home = Path(tempfile.mkdtemp(prefix="dlsother", dir="/tmp"))
    os.chown(home, other_user.uid, other_user.gid)
    try:
        done = other_user.run(
            "import os, sys; sys.path[:0] = sys.argv[2:]; os.environ['SLURM_CONF'] = "
            f"{str(cluster.conf)!r}; sys.argv[1:] = sys.argv[1:2]\n" + OTHER_USER_SCRIPT,
            str(home / "dlsched"),
            package,
            site,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"ran as {other_user.name}" in done.stdout
        assert done.stdout.startswith("0 ")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_begin_becomes_slurms_begin(sched: Scheduler) -> None:
    h = sched.submit(time.time, begin="now+5s")
    ran_at = h.result(timeout=120)
    begin = h.info().begin
    assert begin is not None and ran_at >= begin
    # SLURM held it: its job became eligible at the begin, not at the submission
    eligible = datetime.fromtimestamp(math.ceil(begin)).strftime("%Y-%m-%dT%H:%M:%S")
    assert f"EligibleTime={eligible}" in scontrol(slurm_id(sched, h.id))


def test_a_job_slurm_refuses_fails_with_slurms_words_and_no_retry(
    cluster: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a home of its own: a scheduler of the same home without ``extra`` (the fixture's) could
    # submit the job first, and SLURM would accept it
    monkeypatch.delenv("DLSCHED_SIMULATE_GPUS", raising=False)
    monkeypatch.setenv("DLSCHED_BACKEND", "slurm")
    home = tmp_path / "refused"
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    with Scheduler(home=home, backend="slurm", extra="--constraint=nosuch", poll=0.5) as s:
        h = s.submit_command(["true"], retries=2)
        until(lambda: h.state in TERMINAL, timeout=60)
        info = h.info()
        assert info.state == "failed"
        assert info.reason.startswith("SLURM did not accept the job")
        # sbatch's own words, its name said once
        assert info.reason.endswith(
            "sbatch: error: Batch job submission failed: Invalid feature specification"
        )
        assert (info.attempts, info.supervisor_pid, info.lease_expires) == (0, None, None)

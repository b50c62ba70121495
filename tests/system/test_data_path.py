"""Notebook-sized data: big buffers travel in files beside the pickle, mapped by the job,
never through the agent's socket or the ledger (``store/buffers.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import small_disk, stop_agent, wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.store import buffers
from jupyter_dlsched.vocab.errors import DlschedError, SpecError
from jupyter_dlsched.vocab.history import usage_words

MIB = 2**20


@pytest.fixture
def pool(home, tmp_path, monkeypatch):
    """A pool of one's own, its buffer folder in a folder of the test's (not /dev/shm)."""
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    with Scheduler(home) as s:
        yield s


def mapped_files() -> list[str]:
    """The data files this process maps (run inside a job)."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/dlsched-" in line})


def data_files(s: Scheduler) -> list[Path]:
    folder = buffers.buffer_folder(s.home)
    return (
        sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []
    )


def ledger_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("ledger.sqlite*"))


def test_a_big_array_reaches_its_job_mapped_from_one_file_and_the_ledger_stays_small(pool):
    x = np.arange(16 * MIB // 8, dtype=np.float64)

    def inspect(a):
        return float(a.sum()), mapped_files(), a.flags.writeable

    total, maps, writeable = pool.submit(inspect, x, cpus=0.25).result(timeout=120)
    assert total == float(x.sum())
    [file] = data_files(pool)
    assert str(file) in maps, maps  # mapped, not read into the job's own memory
    assert file.stat().st_size == x.nbytes and file.stat().st_mode & 0o777 == 0o600
    assert writeable  # copy-on-write: the job may write into its argument
    assert ledger_bytes(pool.home) < 2 * MIB, "the array went into the ledger"


def test_a_job_that_writes_into_its_argument_changes_nobody_elses_copy(pool):
    x = np.ones(4 * MIB // 8)

    def scribble(a):
        a[:] = 7
        return float(a.sum())

    assert pool.submit(scribble, x, cpus=0.25).result(timeout=120) == 7 * x.size
    # the next job maps the same file (the same bytes, one file): it sees the original
    assert pool.submit(lambda a: float(a.sum()), x, cpus=0.25).result(timeout=120) == x.size
    assert len(data_files(pool)) == 1
    assert float(x.sum()) == x.size


def result_files(s: Scheduler) -> list[str]:
    """The result buffers in the user's buffer folder (``store/results.py``)."""
    return [p.name for p in data_files(s) if p.name.startswith("result-")]


def test_a_big_result_is_written_into_memory_then_settled_beside_its_pickle(pool):
    """A result's big buffers are written into the user's buffer folder (memory), named by
    the job and attempt, not hashed; once the job has ended they move into its spool
    folder, where the result is kept, and read the same from there."""

    def make(n):
        return np.full(n, 3.0)

    h = pool.submit(make, 8 * MIB // 8, cpus=0.25)
    result = h.result(timeout=120)
    assert result.shape == (8 * MIB // 8,) and float(result[-1]) == 3.0
    spool = pool.store.spool(h.id)
    pickled = (spool / "result.pkl").read_bytes()
    assert len(pickled) < 64 * 1024
    # written into memory (the user's buffer folder), not the spool folder
    assert buffers.manifest(pickled) == (
        buffers.buffer_folder(pool.home),
        [(f"result-{h.id}-1.0", 8 * MIB)],
    )
    # settled: on disk beside its pickle, nothing of it left in memory
    wait_for(lambda: result_files(pool) == [] and (spool / "result.0").exists(), timeout=30,
             what=lambda: (result_files(pool), sorted(os.listdir(spool))))  # fmt: skip
    assert (spool / "result.0").stat().st_size == 8 * MIB
    assert float(result[-1]) == 3.0  # the array mapped before the move is whole
    again = Scheduler(pool.home).get(h.id).result(timeout=30)  # another process, later
    assert again.shape == (8 * MIB // 8,) and float(again.sum()) == 3.0 * again.size
    assert pool.info(h.id).result_bytes == 8 * MIB + len(pickled)


def test_a_result_that_does_not_fit_in_memory_is_written_beside_its_pickle(
    home, tmp_path, monkeypatch
):
    with small_disk(tmp_path / "small", "4m") as small:
        monkeypatch.setenv(buffers.BUFFERS_ENV, str(small))
        with Scheduler(home) as s:
            h = s.submit(lambda n: np.full(n, 2.0), 8 * MIB // 8, cpus=0.25)
            assert float(h.result(timeout=120).sum()) == 2.0 * 8 * MIB // 8  # not failed
            pickled = (s.store.spool(h.id) / "result.pkl").read_bytes()
            assert buffers.manifest(pickled) == (s.store.spool(h.id), [("result.0", 8 * MIB)])
            assert result_files(s) == []  # nothing half written left in the small folder


def test_a_job_killed_while_writing_its_result_leaves_no_file_in_memory(pool):
    def dies_half_way(n):
        from jupyter_dlsched.store import buffers as inside

        real = inside.write_buffer

        def write_then_die(folder, raw, name=None):
            real(folder, raw, name)  # the first buffer is written whole, then kill -9
            os.kill(os.getpid(), 9)

        inside.write_buffer = write_then_die
        return np.ones(n), np.ones(n)

    h = pool.submit(dies_half_way, 2 * MIB // 8, cpus=0.25)
    with pytest.raises(DlschedError):
        h.result(timeout=120)
    wait_for(lambda: result_files(pool) == [], timeout=30, what=lambda: result_files(pool))


def test_a_job_killed_with_its_supervisor_while_writing_its_result_leaves_no_file(
    home, tmp_path, monkeypatch
):
    """kill -9 of the job and of its supervisor half way through the result: nobody is
    left to settle or delete it; the run is found lost, and its files go with that."""
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))

    def dies_half_way(n):
        from jupyter_dlsched.store import buffers as inside

        real = inside.write_buffer

        def write_then_die(folder, raw, name=None):
            real(folder, raw, name)
            os.kill(os.getppid(), 9)  # the job's supervisor
            os.kill(os.getpid(), 9)

        inside.write_buffer = write_then_die
        return np.ones(n), np.ones(n)

    with Scheduler(home, lease_ttl=3.0, grace=1.0) as s:
        h = s.submit(dies_half_way, 2 * MIB // 8, cpus=0.25)
        wait_for(lambda: result_files(s), timeout=60)
        wait_for(lambda: s.info(h.id).state not in ("queued", "running"), timeout=60)
        wait_for(lambda: result_files(s) == [], timeout=30, what=lambda: result_files(s))


def test_a_new_agent_settles_a_kept_results_files_and_deletes_the_others(
    home, tmp_path, monkeypatch
):
    """What a supervisor killed before it settled a result leaves in memory: an agent that
    starts moves a kept result's files into its spool folder (still read the same) and
    deletes those of no kept result (a failed job's, an attempt that is not its job's)."""
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    with Scheduler(home) as s:
        kept = s.submit(lambda n: (np.full(n, 5.0), np.full(n, 6.0)), 2 * MIB // 8, cpus=0.25)
        kept.result(timeout=120)
        failed = s.submit(lambda: 1 / 0, cpus=0.25)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=120)
        spool = s.store.spool(kept.id)
        wait_for(lambda: (spool / "result.1").exists() and result_files(s) == [], timeout=30)
    stop_agent(home)
    folder = buffers.buffer_folder(home)
    # as if its supervisor had been killed before it settled the result
    for n in (0, 1):
        os.replace(spool / f"result.{n}", folder / f"result-{kept.id}-1.{n}")
    for name in (f"result-{failed.id}-1.0", f"result-{kept.id}-2.0"):
        (folder / name).write_bytes(b"\0" * MIB)
    for name in os.listdir(folder):
        os.utime(folder / name, (1, 1))
    with Scheduler(home) as s:  # a new agent starts
        s.submit(int, 1, cpus=0.25).result(timeout=120)
        assert result_files(s) == []
        assert [(spool / f"result.{n}").stat().st_size for n in (0, 1)] == [2 * MIB] * 2
        five, six = s.get(kept.id).result(timeout=30)
        assert (float(five.sum()), float(six.sum())) == (5.0 * five.size, 6.0 * six.size)


def test_a_torch_model_arrives_with_its_weights_tied_and_mapped(pool):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    model[1].weight = model[0].weight  # tied: one storage

    def check(m):
        tied = m[0].weight is m[1].weight
        return tied, m[0].weight.detach(), type(m[0].weight).__name__, mapped_files()

    tied, total, kind, maps = pool.submit(check, model, cpus=0.25).result(timeout=120)
    assert tied and kind == "Parameter"
    assert torch.equal(total, model[0].weight.detach())  # and it came back as it went
    arguments = [f for f in data_files(pool) if not f.name.startswith("result-")]
    assert [str(f) for f in arguments] == [
        m for m in maps if m.startswith(str(buffers.buffer_folder(pool.home)))
    ]


def test_a_tensor_on_a_device_is_refused_at_submit_naming_it_and_saying_cpu(pool):
    torch = pytest.importorskip("torch")
    on_device = torch.zeros(2 * MIB, device="meta")  # a device other than the CPU
    with pytest.raises(SpecError, match=r"args\[0\].*\.cpu\(\)"):
        pool.submit(len, on_device, cpus=0.25)
    assert data_files(pool) == []


def test_a_sweep_sharing_one_array_writes_it_once(pool):
    x = np.random.default_rng(0).random(4 * MIB // 8)
    handles = pool.map(
        lambda item: float(item[0].sum()) * item[1], [(x, k) for k in range(4)], cpus=0.25
    )
    assert [h.result(timeout=120) for h in handles] == [float(x.sum()) * k for k in range(4)]
    assert len(data_files(pool)) == 1


def test_an_array_submitted_again_is_not_written_again(pool):
    """Its file (kept for a ``requeue``) is named by the same digest: the next submission
    hashes the array and uses that file as it is."""
    x = np.random.default_rng(1).random(3 * MIB // 8)
    assert pool.submit(lambda a: float(a.sum()), x, cpus=0.25).result(timeout=120) == x.sum()
    [file] = data_files(pool)
    first = file.stat()
    assert pool.submit(lambda a: float(a[-1]), x, cpus=0.25).result(timeout=120) == x[-1]
    assert data_files(pool) == [file]
    assert file.stat().st_ino == first.st_ino  # the same file, not a copy renamed over it
    x[0] += 1  # other bytes: another file
    assert pool.submit(lambda a: float(a[0]), x, cpus=0.25).result(timeout=120) == x[0]
    assert len(data_files(pool)) == 2


def test_a_file_under_a_digest_that_is_not_whole_is_written_again(tmp_path):
    folder = tmp_path / "dlsched-0-pool"
    folder.mkdir(mode=0o700)
    data = memoryview(np.arange(MIB, dtype=np.uint8)).cast("B")
    name = buffers.write_buffer(folder, data)
    (folder / name).write_bytes(b"cut short")
    assert buffers.write_buffer(folder, data) == name
    assert (folder / name).read_bytes() == data.tobytes()


def test_a_files_lifetime_ends_with_its_jobs_and_a_new_agent_removes_leftovers(
    home, tmp_path, monkeypatch
):
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0s")
    with Scheduler(home) as s:
        x = np.ones(2 * MIB)
        h = s.submit(lambda a: a.size, x, cpus=0.25)
        assert h.result(timeout=120) == x.size
        # the next job's end deletes what no unfinished job names any more
        s.submit(int, 1, cpus=0.25).result(timeout=120)
        wait_for(lambda: data_files(s) == [], timeout=30, what=lambda: data_files(s))
        # a submission killed after writing its data, before the agent recorded it
        folder = buffers.buffer_folder(home)
        left = buffers.write_buffer(folder, memoryview(np.zeros(MIB)).cast("B"))
        os.utime(folder / left, (1, 1))
        assert data_files(s) == [folder / left]
    stop_agent(home)
    with Scheduler(home) as s:
        s.submit(int, 1, cpus=0.25).result(timeout=120)
        assert data_files(s) == []


def test_data_larger_than_the_free_space_is_refused_before_anything_is_written(
    home, tmp_path, monkeypatch
):
    with small_disk(tmp_path / "small", "4m") as small:
        monkeypatch.setenv(buffers.BUFFERS_ENV, str(small))
        with Scheduler(home) as s:
            with pytest.raises(DlschedError, match=r"does not fit in .*free.*DLSCHED_BUFFERS"):
                s.submit(len, np.zeros(8 * MIB // 8), cpus=0.25)
            folder = buffers.buffer_folder(home)
            assert not folder.exists() or list(folder.iterdir()) == []
            assert s.jobs() == []


def test_ended_jobs_kept_data_gives_way_to_a_new_submission(home, tmp_path, monkeypatch):
    """The data of ended jobs is kept a day for a requeue; when a new submission does not
    fit beside it, the kept data goes first (it used to be refused with "does not fit")."""
    with small_disk(tmp_path / "small", "24m") as small:
        monkeypatch.setenv(buffers.BUFFERS_ENV, str(small))
        with Scheduler(home) as s:
            first = s.submit(len, np.full(14 * MIB // 8, 1.0), cpus=0.25)
            assert first.result(timeout=120) == 14 * MIB // 8
            assert len(data_files(s)) == 1  # kept for a requeue
            second = s.submit(len, np.full(14 * MIB // 8, 2.0), cpus=0.25)
            assert second.result(timeout=120) == 14 * MIB // 8
            # the first job's data went to make room; it cannot run again, and says why
            with pytest.raises(DlschedError):
                s.requeue(first.id)


def test_a_ledger_names_only_data_files_of_its_submitters_folder(home, tmp_path, monkeypatch):
    """A payload whose header names a file elsewhere (which the ledger would delete when
    its job ends) is refused at submit."""
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    data = buffers.dumps({"fn": len, "args": (np.zeros(MIB),), "kwargs": {}}, elsewhere)
    with Scheduler(home) as s:
        with pytest.raises(SpecError, match="payload.pkl"):
            s._insert("function", {"payload.pkl": data}, default_name="x", cpus=0.25)


def test_a_schedule_cell_reads_a_big_tensor_of_the_notebook(ip, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    ip.run_cell("import torch; big = torch.ones(4 * 2**20)")
    ip.run_cell_magic(
        "schedule", "--cpus 0.25 --wait --out s,back", "s = float(big.sum())\nback = big * 2"
    )
    assert ip.user_ns["s"] == 4 * 2**20
    back = ip.user_ns["back"]
    assert back.shape == (4 * 2**20,) and float(back[0]) == 2.0
    spool = ip.user_ns["_job"].info()
    assert spool.state == "succeeded"


def test_the_benchmark_script_runs_at_a_tiny_size(tmp_path, home):
    out = subprocess.run(
        [sys.executable, str(Path(__file__).parents[2] / "benchmarks" / "data.py"),
         "--sizes-mib", "4", "--repeat", "1", "--no-ray"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, buffers.BUFFERS_ENV: str(tmp_path / "buffers")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "numpy argument" in out.stdout and "memcpy" in out.stdout


def test_kill_9_of_a_submitting_kernel_and_of_the_agent_leaves_no_file_once_an_agent_started(
    home, tmp_path, monkeypatch
):
    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    with Scheduler(home) as s:
        agent_pid = s.status()["pool"]["agent_pid"]
    folder = buffers.buffer_folder(home)
    script = (
        "import numpy as np\n"
        "from jupyter_dlsched.client.scheduler import Scheduler\n"
        f"s = Scheduler({str(home)!r})\n"
        "x = np.random.default_rng(1).random(2**26)\n"  # 512 MiB: seconds to write
        "print('submitting', flush=True)\n"
        "s.submit(len, x, cpus=0.25)\n"
    )
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout is not None and kernel.stdout.readline().strip() == "submitting"
        wait_for(lambda: folder.is_dir() and any(folder.iterdir()), timeout=60)
    finally:
        kernel.kill()
        kernel.wait()
    os.kill(agent_pid, 9)
    assert any(folder.iterdir()), "the killed submission left a file (or part of one)"
    with Scheduler(home) as s:  # a new agent starts
        assert s.status()["pool"]["agent_pid"] != agent_pid
        wait_for(lambda: not any(folder.iterdir()), timeout=30, what=lambda: list(folder.iterdir()))


def test_history_and_the_job_view_show_a_jobs_input_and_result_bytes(pool):
    x = np.ones(3 * MIB // 8)
    h = pool.submit(lambda a: a * 2, x, cpus=0.25, name="doubler")
    assert h.result(timeout=120).nbytes == x.nbytes
    info = pool.info(h.id)
    assert 3 * MIB <= info.input_bytes < 3 * MIB + 64 * 1024  # the array and a small pickle
    assert 3 * MIB <= info.result_bytes < 3 * MIB + 64 * 1024
    usage = info.to_json()["usage"]
    assert (usage["input_bytes"], usage["result_bytes"]) == (info.input_bytes, info.result_bytes)
    assert "input 3.0 MiB · result 3.0 MiB" in usage_words(info)  # the widgets' job view

    dlsched = str(Path(sys.executable).with_name("dlsched"))
    shown = subprocess.run([dlsched, "history"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["INPUT", "RESULT"]
    assert row.split()[1] == "doubler" and row.split()[-4:] == ["3.0", "MiB", "3.0", "MiB"]
    data = json.loads(
        subprocess.run(
            [dlsched, "history", "--json"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    assert data["jobs"][0]["usage"]["result_bytes"] == info.result_bytes


def test_status_says_where_data_travels_and_how_full_that_place_is(home, tmp_path):
    env = {**os.environ, buffers.BUFFERS_ENV: str(tmp_path / "buffers")}
    dlsched = str(Path(sys.executable).with_name("dlsched"))
    try:
        out = subprocess.run(
            [dlsched, "status"], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        [line] = [x for x in out.stdout.splitlines() if x.startswith("data: ")]
        assert str(buffers.buffer_folder(home)) in line or str(tmp_path / "buffers") in line
        assert "free of" in line and "DLSCHED_BUFFERS" in line
    finally:
        stop_agent(home)


#: a kernel that submits 32 MiB arrays (new bytes each time) to jobs that hold them a minute
KERNEL = r"""
import os, sys, time
import numpy as np
from jupyter_dlsched.client.scheduler import Scheduler

def hold(a, release):
    while not os.path.exists(release):  # killed here; a run of the next agent ends at once
        time.sleep(0.1)
    return a.size

s = Scheduler(sys.argv[1], lease_ttl=3.0, grace=1.0)
x = np.ones(32 * 2**20 // 8)
i = 0
while True:
    i += 1
    x[0] = i
    s.submit(hold, x, sys.argv[2], cpus=0.25)
"""


def test_kill_9_of_the_agent_the_kernel_and_the_jobs_mid_submission_leaves_no_file(
    home, tmp_path, monkeypatch
):
    """A kernel submitting big arrays, the pool agent and every job process killed at once:
    once the next agent has started, no data file is left (the killed jobs' files go when
    their ends are recorded, a half-written or unrecorded one with the agent's sweep)."""
    import signal

    import psutil

    monkeypatch.setenv(buffers.BUFFERS_ENV, str(tmp_path / "buffers"))
    monkeypatch.setenv("DLSCHED_PAYLOAD_KEEP", "0s")
    with Scheduler(home, lease_ttl=3.0, grace=1.0) as s:
        agent = psutil.Process(int(s.link.hello["pid"]))  # type: ignore[union-attr]
        release = tmp_path / "release"
        kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(home), str(release)])
        try:
            wait_for(lambda: len(data_files(s)) >= 3 and len(s.jobs(state="running")) >= 2,
                     timeout=120, what=lambda: data_files(s))  # fmt: skip
        finally:
            tree = [agent, *agent.children(recursive=True)]
            kernel.send_signal(signal.SIGKILL)
            for process in tree:
                try:
                    process.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            kernel.wait()
        assert data_files(s)
    stop_agent(home)
    release.touch()
    with Scheduler(home, lease_ttl=3.0, grace=1.0) as s:
        wait_for(lambda: not s.jobs(state=["queued", "running"]) or None, timeout=120,
                 what=lambda: s.jobs(state=["queued", "running"]))  # fmt: skip
        folder = buffers.buffer_folder(home)
        wait_for(lambda: not folder.exists() or list(folder.iterdir()) == [], timeout=60,
                 what=lambda: list(folder.iterdir()))  # fmt: skip

"""The server extension's parts that need no server: log pieces, the sampler, error answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.machine.inventory import GpuInfo, GpuProcess, PoolInfo
from jupyter_dlsched.machine.sampling import Sampler, pool_rows
from jupyter_dlsched.server.handlers import ApiError, scheduler_errors
from jupyter_dlsched.server.logs import read_log
from jupyter_dlsched.server.state import ServerState
from jupyter_dlsched.store import Store
from jupyter_dlsched.vocab.errors import DlschedError, IllegalTransition, JobNotFound, SpecError


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    return path


def test_tail_returns_the_last_lines_and_where_to_continue(log_file: Path) -> None:
    chunk = read_log(log_file, tail=3)

    assert chunk["text"] == "line 97\nline 98\nline 99\n"
    assert chunk["next_offset"] == chunk["size"] == log_file.stat().st_size
    assert chunk["offset"] == chunk["size"] - len(chunk["text"])


def test_offset_reads_forward_and_an_offset_past_the_end_reads_nothing(log_file: Path) -> None:
    size = log_file.stat().st_size

    assert read_log(log_file, offset=0, max_bytes=7)["text"] == "line 0\n"
    assert read_log(log_file, offset=size - 8)["text"] == "line 99\n"
    past = read_log(log_file, offset=size + 100)
    assert past["text"] == "" and past["next_offset"] == size


def test_a_tail_within_max_bytes_drops_the_cut_first_line(log_file: Path) -> None:
    chunk = read_log(log_file, tail=1000, max_bytes=20)

    assert chunk["text"].startswith("line ")
    assert chunk["text"].endswith("line 99\n")
    assert len(chunk["text"]) <= 20


def test_a_multibyte_character_split_by_max_bytes_is_left_for_the_next_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    path.write_bytes("loss ↓ 0.3\n".encode())
    cut = len(b"loss ") + 1  # inside the three bytes of "↓"

    first = read_log(path, offset=0, max_bytes=cut)
    rest = read_log(path, offset=first["next_offset"])

    assert first["text"] == "loss "
    assert first["text"] + rest["text"] == "loss ↓ 0.3\n"


def test_a_missing_log_reads_as_empty(tmp_path: Path) -> None:
    assert read_log(tmp_path / "nothing", tail=10)["text"] == ""


def a_pool() -> PoolInfo:
    gpu = GpuInfo(
        index=0,
        uuid="SIM-0",
        name="NVIDIA H200",
        mem_total=16 << 30,
        mem_used=5 << 30,
        util=40.0,
        simulated=False,
        processes=[GpuProcess(pid=10, used_mem=4 << 30, job_id="abcd"), GpuProcess(11, 1 << 30)],
        jobs=["abcd"],
    )
    return PoolInfo(
        cpus=4,
        cpu_percent=12.5,
        mem_total=8 << 30,
        mem_used=2 << 30,
        mem_available=6 << 30,
        gpus=[gpu],
    )


def test_a_pool_reading_becomes_gpu_cpu_and_ram_rows_with_per_job_memory() -> None:
    rows = pool_rows(a_pool(), now=100.0)

    assert rows == [
        (
            100.0,
            "gpu:0",
            40.0,
            5 << 30,
            16 << 30,
            {"jobs": {"abcd": 4 << 30}, "allocated": ["abcd"]},
        ),
        (100.0, "cpu", 12.5, None, None, None),
        (100.0, "ram", None, 2 << 30, 8 << 30, None),
    ]


def test_the_sampler_keeps_only_the_retention_window(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    now = [1000.0]
    sampler = Sampler(store, a_pool, interval=1, retention=120, clock=lambda: now[0])

    for _ in range(10):
        sampler.sample_once()
        now[0] += 61  # one prune per minute at most

    # samples at 1000, 1061, ..., 1549; the last prune dropped everything before 1549 - 120
    assert sorted({row["time"] for row in store.usage.samples()}) == [1488.0, 1549.0]
    assert sampler.samples_taken == 10


def test_a_simulated_gpu_is_sampled_as_the_memory_allocated_and_marked_so() -> None:
    pool = a_pool()
    gpu = pool.gpus[0]
    gpu.simulated, gpu.util, gpu.processes = True, None, []
    (row,) = [r for r in pool_rows(pool, now=100.0) if r[1] == "gpu:0"]
    assert row[2] == 100.0 * 5 / 16, "the line of a simulated GPU is its allocated memory"
    assert row[5] == {"allocated": ["abcd"], "simulated": True}


def test_long_history_is_thinned_per_source_so_every_source_stays(home: Path) -> None:
    state = ServerState(Scheduler(home, loop=False), sample_interval=1, history_retention=86400)
    readings = [pool_rows(a_pool(), now=1000.0 + t) for t in range(1000)]
    state.store.usage.add_samples([row for reading in readings for row in reading])

    everything = state.samples(0, 5000, None, max_rows=300)
    gpus = state.samples(0, 5000, "gpu", max_rows=300)
    window = state.samples(1100, 1199, "cpu", max_rows=300)

    assert 250 <= len(everything) <= 300
    assert {r["source"] for r in everything} == {"gpu:0", "cpu", "ram"}
    assert {r["source"] for r in gpus} == {"gpu:0"} and len(gpus) == 250
    assert gpus[0]["data"] == {"jobs": {"abcd": 4 << 30}, "allocated": ["abcd"]}
    assert [r["time"] for r in window] == [1000.0 + t for t in range(100, 200)]
    state.scheduler.close()


@pytest.mark.parametrize(
    "error, status, words",
    [
        (JobNotFound("abcd1234"), 404, "abcd1234"),
        (IllegalTransition("succeeded -> running is not allowed"), 409, "succeeded -> running"),
        (SpecError("priority", 10**30, "a whole number"), 400, "priority="),
        (DlschedError("the pool is paused"), 400, "paused"),
        (OverflowError("Python int too large to convert to SQLite INTEGER"), 400, "too large"),
    ],
)
def test_what_the_scheduler_refuses_becomes_a_4xx_with_its_message(
    error: Exception, status: int, words: str
) -> None:
    with pytest.raises(ApiError) as caught, scheduler_errors():
        raise error

    assert caught.value.status_code == status
    assert words in caught.value.message


def test_a_bug_in_the_scheduler_is_not_passed_off_as_bad_input() -> None:
    with pytest.raises(ZeroDivisionError), scheduler_errors():
        raise ZeroDivisionError

"""``dlsched sim`` reads its trace once: pipes and process substitutions replay every row.

Run through the installed console script, as a user runs it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def dlsched() -> str:
    script = Path(sys.executable).with_name("dlsched")
    command = str(script) if script.exists() else shutil.which("dlsched")
    assert command, "the dlsched console script is not installed"
    return command


@pytest.fixture
def big_csv(tmp_path: Path) -> Path:
    # far more than one read buffer, so a second open of a pipe would miss rows
    path = tmp_path / "t.csv"
    rows = [f"{i * 10},{1 + i % 2},{5 + i % 90}" for i in range(3000)]
    path.write_text("submit_time,num_gpus,duration\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def big_philly(tmp_path: Path) -> Path:
    path = tmp_path / "philly.csv"
    rows = [
        f"2017-10-{1 + i // 1000:02d} {i % 24:02d}:{i % 60:02d}:00,{60 + i % 600},1,{60 + i % 600},c1"
        for i in range(3000)
    ]
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "\n".join(rows) + "\n")
    return path


def test_a_piped_plain_trace_replays_every_row(big_csv: Path) -> None:
    done = subprocess.run(
        [dlsched(), "sim", "/dev/stdin", "--gpus", "4", "--policy", "fifo", "--json"],
        input=big_csv.read_text(),  # through a pipe, which can be read only once
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == 3000


def test_a_piped_philly_trace_through_cat_replays_every_row(big_philly: Path) -> None:
    command = f"cat {shlex.quote(str(big_philly))} | {shlex.quote(dlsched())} sim /dev/stdin "
    command += "--gpus 8 --cluster c1 --policy fifo"
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3000 jobs on 8 GPUs")
    assert "Microsoft Philly traces" in done.stdout


@pytest.mark.parametrize("fixture", ["big_csv", "big_philly"])
def test_a_process_substitution_is_read_once(fixture: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(fixture)
    command = f"{shlex.quote(dlsched())} sim <(cat {shlex.quote(str(path))}) --gpus 8 --json"
    command += " --policy fifo"
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == 3000


def test_a_huge_duration_keeps_the_table_readable(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text("submit_time,num_gpus,duration\n0,1,1e300\n1,1,10\n")
    done = subprocess.run(
        [dlsched(), "sim", str(path), "--gpus", "1", "--policy", "fifo,srtf"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) < 160 for line in lines), lines
    fifo = next(line for line in lines if line.startswith("fifo"))
    assert "2.78e+296" in fifo  # 1e300 s in hours, three significant digits

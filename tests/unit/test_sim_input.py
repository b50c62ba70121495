"""Bad input to the trace simulator: every mistake a one-line answer, never a traceback or a hang.

The command line is run through the installed ``dlsched`` console script, as a user runs it.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from datetime import timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_dlsched.sim import (
    SimulationError,
    TraceError,
    TraceJob,
    load_csv,
    load_philly,
    load_trace,
    simulate,
)
from jupyter_dlsched.vocab.errors import DlschedError

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def dlsched_sim(*args: str) -> subprocess.CompletedProcess[str]:
    """``dlsched sim ARGS`` through the installed console script; a hang fails the test."""
    script = Path(sys.executable).with_name("dlsched")
    command = str(script) if script.exists() else shutil.which("dlsched")
    assert command, "the dlsched console script is not installed"
    return subprocess.run(
        [command, "sim", *args], capture_output=True, text=True, timeout=60, check=False
    )


def assert_usage_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2 and exactly one line on stderr, ``dlsched sim: ...``, saying what was wrong."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlsched sim: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("0,1,10\n0,2,5\n1,1,2\n")
    return path


# options


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("--gpus 0", "--gpus 0 is invalid: expected a whole number >= 1"),
        ("--gpus two", "--gpus 'two' is not a number"),
        ("--gpus 1e12", "--gpus 1000000000000 is more than the 100000 GPUs"),
        ("--gpus 2 --restart-overhead -1", "--restart-overhead -1 is invalid: expected seconds"),
        ("--gpus 2 --restart-overhead nan", "--restart-overhead nan is invalid"),
        ("--gpus 2 --grace -0.5", "--grace -0.5 is invalid: expected seconds >= 0"),
        ("--gpus 2 --grace inf", "--grace inf is invalid"),
        ("--gpus 2 --time-limits foo", "--time-limits 'foo' is invalid: expected exact, none"),
        ("--gpus 2 --time-limits -2", "--time-limits '-2' is invalid"),
        ("--gpus 2 --nodes 3", "--nodes 3 does not split --gpus 2 evenly"),
        ("--gpus 2 --max-gpus 4", "--max-gpus 4 is more than --gpus 2"),
        ("--gpus 2 --sample nan", "--sample nan is invalid"),
        ("--gpus 2 --sample 1.5", "--sample 1.5 is invalid: expected a fraction in (0, 1]"),
        ("--gpus 2 --policy ,", "--policy names no policy"),
        ("--gpus 2 --policy fifo,lottery", "--policy 'lottery' is not a policy"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_status_2(trace, options, fragment):
    assert_usage_error(dlsched_sim(str(trace), *options.split()), fragment)


def test_a_missing_trace_file_is_named(tmp_path):
    missing = tmp_path / "nope.csv"
    assert_usage_error(dlsched_sim(str(missing), "--gpus", "1"), str(missing), "no such file")


def test_a_folder_given_as_the_trace_is_refused(tmp_path):
    assert_usage_error(dlsched_sim(str(tmp_path), "--gpus", "1"), str(tmp_path), "is a folder")


def test_a_binary_file_given_as_the_trace_is_refused(tmp_path):
    blob = tmp_path / "model.pt"
    blob.write_bytes(b"\x80\x02\xff\xfe\x00\x01")
    assert_usage_error(dlsched_sim(str(blob), "--gpus", "1"), str(blob), "not a UTF-8 text file")


def test_plot_into_a_missing_folder_is_refused_before_the_replay(trace, tmp_path):
    target = tmp_path / "missing" / "sim.png"
    done = dlsched_sim(str(trace), "--gpus", "2", "--plot", str(target))
    assert_usage_error(done, "--plot", "does not exist")
    assert done.stdout == ""  # refused before replaying, not after


def test_plot_onto_a_folder_or_an_unknown_format_is_refused(trace, tmp_path):
    assert_usage_error(dlsched_sim(str(trace), "--gpus", "2", "--plot", str(tmp_path)), "folder")
    unknown = tmp_path / "sim.docx"
    assert_usage_error(
        dlsched_sim(str(trace), "--gpus", "2", "--plot", str(unknown)), "cannot write .docx"
    )


def test_an_empty_trace_says_it_holds_no_jobs(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("# submit_time,num_gpus,duration\n\n")
    assert_usage_error(dlsched_sim(str(empty), "--gpus", "1"), "holds no jobs")


# bad rows in a trace


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("5,1,nan", "duration='nan' is invalid"),
        ("5,1,inf", "duration='inf' is invalid"),
        ("nan,1,5", "submit_time='nan' is invalid"),
        ("-5,1,5", "submit_time='-5' is invalid"),
        ("5,1,-10", "duration='-10' is invalid"),
        ("5,-1,10", "num_gpus='-1' is invalid"),
        ("5,inf,10", "num_gpus='inf' is invalid"),
        ("5,1.5,10", "num_gpus='1.5' is invalid"),
        ("5,1", "duration is missing"),
    ],
)
def test_a_bad_csv_row_is_refused_with_the_file_and_line(tmp_path, row, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(f"submit_time,num_gpus,duration\n0,1,10\n{row}\n")
    with pytest.raises(TraceError) as caught:
        load_csv(path)
    assert f"{path}, line 3: {fragment}" in str(caught.value)


def test_a_nan_duration_ends_the_command_at_once_instead_of_hanging(tmp_path):
    path = tmp_path / "nan.csv"
    path.write_text("0,1,10\n1,1,nan\n")
    assert_usage_error(dlsched_sim(str(path), "--gpus", "1"), f"{path}, line 2: duration='nan'")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ("nan,1", "duration='nan' is invalid"),
        ("-60.0,1", "duration='-60.0' is invalid"),
        ("60.0,-2", "num_gpus='-2' is invalid"),
        ("60.0,nan", "num_gpus='nan' is invalid"),
        ("60.0,inf", "num_gpus='inf' is invalid"),
    ],
)
def test_a_bad_philly_row_is_refused_with_the_file_and_line(tmp_path, fields, fragment):
    path = tmp_path / "philly.csv"
    path.write_text(
        PHILLY_HEADER + f"2017-10-02 00:00:00,60.0,1,60.0,aa\n2017-10-02 00:00:05,{fields},0,aa\n"
    )
    with pytest.raises(TraceError) as caught:
        load_philly(path)
    assert f"{path}, line 3: {fragment}" in str(caught.value)


def test_philly_timestamps_with_and_without_a_zone_sort_together(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(
        PHILLY_HEADER + "2017-10-02 00:00:00,60.0,1,60.0,aa\n"
        "2017-10-02 02:00:30+02:00,60.0,1,60.0,aa\n"
    )
    assert [j.submit for j in load_philly(path)] == [0.0, 30.0]


def test_a_zoned_timestamp_before_year_one_in_utc_is_a_trace_error(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(PHILLY_HEADER + "0001-01-01 00:00:00+05:00,60.0,1,60.0,aa\n")
    with pytest.raises(TraceError, match="line 2: timestamp='0001-01-01 00:00:00"):
        load_philly(path)


# filters on every trace format


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("--cluster aa", "filtering by cluster needs a Philly trace"),
        ("--start 2017-10-01", "filtering by start needs a Philly trace"),
        ("--end 2017-10-02", "filtering by end needs a Philly trace"),
    ],
)
def test_philly_filters_on_a_plain_csv_say_what_the_trace_lacks(trace, options, fragment):
    done = dlsched_sim(str(trace), "--gpus", "2", *options.split())
    assert_usage_error(done, str(trace), "is a plain CSV trace", fragment)


def test_a_start_after_the_end_is_refused(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(PHILLY_HEADER + "2017-10-02 00:00:00,60.0,1,60.0,aa\n")
    done = dlsched_sim(str(path), "--gpus", "1", "--start", "2017-10-03", "--end", "2017-10-01")
    assert_usage_error(done, "is not before end")


def test_a_cluster_with_no_jobs_is_named(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(PHILLY_HEADER + "2017-10-02 00:00:00,60.0,1,60.0,aa\n")
    done = dlsched_sim(str(path), "--gpus", "1", "--cluster", "zz")
    assert_usage_error(done, "no jobs in", "match --cluster zz")


# dropped jobs


def test_jobs_larger_than_the_pool_are_counted_in_the_table_and_in_json(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("0,1,10\n0,4,5\n1,1,2\n2,8,1\n")
    table = dlsched_sim(str(path), "--gpus", "2", "--policy", "fifo")
    assert table.returncode == 0, table.stderr
    summary, dropped = table.stdout.splitlines()[:2]
    assert summary.startswith("2 jobs on 2 GPUs")
    assert dropped == "dropped 2 jobs asking for more than 2 GPUs"
    out = json.loads(dlsched_sim(str(path), "--gpus", "2", "--policy", "fifo", "--json").stdout)
    assert out["jobs"] == 2
    assert out["dropped"] == [{"jobs": 2, "reason": "asking for more than 2 GPUs"}]


def test_max_gpus_below_the_pool_drops_and_counts_for_philly_too(tmp_path):
    path = tmp_path / "philly.csv"
    path.write_text(
        PHILLY_HEADER + "2017-10-02 00:00:00,60.0,1,60.0,aa\n"
        "2017-10-02 00:00:01,60.0,2,120.0,aa\n"
        "2017-10-02 00:00:02,60.0,0,0.0,aa\n"
    )
    done = dlsched_sim(str(path), "--gpus", "2", "--max-gpus", "1", "--policy", "fifo")
    assert done.returncode == 0, done.stderr
    assert "dropped 1 job asking for no GPUs\n" in done.stdout
    assert "dropped 1 job asking for more than 1 GPU\n" in done.stdout
    assert load_trace(path, max_gpus=1).dropped == {
        "asking for no GPUs": 1,
        "asking for more than 1 GPU": 1,
    }


def test_when_every_job_is_dropped_the_error_says_why(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("0,4,10\n")
    assert_usage_error(
        dlsched_sim(str(path), "--gpus", "2"), "dropped 1 job asking for more than 2 GPUs"
    )


# the Python API refuses what would stall the replay


def test_a_trace_job_refuses_times_that_are_not_finite_seconds():
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(TraceError, match="expected seconds >= 0"):
            TraceJob("j", 0.0, 1, bad)
        with pytest.raises(TraceError, match="submit="):
            TraceJob("j", bad, 1, 1.0)
    with pytest.raises(TraceError, match="gpus=0"):
        TraceJob("j", 0.0, 0, 1.0)


def test_simulate_refuses_a_pool_too_large_to_model():
    with pytest.raises(SimulationError, match="at most 100000 GPUs"):
        simulate([TraceJob("a", 0.0, 1, 1.0)], "fifo", gpus=10**12)


@pytest.mark.parametrize(
    "options",
    [
        {"grace": math.nan},
        {"grace": -1.0},
        {"restart_overhead": math.inf},
        {"time_limits": math.nan},
        {"time_limits": "often"},
    ],
)
def test_simulate_refuses_options_that_are_not_finite_and_non_negative(options):
    with pytest.raises(SimulationError, match="is invalid"):
        simulate([TraceJob("a", 0.0, 1, 1.0)], "fifo", gpus=1, **options)


# properties: any rows give either a clean error or a trace the replay can use

# a valid trace with up to two fields made odd, and now and then a row of odd fields
ODD = st.one_of(
    st.floats().map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "-0", "1.5", "", " ", "#", "x"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
)
SECONDS = st.one_of(st.floats(0, 1e6).map(repr), st.integers(0, 10**6).map(str))
ZONES = [None, timezone.utc, timezone(timedelta(hours=5)), timezone(timedelta(hours=-5))]
TIMESTAMP = st.datetimes(timezones=st.sampled_from(ZONES)).map(str)
CSV_ROW = st.one_of(
    st.tuples(SECONDS, st.integers(1, 12).map(str), SECONDS),
    st.tuples(
        SECONDS,
        st.integers(1, 12).map(str),
        SECONDS,
        st.sampled_from(["ana", "bo", ""]),
        st.integers(-5, 200).map(str),
    ),
)
PHILLY_ROW = st.tuples(
    TIMESTAMP, SECONDS, st.integers(0, 12).map(str), SECONDS, st.sampled_from(["aa", "bb", ""])
)


@st.composite
def spoiled(draw: st.DrawFn, row: st.SearchStrategy[tuple[str, ...]]) -> list[list[str]]:
    rows = [list(r) for r in draw(st.lists(row, max_size=6))]
    for _ in range(draw(st.integers(0, 2)) if rows else 0):
        fields = rows[draw(st.integers(0, len(rows) - 1))]
        fields[draw(st.integers(0, len(fields) - 1))] = draw(ODD)
    if draw(st.integers(0, 9)) == 0:
        rows.insert(draw(st.integers(0, len(rows))), draw(st.lists(ODD, max_size=6)))
    return rows


SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _write_rows(path: Path, rows: list[list[str]], header: str = "") -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(header)
        csv.writer(f).writerows(rows)


def _assert_replayable(jobs: list[TraceJob], path: Path) -> None:
    for job in jobs:
        assert math.isfinite(job.submit) and job.submit >= 0
        assert math.isfinite(job.duration) and job.duration >= 0
        # whole GPUs, or a share of one GPU; never part of several (2.7 is refused)
        assert (isinstance(job.gpus, int) and job.gpus >= 1) or 0 < job.gpus < 1
    submits = [j.submit for j in jobs]
    assert submits == sorted(submits)
    assert not submits or submits[0] == 0.0
    fitting = [j for j in jobs if j.gpus <= 16]  # a valid row may ask for 10**300 GPUs
    if fitting:
        # the replay ends: every job finishes at a time that is a number
        result = simulate(fitting, "fifo", gpus=16)
        assert not any(math.isnan(j.finish) for j in result.jobs)


def _assert_clean_error(error: DlschedError, path: Path) -> None:
    assert isinstance(error, TraceError)
    assert str(path) in str(error)


@SETTINGS
@given(rows=spoiled(CSV_ROW))
def test_any_csv_rows_load_as_a_valid_trace_or_a_trace_error(tmp_path, rows):
    path = tmp_path / "fuzz.csv"
    _write_rows(path, rows)
    try:
        jobs = load_trace(path)
    except TraceError as error:
        _assert_clean_error(error, path)
    else:
        _assert_replayable(jobs, path)


@SETTINGS
@given(rows=spoiled(PHILLY_ROW))
def test_any_philly_rows_load_as_a_valid_trace_or_a_trace_error(tmp_path, rows):
    path = tmp_path / "philly.csv"
    _write_rows(path, rows, header=PHILLY_HEADER)
    try:
        jobs = load_trace(path, max_gpus=8)
    except TraceError as error:
        _assert_clean_error(error, path)
    else:
        _assert_replayable(jobs, path)


@SETTINGS
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 1e9, allow_nan=False), st.integers(1, 64), st.floats(0, 1e7)),
        min_size=1,
        max_size=8,
    )
)
def test_valid_csv_rows_load_as_exactly_those_jobs(tmp_path, rows):
    path = tmp_path / "valid.csv"
    _write_rows(path, [[repr(s), str(g), repr(d)] for s, g, d in rows])
    jobs = load_csv(path)
    first = min(s for s, _, _ in rows)
    expected = sorted(
        ((s - first, g, d, n) for n, (s, g, d) in enumerate(rows, start=1)),
        key=lambda r: (r[0] + first, r[3]),
    )
    assert [(j.submit, j.gpus, j.duration, j.id) for j in jobs] == [
        (s, g, d, f"job-{n}") for s, g, d, n in expected
    ]

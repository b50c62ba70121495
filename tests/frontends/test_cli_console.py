"""The installed ``dlsched`` console script, called the way people call it: as a program.

Every command gets a good call and bad calls. A bad call must end with one line on
stderr, ``dlsched <command>: ...``, no traceback, and the exit status the help lists.
Most tests share one state folder; each names its jobs so its filters see only them.
A ``sleep`` job holding both simulated GPUs keeps GPU jobs queued, so no test waits
on a job it does not need to run.
"""

from __future__ import annotations

import getpass
import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.local import launcher

DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def make_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "DLSCHED_HOME": str(home), "DLSCHED_SIMULATE_GPUS": "2x16GiB"}
    for name in ("DLSCHED_POLICY", "DLSCHED_BACKEND", "DLSCHED_SOCKET"):
        env.pop(name, None)
    return env


def run(env: dict[str, str], *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [DLSCHED, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    return out


def assert_one_line_error(out: subprocess.CompletedProcess[str], command: str) -> str:
    """The whole of stderr is one line naming the command; returns that line."""
    assert "Traceback" not in out.stderr, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"dlsched {command}: " if command else "dlsched: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    home = tmp_path_factory.mktemp("console") / "home"
    env = make_env(home)
    yield env
    subprocess.run(
        [DLSCHED, "cancel", "--state", "queued,running,preempted"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    launcher.stop(home)


@pytest.fixture(scope="module")
def blocker(env: dict[str, str]) -> str:
    """A running job that holds both GPUs, so GPU jobs submitted after it stay queued."""
    job_id = run(
        env, "submit", "--gpus", "2", "--cpus", "0.25", "--name", "blocker", "--", "sleep", "600"
    ).stdout.strip()
    state = json.loads(run(env, "queue", "--name", "blocker", "--json").stdout)[0]["state"]
    assert state == "running"
    return job_id


def queued_job(env: dict[str, str], name: str) -> str:
    return run(
        env, "submit", "--gpus", "1", "--cpus", "0.25", "--name", name, "--", "true"
    ).stdout.strip()


def names_and_states(env: dict[str, str], *args: str) -> list[tuple[str, str]]:
    return [(j["name"], j["state"]) for j in json.loads(run(env, "queue", *args, "--json").stdout)]


# -- good calls -------------------------------------------------------------------------------


def test_status_summarises_the_simulated_pool(env: dict[str, str]) -> None:
    out = run(env, "status")
    assert out.stdout.startswith("GPU ") and "(2 simulated)" in out.stdout.splitlines()[0]
    assert out.stderr == ""
    assert json.loads(run(env, "status", "--json").stdout)["gpus"]["total"] == 2


def test_submit_prints_the_job_id_and_queue_shows_it_waiting(
    env: dict[str, str], blocker: str
) -> None:
    job_id = queued_job(env, "waits-for-gpu")
    table = run(env, "queue").stdout
    assert job_id in table and "waiting for 1 GPU" in table
    assert names_and_states(env, "--name", "waits-for-gpu") == [("waits-for-gpu", "queued")]


def test_queue_filters_by_name_glob_state_and_user(env: dict[str, str], blocker: str) -> None:
    first, second = queued_job(env, "flt-a"), queued_job(env, "flt-b")
    run(env, "cancel", first)
    assert names_and_states(env, "--name", "flt-*") == [("flt-b", "queued")]
    assert names_and_states(
        env, "--name", "flt-*", "--state", "queued", "--state", "cancelled"
    ) == [
        ("flt-b", "queued"),
        ("flt-a", "cancelled"),
    ]
    assert names_and_states(env, "--name", "flt-a", "--state", "cancelled,failed") == [
        ("flt-a", "cancelled")
    ]
    assert names_and_states(env, "--mine", "--name", "flt-b") == [("flt-b", "queued")]
    assert names_and_states(env, "-u", getpass.getuser(), "--name", "flt-b") == [
        ("flt-b", "queued")
    ]
    assert names_and_states(env, "-u", "nobody-by-that-name") == []
    assert run(env, "queue", "-u", "nobody-by-that-name").stdout.startswith("no jobs match")
    assert second in run(env, "queue", "--name", "flt-?").stdout


def test_queue_all_lists_unfinished_first_then_finished_newest_first(
    env: dict[str, str], blocker: str
) -> None:
    ids = [queued_job(env, f"ord-{i}") for i in range(3)]
    run(env, "cancel", ids[0], ids[1])
    listed = [
        j["id"] for j in json.loads(run(env, "queue", "--all", "--name", "ord-*", "--json").stdout)
    ]
    assert listed == [ids[2], ids[1], ids[0]]
    table = run(env, "queue", "--all", "--name", "ord-*").stdout.splitlines()
    assert [line.split()[0] for line in table[1:]] == [ids[2], ids[1], ids[0]]


def test_cancel_takes_several_ids(env: dict[str, str], blocker: str) -> None:
    a, b = queued_job(env, "many-a"), queued_job(env, "many-b")
    assert run(env, "cancel", a, b).stdout.splitlines() == [f"{a} cancelled", f"{b} cancelled"]
    # a job that has already ended is not cancelled again: nothing done is exit status 1
    line = assert_one_line_error(run(env, "cancel", a, status=1), "cancel")
    assert line == f"dlsched cancel: nothing to cancel: {a} already cancelled"


def test_cancel_by_name_user_and_state_lists_what_it_cancelled(
    env: dict[str, str], blocker: str
) -> None:
    ids = {queued_job(env, "sweep-1"), queued_job(env, "sweep-2")}
    keep = queued_job(env, "other-1")
    out = run(
        env, "cancel", "--name", "sweep-*", "-u", getpass.getuser(), "--state", "queued", "--json"
    )
    assert {j["id"] for j in json.loads(out.stdout)} == ids
    assert names_and_states(env, "--name", "sweep-*", "--all") == [
        ("sweep-2", "cancelled"),
        ("sweep-1", "cancelled"),
    ]
    assert names_and_states(env, "--name", "other-1") == [("other-1", "queued")]
    again = run(env, "cancel", "--name", "sweep-*", status=1)
    assert "no unfinished job matches --name 'sweep-*'" in assert_one_line_error(again, "cancel")
    run(env, "cancel", keep)


def test_priority_changes_a_queued_job(env: dict[str, str], blocker: str) -> None:
    job_id = queued_job(env, "reprioritised")
    assert run(env, "priority", job_id, "urgent").stdout.strip() == f"{job_id} priority 1000"
    assert json.loads(run(env, "priority", job_id, "7", "--json").stdout)["priority"] == 7


def test_submit_wait_prints_only_the_output_and_logs_repeats_it(env: dict[str, str]) -> None:
    out = run(env, "submit", "--cpus", "0.25", "--wait", "--", "echo", "from the job")
    assert out.stdout == "from the job\n"
    assert out.stderr.startswith("dlsched submit: job ") and " done" in out.stderr
    job_id = out.stderr.split()[3]
    assert run(env, "logs", job_id).stdout == "from the job\n"
    assert json.loads(run(env, "logs", job_id, "--json").stdout)["log"] == "from the job\n"


def test_submit_wait_streams_output_while_running_and_exits_with_the_job_status(
    env: dict[str, str], tmp_path: Path
) -> None:
    # the job only ends once the test has read "hi", so this passes only if output streams
    go_on = tmp_path / "go-on"
    script = (
        "import os, sys, time\n"
        "print('hi', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.1)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen(
        [DLSCHED, "submit", "--cpus", "0.25", "--wait", "--", "python3", "-c", script, str(go_on)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=90), "no output while the job runs"
        assert proc.stdout.readline() == b"hi\n"
        go_on.touch()
        rest, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rest == b""
    assert proc.returncode == 3
    line = assert_one_line_error(
        subprocess.CompletedProcess([], proc.returncode, "", err.decode()), "submit"
    )
    assert line.endswith("failed: exit code 3")


def test_ctrl_c_stops_waiting_but_not_the_job(env: dict[str, str]) -> None:
    script = "import time; print('started', flush=True); time.sleep(120)"
    # as from a terminal: SIGINT neither blocked nor ignored. The test's own process may have
    # either from what ran in it before (a whole run once left it so, and the CLI looped on,
    # never told of the Ctrl-C); both pass to a child and through exec
    terminal = (
        "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", terminal, DLSCHED]
        + ["submit", "--cpus", "0.25", "--name", "interrupted", "--wait", "--"]
        + ["python3", "-c", script],
        # a SIGABRT dumps every thread's stack: where a CLI that outlives Ctrl-C is stuck
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        # bounded waits that say where it stuck, well inside pytest's timeout: a job that is
        # slow to start on a loaded machine is named as such, and a real hang still fails
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout=150):
                rows = run(env, "queue", "--all", "--name", "interrupted", "--json").stdout
                raise AssertionError(f"the job printed nothing in 150 s; its row: {rows}")
        assert proc.stdout.readline() == b"started\n"  # main() is waiting by now
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(
                "dlsched submit --wait did not end 90 s after Ctrl-C; where it was:\n"
                + err.decode(errors="replace")[-6000:]
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    line = assert_one_line_error(
        subprocess.CompletedProcess([], proc.returncode, "", err.decode()), "submit"
    )
    assert "interrupted" in line and "dlsched cancel" in line
    assert names_and_states(env, "--name", "interrupted") == [("interrupted", "running")]
    run(env, "cancel", "--name", "interrupted")


def test_sim_compares_policies_on_a_small_trace(env: dict[str, str], tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("0,1,3600\n60,2,1800\n120,1,600\n")
    out = run(env, "sim", str(trace), "--gpus", "2", "--policy", "fifo,priority")
    assert out.stdout.startswith("3 jobs on 2 GPUs")
    assert [line.split()[0] for line in out.stdout.splitlines()[2:4]] == ["fifo", "priority"]


def test_help_documents_the_exit_statuses(env: dict[str, str]) -> None:
    out = run(env, "--help").stdout
    assert "exit status:" in out
    for status in ("0 ", "1 ", "2 ", "130", "141"):
        assert f"  {status}" in out


# -- bad calls ----------------------------------------------------------------------------------

BAD_CALLS = [
    # (command named on stderr, argv, exit status, words the line must hold)
    ("", [], 2, "COMMAND"),
    ("", ["--no-such-flag", "status"], 2, "--no-such-flag"),
    ("status", ["status", "--verbose"], 2, "unrecognized arguments: --verbose"),
    ("queue", ["queue", "--state", "pending"], 2, "unknown state 'pending'"),
    ("queue", ["queue", "--mine", "-u", "someone"], 2, "not allowed with"),
    ("submit", ["submit", "--"], 2, "give the command after --"),
    ("submit", ["submit", "--gpus", "8", "--", "true"], 2, "this pool has 2"),
    ("submit", ["submit", "--gpus", "inf", "--", "true"], 2, "--gpus"),
    ("submit", ["submit", "--retries", "1e20", "--", "true"], 2, "--retries"),
    ("submit", ["submit", "--priority", "1e23", "--", "true"], 2, ""),
    ("submit", ["submit", "--mem", "1e400GiB", "--", "true"], 2, ""),
    ("cancel", ["cancel", "nosuchjob"], 2, "no job with id 'nosuchjob'"),
    ("cancel", ["cancel"], 2, "give job ids, or filters"),
    ("cancel", ["cancel", "--state", "succeeded"], 2, "unknown state 'succeeded'"),
    ("cancel", ["cancel", "--name", "no-job-is-called-this"], 1, "no unfinished job matches"),
    ("priority", ["priority", "nosuchjob", "high"], 2, "no job with id 'nosuchjob'"),
    ("priority", ["priority", "nosuchjob"], 2, "required"),
    ("logs", ["logs", "nosuchjob"], 2, "no job with id 'nosuchjob'"),
    ("sim", ["sim", "no-such-trace.csv", "--gpus", "2"], 2, "no-such-trace.csv"),
]


@pytest.mark.parametrize(
    ("command", "argv", "status", "words"),
    BAD_CALLS,
    ids=[" ".join(argv) or "no-command" for _, argv, _, _ in BAD_CALLS],
)
def test_a_bad_call_is_one_line_on_stderr_with_its_exit_status(
    env: dict[str, str], command: str, argv: list[str], status: int, words: str
) -> None:
    out = run(env, *argv, status=status)
    assert words in assert_one_line_error(out, command)
    assert out.stdout == ""


def test_a_number_too_large_for_the_ledger_is_a_clean_error(
    env: dict[str, str], blocker: str
) -> None:
    job_id = queued_job(env, "huge-priority")
    out = run(env, "priority", job_id, "99999999999999999999999", status=2)
    assert_one_line_error(out, "priority")
    run(env, "cancel", job_id)


def test_a_state_folder_that_cannot_be_used_is_a_clean_error(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    out = run(make_env(not_a_folder), "status", status=2)
    assert str(not_a_folder) in assert_one_line_error(out, "status")
    out = run(make_env(tmp_path / "home"), "--home", str(not_a_folder / "sub"), "queue", status=2)
    assert str(not_a_folder) in assert_one_line_error(out, "queue")


def test_a_ledger_that_cannot_be_read_is_a_clean_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "ledger.sqlite").write_bytes(b"this is not a database" * 100)
    out = run(make_env(home), "queue", status=1)
    assert "could not read or write the job ledger" in assert_one_line_error(out, "queue")


def test_debug_adds_the_traceback(env: dict[str, str]) -> None:
    out = run(env, "--debug", "logs", "nosuchjob", status=2)
    assert out.stderr.startswith("Traceback (most recent call last):")
    assert out.stderr.splitlines()[-1].startswith("dlsched logs: no job with id 'nosuchjob'")


def test_a_closed_pipe_ends_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = make_env(home)
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", env["DLSCHED_SIMULATE_GPUS"])
    # 1500 finished jobs make a table far larger than a pipe holds; none of them runs
    with Scheduler(home, loop=False, probe_pool=False) as s:
        first = s.submit_command(["sleep", "300"], gpus=2, cpus=0.25, name="first")
        s.map(abs, range(1500), after=[first.id], name="waits-for-first")
        s.cancel(first.id)

    def through_head(command: str) -> tuple[str, str]:
        shell = f"{shlex.quote(DLSCHED)} {command} | head -1; echo ${{PIPESTATUS[0]}}"
        out = subprocess.run(
            ["bash", "-c", shell], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.stderr == "", out.stderr
        first_line, status = out.stdout.splitlines()
        return first_line, status

    try:
        assert through_head("queue --all")[0].startswith("ID ")
        assert through_head("queue --all")[1] == "141"
        assert through_head("status")[0].startswith("GPU ")
    finally:
        launcher.stop(home)

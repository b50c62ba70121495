"""The dlsched command line, run as a real program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jupyter_dlsched

# the console script pip installed next to this interpreter, as a user runs it
DLSCHED = str(Path(sys.executable).with_name("dlsched"))


def dlsched(*args, check=True):
    out = subprocess.run(
        [DLSCHED, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_submit_runs_a_command_in_the_queue(home):
    out = dlsched(
        "submit", "--cpus", "0.5", "--name", "hello", "--wait", "--", "echo", "hello from the queue"
    )
    assert out.stdout == "hello from the queue\n"
    info = json.loads(dlsched("queue", "--all", "--json").stdout)
    assert [(j["name"], j["state"], j["kind"]) for j in info] == [("hello", "succeeded", "command")]
    job_id = info[0]["id"]
    assert out.stderr.startswith(f"dlsched submit: job {job_id} done")
    assert dlsched("logs", job_id).stdout == "hello from the queue\n"
    assert json.loads(dlsched("logs", job_id, "--json").stdout)["log"] == "hello from the queue\n"


def test_status_shows_simulated_gpus(home):
    out = dlsched("status").stdout
    assert out.startswith("GPU 0/2 (2 simulated) busy")
    # the machine's line is labelled for a person, not with the class a notebook's repr names
    [machine] = [line for line in out.splitlines() if "CPUs (" in line]
    assert machine.startswith("machine: ") and "PoolInfo" not in out
    data = json.loads(dlsched("status", "--json").stdout)
    assert data["gpus"] == {"total": 2, "busy": 0, "simulated": 2}
    assert [g["simulated"] for g in data["pool"]["gpus"]] == [True, True]


def test_queue_shows_why_a_job_waits_and_cancel_works(home):
    running = dlsched("submit", "--gpus", "2", "--cpus", "0.25", "--", "sleep", "30").stdout.strip()
    waiting = dlsched("submit", "--gpus", "1", "--cpus", "0.25", "--", "true").stdout.strip()
    table = dlsched("queue").stdout
    assert "waiting for 1 GPU" in table and waiting in table
    assert dlsched("cancel", waiting).stdout.strip() == f"{waiting} cancelled"
    assert dlsched("cancel", running).stdout.strip() == f"{running} cancel requested"
    # a finished job's record stays as it ended
    refused = dlsched("priority", waiting, "high", "--json", check=False)
    assert refused.returncode == 1 and "already cancelled" in refused.stderr


def test_follow_logs_until_the_job_ends(home):
    job_id = dlsched(
        "submit", "--cpus", "0.5", "--", "sh", "-c", "echo one; sleep 1; echo two"
    ).stdout.strip()
    assert dlsched("logs", "-f", job_id).stdout == "one\ntwo\n"


def test_errors_are_one_line_messages(home):
    bad = dlsched("submit", "--gpus", "8", "--", "true", check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "dlsched submit: gpus=8 is invalid: expected a request this pool can satisfy "
        "(requests 8 GPUs; this pool has 2)"
    )
    missing = dlsched("cancel", "nosuchjob", check=False)
    assert missing.returncode == 2 and "no job with id 'nosuchjob'" in missing.stderr
    empty = dlsched("submit", "--", check=False)
    assert empty.returncode == 2 and "give the command after --" in empty.stderr


def test_version_prints_the_release():
    out = dlsched("--version")
    assert out.stdout.strip() == f"dlsched {jupyter_dlsched.__version__}"


def test_an_unknown_job_id_points_a_shell_user_at_the_queue(home):
    missing = dlsched("logs", "nosuchid", check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "dlsched logs: no job with id 'nosuchid'; `dlsched queue --all` lists the jobs"
    )


def test_a_memory_limit_too_small_to_start_a_process_is_refused(home):
    tiny = dlsched("submit", "--mem", "1KiB", "--", "true", check=False)
    assert tiny.returncode == 2
    assert tiny.stderr.strip() == (
        "dlsched submit: mem='1KiB' is invalid: expected a size of at least 16 MiB "
        "(a process needs that much to start)"
    )
    assert json.loads(dlsched("queue", "--all", "--json").stdout) == []
    # the floor itself is enough for a Python interpreter to start and end
    out = dlsched("submit", "--mem", "16MiB", "--wait", "--", sys.executable, "-c", "print('ok')")
    assert out.stdout == "ok\n"

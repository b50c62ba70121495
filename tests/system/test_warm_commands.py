"""A command job that runs the pool's own Python on a script (``python train.py``) or a module
(``python -m pkg``) runs warm, in its forked job process with what was imported ahead, and
sees what an exec of a fresh interpreter would give it: ``sys.argv``, ``__main__``,
``sys.path[0]``, ``sys.executable``, the working folder, the environment, its exit status, its
traceback, ``atexit``, and cancellation. Any other command execs as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_for

from jupyter_dlsched.client.scheduler import Scheduler

#: what a script reports of itself; ``warm`` is whether numpy (imported ahead by the pool's
#: launcher, never by this script) was there when it started
REPORT = textwrap.dedent(
    """
    import atexit, json, os, sys
    warm = "numpy" in sys.modules
    # exec'd, not forked from the pool's supervisor (python -m jupyter_dlsched.local...)
    fresh = not any(a.startswith("jupyter_dlsched.") for a in sys.orig_argv)
    seen = {
        "argv": sys.argv,
        "name": __name__,
        "path0": sys.path[0],
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "colour": os.environ.get("TRAIN_COLOUR"),
        "spec": getattr(sys.modules["__main__"], "__file__", None),
    }
    print("REPORT " + json.dumps({"warm": warm, "fresh": fresh, **seen}), flush=True)
    atexit.register(lambda: print("atexit ran", flush=True))
    code = int(os.environ.get("TRAIN_EXIT", "0"))
    if code:
        sys.exit(code)
    """
)

BOOM = textwrap.dedent(
    """
    import sys
    def step(x):
        return 1 / x
    step(0)
    """
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "project"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text(REPORT)
    (folder / "boom.py").write_text(BOOM)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "__main__.py").write_text(REPORT)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("TRAIN_COLOUR", "teal")
    return folder


def report(log: str) -> dict:
    [line] = [x for x in log.splitlines() if x.startswith("REPORT ")]
    return json.loads(line[len("REPORT ") :])


def exec_report(argv: list[str]) -> dict:
    """What the same command reports when exec'd as a fresh interpreter here."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return report(done.stdout)


@pytest.mark.parametrize(
    "argv",
    [["train.py", "--lr", "0.1"], ["-m", "pkg", "--epochs", "2"], ["-u", "train.py"]],
    ids=["script", "module", "unbuffered"],
)
def test_a_python_command_runs_warm_and_sees_what_an_exec_would_give(home, project, argv):
    command = [sys.executable, *argv]
    with Scheduler(home) as s:
        handle = s.submit_command(command)
        assert handle.wait(timeout=120).state == "succeeded", handle.logs()
        log = handle.logs()
    warm = report(log)
    cold = exec_report(command)
    assert warm.pop("warm") is True, log  # it ran in the process with numpy imported ahead
    assert cold.pop("warm") is False
    assert (warm.pop("fresh"), cold.pop("fresh")) == (False, True)
    assert warm == cold
    assert warm["name"] == "__main__" and warm["colour"] == "teal"
    assert warm["cwd"] == str(project)
    assert "atexit ran" in log


def test_a_warm_commands_exit_status_and_traceback_are_an_execs(home, project, monkeypatch):
    monkeypatch.setenv("TRAIN_EXIT", "3")
    with Scheduler(home) as s:
        exited = s.submit_command([sys.executable, "train.py"])
        boom = s.submit_command([sys.executable, "boom.py"])
        exited_info = exited.wait(timeout=120)
        boom_info = boom.wait(timeout=120)
        boom_log = boom.logs()
        assert report(exited.logs())["warm"] is True
    assert (exited_info.state, exited_info.exit_code) == ("failed", 3)
    assert (boom_info.state, boom_info.exit_code) == ("failed", 1)
    fresh = subprocess.run([sys.executable, "boom.py"], capture_output=True, text=True)
    # the same traceback as python's own: from the script's frame, none of the pool's
    assert fresh.stderr.strip() in boom_log, boom_log
    assert "runpy" not in boom_log and "jupyter_dlsched" not in boom_log


def test_a_warm_command_is_cancelled_like_any_job(home, project):
    (project / "forever.py").write_text(
        "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(600)\n"
    )
    with Scheduler(home) as s:
        handle = s.submit_command([sys.executable, "forever.py"])
        line = wait_for(
            lambda: [x for x in handle.logs().splitlines() if x.startswith("PID ")],
            timeout=120,
            what=handle.logs,
        )
        pid = int(line[0].split()[1])
        s.cancel(handle.id)
        assert handle.wait(timeout=60).state == "cancelled"
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout=30)


def test_other_commands_exec_as_before(home, project, monkeypatch):
    with Scheduler(home) as s:
        inline = s.submit_command([sys.executable, "-c", REPORT])
        # a job that changes how an interpreter starts gets a fresh one
        monkeypatch.setenv("PYTHONPATH", str(project / "pkg"))
        shifted = s.submit_command([sys.executable, "train.py"])
        for handle in (inline, shifted):
            assert handle.wait(timeout=120).state == "succeeded", handle.logs()
        assert report(inline.logs())["fresh"] is True
        assert report(shifted.logs())["fresh"] is True


def test_preload_none_turns_warm_commands_off(home, project, monkeypatch):
    monkeypatch.setenv("DLSCHED_PRELOAD", "none")  # the pool's agent starts with it
    with Scheduler(home) as s:
        handle = s.submit_command([sys.executable, "train.py"])
        assert handle.wait(timeout=120).state == "succeeded", handle.logs()
        assert report(handle.logs())["fresh"] is True


def test_dlsched_submit_of_a_python_script_runs_it_warm(home, project):
    """The way a shell user says it: `dlsched submit --wait -- python train.py`."""
    dlsched = str(Path(sys.executable).with_name("dlsched"))
    with Scheduler(home):  # the pool's agent, preloading numpy
        done = subprocess.run(
            [dlsched, "submit", "--json", "--wait", "--cpus", "0.25", "--",
             sys.executable, "train.py", "--lr", "0.1"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = json.loads(done.stdout)["id"]
        logs = subprocess.run([dlsched, "logs", job_id], capture_output=True, text=True, timeout=60)
    seen = report(logs.stdout)
    assert seen["warm"] is True and seen["fresh"] is False, seen
    assert seen["argv"] == ["train.py", "--lr", "0.1"] and seen["cwd"] == str(project)


#: a module that holds 96 MiB of its own once imported (what torch's import costs in RSS)
FAT = "HELD = bytearray(96 * 2**20)\nHELD[:: 4096] = b'x' * (len(HELD) // 4096)\n"


def test_a_memory_limit_counts_the_jobs_own_memory_not_what_its_warm_process_imported_ahead(
    home, project, monkeypatch
):
    """A job forked from the warm launcher shares what the launcher imported ahead (torch:
    ~150 MiB of RSS). The limit counted that too: a script using a few MiB, with
    ``--mem 64MiB``, failed "out of memory: used 160 MiB, limit 64 MiB" once torch was
    preloaded. What the job allocates itself still counts."""
    modules = project / "modules"
    modules.mkdir()
    (modules / "fat.py").write_text(FAT)
    monkeypatch.setenv("PYTHONPATH", str(modules))
    monkeypatch.setenv("DLSCHED_PRELOAD", "numpy,fat")  # the pool's agent starts with them
    (project / "small.py").write_text(
        "import sys, time\nprint('fat' in sys.modules, flush=True)\ntime.sleep(3)\n"
    )
    (project / "big.py").write_text(
        "import time\nheld = bytearray(128 * 2**20)\nheld[::4096] = b'x' * (len(held) // 4096)\n"
        "time.sleep(30)\n"
    )
    with Scheduler(home) as s:
        small = s.submit_command([sys.executable, "small.py"], mem="64MiB")
        info = small.wait(timeout=120)
        assert small.logs().splitlines()[0] == "True"  # it ran warm, beside the fat module
        assert info.state == "succeeded", (info.reason, small.logs())
        big = s.submit_command([sys.executable, "big.py"], mem="64MiB")
        info = big.wait(timeout=120)
    assert info.state == "failed" and (info.reason or "").startswith("out of memory: used ")

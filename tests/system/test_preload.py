"""Preload that learns: what a user's jobs import is imported ahead of their next jobs,
in the process forked for each (``local/preload.py``), never initialising a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from jupyter_dlsched.client.scheduler import Scheduler

#: a module of the test's own that takes a while to import, as torch does
SLOW = """
import time
time.sleep(0.5)
"""

#: one that imports in a job but not ahead of one (it needs the job's environment)
PICKY = """
import os
if "DLSCHED_JOB_ID" not in os.environ:
    raise ImportError("only inside a job")
"""


def had_at_start(name: str) -> bool:
    """Run in a job: whether ``name`` was imported before the job began, then import it."""
    import importlib
    import sys

    had = name in sys.modules
    importlib.import_module(name)
    return had


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder of modules on the pool's import path (the agent inherits it)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "slowmod.py").write_text(SLOW)
    (folder / "pickymod.py").write_text(PICKY)
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.syspath_prepend(str(folder))
    return folder


def run_one(s: Scheduler, name: str) -> bool:
    return s.submit(had_at_start, name, cpus=0.25).result(timeout=120)


def test_a_module_the_first_job_imports_is_imported_ahead_for_the_next(home, modules, monkeypatch):
    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)
    with Scheduler(home) as s:
        assert run_one(s, "slowmod") is False  # the first job pays
        # the processes forked ahead before it learnt are used first; then every one has it
        wait_for(lambda: run_one(s, "slowmod"), timeout=120, step=0)
        assert run_one(s, "slowmod") is True
        assert "slowmod" in s.store.get_meta(f"preload:{s.uid}")


def test_preload_none_learns_nothing_and_a_pinned_list_is_all_that_is_imported(
    home, modules, monkeypatch
):
    monkeypatch.setenv("DLSCHED_PRELOAD", "none")
    with Scheduler(home) as s:
        assert [run_one(s, "slowmod") for _ in range(4)] == [False] * 4
        assert s.store.get_meta(f"preload:{s.uid}") is None


def test_a_module_that_fails_to_import_ahead_is_dropped_and_named_in_the_agents_log(
    home, modules, monkeypatch
):
    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)
    with Scheduler(home) as s:
        assert run_one(s, "pickymod") is False
        # learnt, tried ahead of the next jobs, failed there: dropped, and said so
        dropped = home / "preload.dropped"
        wait_for(
            lambda: dropped.exists() and "pickymod" in dropped.read_text().split(), timeout=120
        )
        log = (home / "agent.log").read_text()
        assert "preload: pickymod dropped" in log and "only inside a job" in log
        # the jobs still run, and import it themselves
        assert [run_one(s, "pickymod") for _ in range(3)] == [False] * 3


def test_torch_learnt_ahead_leaves_cuda_uninitialised_and_the_grant_the_jobs(home, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)

    def look() -> tuple[bool, bool, str | None, int, int]:
        import os
        import sys

        had = "torch" in sys.modules
        import torch

        # its thread pool fits the job's cores, not the machine's it was imported with
        threads, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))
        return (
            had,
            torch.cuda.is_initialized(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            threads,
            cores,
        )

    with Scheduler(home) as s:
        first = s.submit(look, gpus=1, cpus=0.25).result(timeout=180)
        assert first[0] is False
        wait_for(
            lambda: s.submit(look, gpus=1, cpus=0.25).result(timeout=180)[0], timeout=180, step=0
        )
        had, initialised, visible, threads, cores = s.submit(look, gpus=1, cpus=0.25).result(
            timeout=180
        )
        assert had and not initialised
        assert visible is not None and visible != ""
        assert threads == cores


def test_status_shows_what_is_imported_ahead(home, modules, monkeypatch):
    import subprocess

    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)
    with Scheduler(home) as s:
        run_one(s, "slowmod")
        wait_for(lambda: "slowmod" in (s.store.get_meta(f"preload:{s.uid}") or []), timeout=60)
        out = subprocess.run(
            [str(Path(sys.executable).with_name("dlsched")), "status"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("preload: ")]
    assert "numpy" in line and "slowmod" in line and "MiB" in line


def test_status_tells_the_agents_preload_setting_not_the_shells(home, modules, monkeypatch):
    """The pool agent was started with DLSCHED_PRELOAD=none; `dlsched status` from a shell
    without it says what the agent does (it used to read its own environment)."""
    import subprocess

    monkeypatch.setenv("DLSCHED_PRELOAD", "none")
    with Scheduler(home) as s:
        run_one(s, "slowmod")
        shell = {k: v for k, v in os.environ.items() if k != "DLSCHED_PRELOAD"}
        out = subprocess.run(
            [str(Path(sys.executable).with_name("dlsched")), "status"],
            capture_output=True, text=True, timeout=120, env=shell,
        )  # fmt: skip
        assert s.store.get_meta(f"preload:{s.uid}") is None
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("preload: ")]
    assert line.startswith("preload: none in the launcher; turned off by DLSCHED_PRELOAD"), line

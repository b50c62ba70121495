"""What was learnt reaches every spare supervisor: once a job's imports are learnt, the
spares that lack them import them (or are replaced) before the next jobs come, and a job
submitted the moment the one before it ended finds them imported in the process forked
ahead for it, never importing them itself (``agent/forking.py``, ``local/preload.py``).

The module the jobs import is the test's own: it takes a second to import, as torch does,
and notes the pid of every process that imports it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
from conftest import wait_for

from jupyter_dlsched.agent.forking import SPARES
from jupyter_dlsched.client.scheduler import Scheduler

#: notes who imports it (one pid a line, beside itself), then takes a second
SLOW = """
import os, time
with open(os.path.join(os.path.dirname(__file__), "imported-by"), "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(1.0)
"""

#: a ``python train.py`` that says whether the module was there, and who it is
TRAIN = """
import os, sys
had = "slowspare" in sys.modules
import slowspare
print("RAN", os.getpid(), int(had), flush=True)
"""


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of modules on the pool's import path (the agent inherits it)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "slowspare.py").write_text(SLOW)
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv("DLSCHED_PRELOAD", raising=False)
    return folder


def importers(folder: Path) -> set[int]:
    path = folder / "imported-by"
    return {int(x) for x in path.read_text().split()} if path.exists() else set()


def import_slow() -> tuple[int, bool]:
    """A job: its pid, and whether the module was imported before it began."""
    import os
    import sys

    had = "slowspare" in sys.modules
    import slowspare  # noqa: F401

    return os.getpid(), had


def run_function(s: Scheduler, folder: Path) -> tuple[int, bool]:
    return s.submit(import_slow, cpus=0.25).result(timeout=120)


def run_script(s: Scheduler, folder: Path) -> tuple[int, bool]:
    h = s.submit_command([sys.executable, str(folder.parent / "project" / "train.py")], cpus=0.25)
    assert h.wait(timeout=120).state == "succeeded", h.logs()
    [line] = [x for x in h.logs().splitlines() if x.startswith("RAN ")]
    _, pid, had = line.split()
    return int(pid), had == "1"


def waiting_spares(s: Scheduler) -> set[int]:
    """The spare supervisors that wait for a job, each with its process forked ahead."""
    assert s.link is not None
    agent = psutil.Process(int(s.link.hello["pid"]))
    found = set()
    for spare in agent.children():
        try:
            if spare.name() == "dlsched-sup" and spare.status() != psutil.STATUS_ZOMBIE:
                if len(spare.children()) == 1 and not s.store.jobs(holding=True):
                    found.add(spare.pid)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.parametrize("kind", ["function", "python train.py"])
def test_a_job_submitted_as_the_one_before_ends_does_not_import_what_was_learnt(
    home, modules, kind
):
    # (not beside the module: a fresh interpreter would import the script folder's own)
    project = modules.parent / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    run = run_function if kind == "function" else run_script
    with Scheduler(home) as s:
        s.submit(abs, -1).result(timeout=60)  # the agent's spares wait before anything is learnt
        runs = [run(s, modules) for _ in range(6)]
    imported = importers(modules)
    first_pid, first_had = runs[0]
    assert not first_had and first_pid in imported  # the first job pays
    # the second may still land on a spare that had forked its process before the first
    # ended; every later one was submitted the moment the one before it ended, and its
    # process had the module from its spare supervisor
    for pid, had in runs[2:]:
        assert had and pid not in imported, (runs, imported)


def test_spares_forked_before_a_module_was_learnt_import_it_without_a_job(home, modules):
    with Scheduler(home) as s:
        s.submit(abs, -1).result(timeout=60)
        wait_for(lambda: len(waiting_spares(s)) == SPARES, timeout=60)
        assert run_function(s, modules)[1] is False
        # no job comes: every spare that waits has imported it, none is left without
        wait_for(
            lambda: (spares := waiting_spares(s)) and len(spares) == SPARES
            and spares <= importers(modules),
            timeout=60,
            what=lambda: (waiting_spares(s), importers(modules)),
        )  # fmt: skip
        # and the next job finds it imported
        pid, had = run_function(s, modules)
        assert had and pid not in importers(modules)

"""The package moved its modules into rooms; what names the old places still works: an
import, a pickle, and a job queued in a ledger before the move."""

from __future__ import annotations

import importlib
import json
import pickle
import sqlite3
import subprocess
import sys

import jupyter_dlsched as dls
from jupyter_dlsched._moved import MOVED
from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab import units


def test_every_old_name_imports_as_the_module_at_its_new_place():
    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old


def test_an_old_name_imports_in_a_fresh_interpreter_and_gives_one_module():
    code = (
        "import jupyter_dlsched.spec as old, jupyter_dlsched.vocab.spec as new; "
        "from jupyter_dlsched.runtime import progress; import jupyter_dlsched as dls; "
        "assert old is new and old.JobSpec is new.JobSpec and progress is dls.progress; "
        "print('same')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "same", out.stderr


def test_a_pickle_naming_old_places_loads():
    assert pickle.loads(b"cjupyter_dlsched.runtime\nprogress\n.") is dls.progress
    assert pickle.loads(b"cjupyter_dlsched.pool\nPoolInfo\n.") is dls.PoolInfo
    from jupyter_dlsched.forecast.run_times import RunTimes

    assert pickle.loads(b"cjupyter_dlsched.forecast\nRunTimes\n.") is RunTimes
    # where it lived before it had a module of its own
    assert pickle.loads(b"cjupyter_dlsched.forecast.replay\nRunTimes\n.") is RunTimes


def old_pickle(payload: dict) -> bytes:
    """``payload`` pickled as code before the move would have pickled it: every function
    of the package named by its old module."""
    data = pickle.dumps(payload, protocol=0)
    for old, new in MOVED.items():
        data = data.replace(f"c{new}\n".encode(), f"c{old}\n".encode())
    return data


def test_a_job_queued_in_a_ledger_written_before_the_move_runs(home):
    payload = {"fn": units.format_size, "args": (3 * 2**30,), "kwargs": {}}
    data = old_pickle(payload)
    assert b"cjupyter_dlsched.units\nformat_size" in data
    with Scheduler(home, agent=False, loop=False) as s:
        job_id = s.submit(units.format_size, 1, cpus=0.25).id
    ledger = sqlite3.connect(home / "ledger.sqlite")
    with ledger:
        [files] = ledger.execute("SELECT files FROM jobs WHERE id=?", (job_id,)).fetchone()
        blob = json.loads(files)["payload.pkl"]
        ledger.execute("UPDATE blobs SET data=? WHERE hash=?", (data, blob))
    ledger.close()
    with Scheduler(home, agent=False) as s:
        assert s.get(job_id).result(timeout=60) == units.format_size(3 * 2**30)


def test_an_old_name_or_a_room_never_replaces_a_public_function_of_the_package():
    """Unpickling ``jupyter_dlsched.pool`` (an old module name) made ``dls.pool`` that module,
    and importing the ``schedules`` room would make ``dls.schedules`` the package."""
    code = (
        "import pickle, jupyter_dlsched as dls\n"
        "import jupyter_dlsched.schedules\n"
        "pickle.loads(b'cjupyter_dlsched.pool\\nPoolInfo\\n.')\n"
        "print(callable(dls.pool), callable(dls.schedules), dls.torch.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True", "jupyter_dlsched.torch"], out.stderr

"""A notebook job over REST: a finished one says where its executed copy is."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_dlsched.scheduler import Scheduler

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def dls_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dlsched"
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def jp_server_config(dls_home: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}},
        "DlschedApp": {"home": str(dls_home), "sample_interval": 0.1},
    }


async def test_a_finished_notebook_job_names_its_executed_copy(
    jp_fetch: Any, dls_home: Path, tmp_path: Path
) -> None:
    source = tmp_path / "report.ipynb"
    nb = new_notebook(
        cells=[new_code_cell("n = 1", metadata={"tags": ["parameters"]}), new_code_cell("n")]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(nb, source)
    with Scheduler(home=dls_home) as s:
        h = s.submit_notebook(source, parameters={"n": 5}, cpus=0.5, begin="now+1s")
        response = await jp_fetch("dlsched", "api", "v1", "jobs", h.id)
        waiting = json.loads(response.body)
        assert waiting["kind"] == "notebook" and waiting["begin"] is not None
        assert waiting["notebook"] is None  # not started: no copy yet
        path = await asyncio.get_running_loop().run_in_executor(None, h.result, 240)
    response = await jp_fetch("dlsched", "api", "v1", "jobs", h.id)
    job = json.loads(response.body)
    assert job["notebook"] == {
        "input": str(source),
        "output": path,
        "parameters": {"n": 5},
        "kernel": "python3",
    }
    listed = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs")).body)["jobs"]
    assert [j["notebook"]["output"] for j in listed if j["id"] == h.id] == [path]

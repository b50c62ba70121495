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
from rest_cases import server_config

from jupyter_dlsched.client.scheduler import Scheduler

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
    return server_config(dls_home)


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
        "path": None,  # outside the server's folder: JupyterLab cannot open it by a path
    }
    listed = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs")).body)["jobs"]
    assert [j["notebook"]["output"] for j in listed if j["id"] == h.id] == [path]


async def test_the_dialog_reads_the_options_table_and_submits_a_notebook_of_the_folder(
    jp_fetch: Any, jp_root_dir: Path, dls_home: Path
) -> None:
    from tornado.httpclient import HTTPClientError

    from jupyter_dlsched.vocab.options import FLAG_OPTIONS

    options = json.loads((await jp_fetch("dlsched", "api", "v1", "options")).body)["options"]
    names = [o["name"] for o in options]
    assert names == [o.name for o in FLAG_OPTIONS if not o.pairs]
    assert {"gpus", "priority", "begin", "every", "time_limit"} <= set(names)

    (jp_root_dir / "runs").mkdir()
    nb = new_notebook(
        cells=[new_code_cell("n = 1", metadata={"tags": ["parameters"]}), new_code_cell("n * 2")]
    )
    nbformat.write(nb, jp_root_dir / "runs" / "train.ipynb")
    # values as the dialog sends them: the flags' text
    body = {
        "path": "runs/train.ipynb",
        "parameters": "n=21\n",
        "gpus": "1",
        "retries": "2",
        "priority": "high",
    }
    response = await jp_fetch(
        "dlsched", "api", "v1", "notebooks", method="POST", body=json.dumps(body)
    )
    assert response.code == 201
    job = json.loads(response.body)["job"]
    assert job["kind"] == "notebook" and job["priority"] == 100 and job["request"]["gpus"] == 1
    assert job["retries"] == 2
    with Scheduler(home=dls_home) as s:
        path = await asyncio.get_running_loop().run_in_executor(None, s.get(job["id"]).result, 240)
    assert Path(path).parent == (jp_root_dir / "runs").resolve()
    done = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs", job["id"])).body)
    assert done["notebook"]["path"] == f"runs/train.{job['id']}.ipynb"
    executed = nbformat.read(path, as_version=4)
    assert executed.cells[-1].outputs[0]["data"]["text/plain"] == "42"

    for bad, words in (
        ({"path": "../outside.ipynb"}, "outside the server's folder"),
        ({"path": "runs/train.ipynb", "preemptible": True}, "cannot go on"),
        ({"path": "runs/train.ipynb", "colour": "red"}, "unknown field"),
        ({"path": "runs/train.ipynb", "parameters": "21"}, "NAME=VALUE"),
        ({"path": "runs/train.ipynb", "retries": "two"}, "expected a whole number"),
    ):
        with pytest.raises(HTTPClientError) as error:
            await jp_fetch("dlsched", "api", "v1", "notebooks", method="POST", body=json.dumps(bad))
        assert error.value.code == 400
        assert words in error.value.response.body.decode()


async def test_the_last_run_of_a_schedule_carries_its_next_run(
    jp_fetch: Any, dls_home: Path
) -> None:
    with Scheduler(home=dls_home) as s:
        h = s.submit_command(["true"], every="1h", cpus=0.25)
        [schedule] = s.schedules()
        job = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs", h.id)).body)
        assert job["schedule"] == {"id": schedule.id, "every": "1h", "next_run": schedule.next_run}
        listed = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs")).body)["jobs"]
        assert [j.get("schedule") for j in listed] == [job["schedule"]]
        s.remove_schedule(schedule.id)

"""Scheduled cells across a kernel restart, in a real kernel driven like a front end (nbclient).

A job outlives its kernel; what the notebook shows of it must too: the saved output keeps
the job's id, last state and the command to re-attach, and a new kernel gets the live line
and the cell's ``--out`` names back.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def simulated(home, monkeypatch):
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return home


def client_for(nb: nbformat.NotebookNode, path) -> NotebookClient:
    return NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(path)}},
    )


def run(client: NotebookClient, nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """Append a cell and execute it in the client's kernel, as a user would."""
    nb.cells.append(new_code_cell(source))
    index = len(nb.cells) - 1
    client.execute_cell(nb.cells[index], index)
    return nb.cells[index]


def data_of(cell: nbformat.NotebookNode, mime: str) -> str:
    return "".join(str(o.get("data", {}).get(mime, "")) for o in cell.outputs)


def text_of(cell: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        if o.get("output_type") == "stream"
        else o.get("data", {}).get("text/plain", "")
        for o in cell.outputs
    )


def restart(client: NotebookClient) -> None:
    run_sync(client.km.restart_kernel)(now=True)
    run_sync(client.kc.wait_for_ready)(timeout=60)


def test_a_scheduled_cell_survives_a_restart_and_comes_back_with_attach(simulated, tmp_path):
    nb = new_notebook()
    client = client_for(nb, tmp_path)
    saved = tmp_path / "restart.ipynb"
    go = tmp_path / "go"
    with client.setup_kernel():
        run(client, nb, "%load_ext jupyter_dlsched")
        cell = run(
            client,
            nb,
            "%%schedule --name survivor --cpus 0.5 --out answer\n"
            # it runs on until the new kernel has attached to it (a fixed sleep ran out
            # first on a loaded machine, and the attach showed only the summary)
            f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
            "answer = 6 * 7\n",
        )
        job_id = re.search(r"attach (\w+)", data_of(cell, "text/plain")).group(1)
        # while other cells run, the status line moves on and its plain summary with it
        run(client, nb, "import time\ntime.sleep(3)")
        restart(client)
        nbformat.write(nb, saved)

        kept = nbformat.read(saved, as_version=4).cells[1]
        html, plain = data_of(kept, "text/html"), data_of(kept, "text/plain")
        assert job_id in html and job_id in plain
        assert "running" in html and "running" in plain  # the last state seen, not "queued"
        assert f"%dlsched attach {job_id}" in html and f"%dlsched attach {job_id}" in plain
        assert "survivor" in html

        # the new kernel knows nothing of the old one; the job runs on
        run(client, nb, "%load_ext jupyter_dlsched")
        attach = run(client, nb, f"%dlsched attach {job_id}")
        assert WIDGET in attach.outputs[0]["data"]  # a live line
        go.touch()
        waited = run(client, nb, f"%dlsched wait {job_id}")
        answer = run(client, nb, "answer")

    assert "done" in text_of(waited) and "set in this kernel: answer" in text_of(waited)
    assert text_of(answer) == "42"
    # the live line reached "done", then left a plain summary that needs no kernel
    statuses = [str(state.get("value", "")) for state in client.widget_state.values()]
    assert any("done in" in value and job_id in value for value in statuses)
    final = attach.outputs[0]["data"]
    assert WIDGET not in final and "done in" in final["text/html"]
    assert "answer returned" in final["text/plain"]


def test_outputs_and_wait_bring_a_finished_cells_names_into_a_fresh_kernel(simulated, tmp_path):
    first = new_notebook()
    client = client_for(first, tmp_path)
    with client.setup_kernel():
        run(client, first, "%load_ext jupyter_dlsched")
        cell = run(
            client,
            first,
            "%%schedule --cpus 0.5 --out model,history --wait\n"
            "model = {'w': 3}\nhistory = [0.9, 0.5]\n",
        )
        job_id = re.search(r"· (\w+)$", data_of(cell, "text/plain").strip()).group(1)

    fresh = new_notebook()
    client = client_for(fresh, tmp_path)
    with client.setup_kernel():
        run(client, fresh, "%load_ext jupyter_dlsched")
        shown = run(client, fresh, f"%dlsched outputs {job_id} --out history")
        only_history = run(client, fresh, "print('model' in globals(), history)")
        result = run(client, fresh, f"import jupyter_dlsched as dls\ndls.get('{job_id}').result()")
        waited = run(client, fresh, f"%dlsched wait {job_id}")
        both = run(client, fresh, "model['w'], history[-1]")

    assert text_of(shown).strip() == "set in this kernel: history"
    assert text_of(only_history).strip() == "False [0.9, 0.5]"
    assert text_of(result) == (
        f"CellResult(outputs: model, history — %dlsched wait {job_id} brings them into this kernel)"
    )
    assert "set in this kernel: model, history" in text_of(waited)
    assert text_of(both) == "(3, 0.5)"

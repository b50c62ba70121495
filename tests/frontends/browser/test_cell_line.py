"""A scheduled cell's line and a finished job's usage, in a real JupyterLab with a real kernel.

The cell's job outlives its kernel; so must what the cell shows: after a kernel restart and a
page reload, the line comes from the server (no "model not found"), moves on its own and says
"done" when the job ends, with no kernel at all.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_dlsched.client.scheduler import Scheduler

from .conftest import ARTIFACTS, Lab

SIDEBAR = "#jupyter-dlsched-sidebar"
LINE = ".jp-dlsched-jobline"
WIDGET = ".dlsched-jobview"  # the class the live ipywidget carries


def call(lab: Lab, path: str, method: str = "GET", body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{lab.url}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def saved_outputs(path: Path) -> list[dict[str, Any]]:
    """The outputs the notebook's file holds; none while Jupyter is half-way through writing it
    (a save truncates the file, then writes it: the caller reads again)."""
    try:
        notebook = nbformat.read(path, as_version=4)
    except ValueError:  # nbformat.reader.NotJSONError among them
        return []
    return [o for cell in notebook.cells for o in cell.get("outputs", [])]


def answer_kernel_question(page: Any) -> None:
    """JupyterLab may ask which kernel a notebook it has not seen before should use; the
    answer that has the focus is the kernel already started for it."""
    for _ in range(50):
        if page.locator("text=Select Kernel").count():
            page.keyboard.press("Enter")
            page.wait_for_selector("text=Select Kernel", state="detached")
            return
        page.wait_for_timeout(100)


def test_a_scheduled_cells_line_outlives_a_kernel_restart_and_a_page_reload(
    lab: Lab, submitter: Scheduler, browser_context: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    root = lab.home.parent / "root"
    notebook = root / "survivor.ipynb"
    nb = new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        cells=[
            new_code_cell("%load_ext jupyter_dlsched"),
            # runs until the test opens the gate (or five minutes, should the test die)
            new_code_cell(
                "%%schedule --name survivor --cpus 0.5\n"
                "import os, time\n"
                "for _ in range(1500):\n"
                f"    if os.path.exists({str(gate)!r}):\n"
                "        break\n"
                "    time.sleep(0.2)\n"
            ),
        ],
    )
    nbformat.write(nb, notebook)
    # the notebook's kernel, started as JupyterLab would (it then asks no kernel question)
    session = {"path": notebook.name, "type": "notebook", "name": "", "kernel": {"name": "python3"}}
    call(lab, "api/sessions", method="POST", body=session)
    page = browser_context.new_page()
    page.goto(f"{lab.url}lab/tree/survivor.ipynb?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    answer_kernel_question(page)

    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu .lm-Menu-itemLabel:text-is('Run All Cells')")

    # with its kernel alive the cell shows the live widget, through the line's renderer
    page.wait_for_selector(f".jp-dlsched-jobline-output {WIDGET}", timeout=60_000)
    [job] = submitter.jobs(state=["queued", "running"])
    assert page.is_hidden(f".jp-dlsched-jobline-output {LINE}")
    page.keyboard.press("Control+s")
    outputs: list[dict[str, Any]] = []
    for _ in range(100):
        outputs = saved_outputs(notebook)
        if any("application/vnd.dlsched.job+json" in o.get("data", {}) for o in outputs):
            break
        page.wait_for_timeout(100)
    assert any(o["data"].get("application/vnd.dlsched.job+json") == {"id": job.id} for o in outputs)

    # Kernel > Restart: the widget's model is gone with the kernel; the line takes its place
    page.click(".lm-MenuBar-itemLabel:text-is('Kernel')")
    page.click(".lm-Menu .lm-Menu-itemLabel:text-matches('^Restart Kernel')")
    page.click(".jp-Dialog .jp-mod-accept")
    page.wait_for_selector(f"{LINE}[data-state='running']", timeout=60_000)

    page.reload()
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    line = page.wait_for_selector(f"{LINE}[data-state='running']", timeout=60_000)
    assert "running on CPU" in line.inner_text()
    assert job.id in line.inner_text() and "survivor" in line.inner_text()
    assert page.query_selector(f"{LINE} button[data-action='cancel']") is not None
    # give the widget manager its chance to complain, then check that it did not
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.wait_for_timeout(3000)
    text = page.inner_text(".jp-Notebook")
    assert "model not found" not in text and "Error displaying widget" not in text
    assert page.query_selector(WIDGET) is None
    page.screenshot(path=str(ARTIFACTS / "cell-line-after-reload.png"))

    # no kernel at all: the line still follows the job to its end
    for kernel in call(lab, "api/kernels"):
        call(lab, f"api/kernels/{kernel['id']}", method="DELETE")
    assert call(lab, "api/kernels") == []
    gate.touch()
    done = page.wait_for_selector(f"{LINE}[data-state='succeeded']", timeout=60_000)
    assert done.inner_text().startswith("✔ done in")
    assert page.query_selector(f"{LINE} button[data-action='cancel']") is None
    assert "model not found" not in page.inner_text(".jp-Notebook")
    page.screenshot(path=str(ARTIFACTS / "cell-line-done.png"))


def test_a_finished_job_shows_what_it_used_under_recent(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    code = "x = bytearray(64 * 2**20); sum(range(2_000_000))"
    job = submitter.submit_command([sys.executable, "-c", code], name="measured", cpus=1, gpus=1)
    job.wait(timeout=60)
    usage = submitter.info(job.id).to_json()["usage"]
    assert usage["cpu_time"] is not None and usage["peak_rss"]
    page = browser_context.new_page()
    page.goto(f"{lab.url}lab?reset&token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    page.click(f'.lm-TabBar-tab[data-id="{SIDEBAR[1:]}"]')
    page.click(f"{SIDEBAR} .jp-dlsched-recent summary", timeout=30_000)

    used = page.wait_for_selector(
        f"{SIDEBAR} .jp-dlsched-job[data-job-id='{job.id}'] .jp-dlsched-usage", timeout=30_000
    )

    words = used.inner_text()
    assert words.startswith(f"{usage['gpu_hours']:.2f} GPU-h · CPU ")
    assert "peak RAM" in words and "MiB" in words
    assert "GPU-hours" in (used.get_attribute("title") or "")
    panel = page.eval_on_selector(SIDEBAR, "p => [p.scrollWidth, p.clientWidth]")
    assert panel[0] <= panel[1] <= 300, panel
    page.locator(SIDEBAR).screenshot(path=str(ARTIFACTS / "sidebar-usage.png"))

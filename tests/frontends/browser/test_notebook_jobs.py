""" "Run in the queue…" in a real browser: the file browser's menu item and the notebook's
toolbar button open the dialog; the job runs the notebook; the sidebar opens the result."""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from .conftest import ARTIFACTS, Lab, open_lab, show_sidebar


def test_run_in_the_queue_submits_a_notebook_and_the_sidebar_opens_the_result(
    lab: Lab, browser_context: Any
) -> None:
    root = lab.home.parent / "root"
    nb = new_notebook(
        cells=[
            new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
            new_code_cell('import os\nprint("gpu", os.environ["CUDA_VISIBLE_DEVICES"], n * 2)'),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(nb, root / "train.ipynb")
    page = browser_context.new_page()
    open_lab(page, lab)

    # the file browser's menu on the notebook
    item = page.wait_for_selector('.jp-DirListing-item[data-file-type="notebook"]', timeout=30_000)
    item.click(button="right")
    page.click('.lm-Menu-item:has-text("Run in the Queue…")')
    dialog = page.wait_for_selector(".jp-Dialog .jp-dlsched-run-form")
    assert "train.ipynb" in page.inner_text(".jp-Dialog")
    # the resource fields are the options table's
    for name in ("gpus", "cpus", "mem", "priority", "time_limit", "begin", "every"):
        assert page.query_selector(f'.jp-dlsched-run-form [name="{name}"]'), name
    page.fill('.jp-dlsched-run-form textarea[name="parameters"]', "n=21")
    page.fill('.jp-dlsched-run-form input[name="gpus"]', "1")
    dialog.screenshot(path=str(ARTIFACTS / "run-in-the-queue.png"))
    page.click('.jp-Dialog button:has-text("Queue it")')

    def jobs() -> list[dict[str, Any]]:
        return lab.api("dlsched/api/v1/jobs?state=succeeded,failed")["jobs"]

    deadline_rows = page.wait_for_function(
        "() => document.querySelector('#jupyter-dlsched-sidebar')", timeout=30_000
    )
    assert deadline_rows
    for _ in range(240):
        done = jobs()
        if done:
            break
        page.wait_for_timeout(500)
    [job] = done
    assert job["state"] == "succeeded", job
    assert job["kind"] == "notebook" and job["request"]["gpus"] == 1
    assert job["notebook"]["path"] == f"train.{job['id']}.ipynb"

    page.click("#jupyter-dlsched-sidebar .jp-dlsched-recent summary")
    opener = page.wait_for_selector(
        f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{job["id"]}"] '
        'button[data-action="open-notebook"]',
        timeout=30_000,
    )
    opener.click()
    tab = f'.lm-TabBar-tab:has-text("train.{job["id"]}.ipynb")'
    page.wait_for_selector(tab, timeout=30_000)
    output = page.wait_for_selector(
        f'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output:has-text("gpu {job["devices"][0]} 42")',
        timeout=30_000,
    )
    assert output
    page.screenshot(path=str(ARTIFACTS / "executed-notebook-opened.png"))

    # the notebook's own toolbar has the same dialog
    page.click(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-dlsched-run-notebook")
    page.wait_for_selector(".jp-Dialog .jp-dlsched-run-form")
    assert f"train.{job['id']}.ipynb" in page.inner_text(".jp-Dialog")
    page.click('.jp-Dialog button:has-text("Cancel")')
    page.wait_for_selector(".jp-Dialog", state="detached")
    assert json.dumps(lab.api("dlsched/api/v1/jobs")["jobs"]).count('"kind": "notebook"') == 1


def test_the_last_run_of_a_schedule_shows_when_the_next_one_comes(
    lab: Lab, browser_context: Any
) -> None:
    from jupyter_dlsched.client.scheduler import Scheduler

    s = Scheduler(home=lab.home, loop=False)
    try:
        job_id = s.submit_command(["true"], every="1h", cpus=0.25, name="hourly").id
        [schedule] = s.schedules()
        page = browser_context.new_page()
        open_lab(page, lab)
        show_sidebar(page)
        page.click("#jupyter-dlsched-sidebar .jp-dlsched-recent summary")
        words = page.wait_for_selector(
            f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{job_id}"] '
            ".jp-dlsched-next-run:not([hidden])",
            timeout=60_000,
        )
        assert re.fullmatch(r"next run in (59|60)m( \d+s)?", words.inner_text()), words.inner_text()
        assert schedule.id in (words.get_attribute("title") or "")
        s.remove_schedule(schedule.id)
    finally:
        s.close()

"""Daily use, the second hour: the dashboard through a kernel restart and a page reload and at
the width a notebook has beside the open sidebar, one cancel question in every view, one
notification for a run of failures, "Run again", and what a running job uses now (the lab,
browser and pages: ``conftest.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_dlsched.client.scheduler import Scheduler

from ..conftest import ARTIFACTS, Lab
from ..test_cell_line import answer_kernel_question, call, saved_outputs
from .conftest import SIDEBAR, python

BOARD = ".jp-dlsched-dashboard-output"
LINE = ".jp-dlsched-jobline"
SILENT = "import time; time.sleep(300)"
SESSION_NAME = "/home/anna/experiments/a-notebook-with-a-long-name.ipynb"
LONG_NAME = "resnet50-imagenet-lr0.003-warmup-cosine-label-smoothing-mixup-cutmix-ema-long-run"


def notebook(lab: Lab, name: str, *sources: str) -> Path:
    """A notebook in the lab's root with its kernel started, as JupyterLab would start it."""
    path = lab.home.parent / "root" / name
    nb = new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        cells=[new_code_cell(source) for source in sources],
    )
    nbformat.write(nb, path)
    session = {"path": name, "type": "notebook", "name": "", "kernel": {"name": "python3"}}
    call(lab, "api/sessions", method="POST", body=session)
    return path


def run_all(page: Any) -> None:
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    answer_kernel_question(page)
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu .lm-Menu-itemLabel:text-is('Run All Cells')")


def restart_kernel(page: Any) -> None:
    page.click(".lm-MenuBar-itemLabel:text-is('Kernel')")
    page.click(".lm-Menu .lm-Menu-itemLabel:text-matches('^Restart Kernel')")
    page.click(".jp-Dialog .jp-mod-accept")


def reload(page: Any) -> None:
    page.reload()
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)


def save_and_wait_for(page: Any, path: Path, mime: str) -> None:
    """Save, and wait until the file has new outputs with ``mime`` (an output saved earlier
    with it, of a kernel since restarted, is not this one: a reload would show it)."""
    before = saved_outputs(path)
    page.keyboard.press("Control+s")
    for _ in range(600):  # a minute, for a loaded machine
        outputs = saved_outputs(path)
        if outputs != before and any(mime in o.get("data", {}) for o in outputs):
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"{path.name} was not saved with {mime}")


def no_broken_widget(page: Any) -> None:
    text = page.inner_text(".jp-Notebook")
    assert "model not found" not in text and "Error displaying widget" not in text


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.eval_on_selector(
        selector,
        """node => { const r = node.getBoundingClientRect();
                     return { left: r.left, right: r.right, width: r.width }; }""",
    )
    assert found["width"] > 0, selector
    return found


def fits_in_output(page: Any, selector: str) -> None:
    """Every element ``selector`` matches lies within the cell's output area."""
    boxes = page.eval_on_selector_all(
        selector,
        """nodes => nodes.map(node => {
            const area = node.closest('.jp-OutputArea-output').getBoundingClientRect();
            const r = node.getBoundingClientRect();
            return { left: r.left, right: r.right, width: r.width,
                     areaLeft: area.left, areaRight: area.right };
        })""",
    )
    assert boxes, selector
    for b in boxes:
        assert b["width"] > 0, (selector, b)
        assert b["areaLeft"] - 0.5 <= b["left"] and b["right"] <= b["areaRight"] + 0.5, (
            selector,
            b,
        )


# -- the dashboard --------------------------------------------------------------------------


def test_the_dashboard_fits_beside_the_sidebar_asks_before_cancelling_and_outlives_its_kernel(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    running = python(submitter, SILENT, LONG_NAME, gpus=1, priority="high")
    other = python(submitter, SILENT, f"{LONG_NAME}-b", gpus=1)
    waiting = python(submitter, SILENT, f"{LONG_NAME}-queued", gpus=2, priority=25)
    path = notebook(lab, "board.ipynb", "import jupyter_dlsched as dls\ndls.dashboard()")
    page = new_page("lab/tree/board.ipynb")
    run_all(page)

    # the live widget, through the dashboard's renderer
    page.wait_for_selector(f"{BOARD}[data-view='live'] .dlsched-dashboard", timeout=60_000)
    for job in (running, other, waiting):
        page.wait_for_selector(f"{BOARD} .dlsched-dashboard :text('{job}')", timeout=30_000)
    assert page.is_visible(f"{SIDEBAR}")
    # at 1400 px with the sidebar open, the table and every button lie within the output
    table = f"{BOARD} .dlsched-dashboard > .widget-gridbox"  # the queue (recent is folded)
    fits_in_output(page, table)
    fits_in_output(page, f"{table} button")
    fits_in_output(page, f"{BOARD} .dlsched-dashboard .dlsched-gpu")
    assert len(page.query_selector_all(f"{table} button")) == 3 * 4
    for button in page.query_selector_all(f"{table} button"):
        assert button.is_visible()
    # a long name is cut to its column, whole in its tooltip
    fits_in_output(page, f"{BOARD} .dlsched-dashboard div[title='{LONG_NAME}']")
    page.screenshot(path=str(ARTIFACTS / "dashboard-beside-sidebar.png"))

    # ✕ asks with the sidebar's words; "Keep it" keeps the job, "Cancel job" cancels it
    cancel = f"{BOARD} .dlsched-dashboard button[title='Cancel this job']"
    # running jobs come newest first: the first row is the second job
    page.locator(cancel).first.click()
    question = page.wait_for_selector(f"{BOARD} .dlsched-confirm", state="visible", timeout=60_000)
    assert f"Cancel job {other}?" in question.inner_text()
    assert "will be stopped and will not be retried." in question.inner_text()
    page.click(f"{BOARD} .dlsched-confirm button:text-is('Keep it')")
    page.wait_for_selector(f"{BOARD} .dlsched-confirm", state="hidden", timeout=60_000)
    page.wait_for_timeout(1500)
    assert submitter.info(other).state == "running"
    page.locator(cancel).first.click()
    page.click(f"{BOARD} .dlsched-confirm button:text-is('Cancel job')")
    assert submitter.get(other).wait(timeout=60).state == "cancelled"

    save_and_wait_for(page, path, "application/vnd.dlsched.dashboard+json")

    # Kernel > Restart: a clean snapshot under a note, never a broken widget
    restart_kernel(page)
    note = page.wait_for_selector(
        f"{BOARD}[data-view='snapshot'] .jp-dlsched-dashboard-note", timeout=60_000
    )
    assert note.inner_text() == "kernel restarted: run the cell again for a live view"
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.wait_for_timeout(2000)
    no_broken_widget(page)
    assert page.query_selector(f"{BOARD} .dlsched-dashboard") is None
    assert page.is_visible(f"{BOARD} table.dlsched-queue")

    # and after a reload of the page the same, from what the notebook saved
    reload(page)
    note = page.wait_for_selector(
        f"{BOARD}[data-view='snapshot'] .jp-dlsched-dashboard-note", timeout=60_000
    )
    if not page.is_visible(SIDEBAR):  # the restored layout may have it open already
        page.click(f'.lm-TabBar-tab[data-id="{SIDEBAR[1:]}"]')
    page.wait_for_selector(f"{SIDEBAR} .jp-dlsched-gpu", timeout=30_000)
    page.wait_for_function(
        "n => !n.textContent.includes('looking')", arg=note.as_element(), timeout=30_000
    )
    assert "run the cell again for a live view" in note.inner_text()
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.wait_for_timeout(2000)
    no_broken_widget(page)
    assert page.query_selector(f"{BOARD} .dlsched-dashboard") is None
    assert page.query_selector_all(".jp-OutputArea-output img") == []  # no broken images
    table = f"{BOARD} table.dlsched-queue"
    page.wait_for_selector(f"{table} td[title='{LONG_NAME}']", timeout=60_000)
    fits_in_output(page, table)
    page.screenshot(path=str(ARTIFACTS / "dashboard-after-reload.png"))

    # running the cell again brings the live view back
    page.click(".jp-Notebook .jp-Cell .jp-InputArea-editor")
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector(f"{BOARD}[data-view='live'] .dlsched-dashboard", timeout=60_000)

    # a reload while that kernel still holds the panel: the live panel again, never broken
    save_and_wait_for(page, path, "application/vnd.dlsched.dashboard+json")
    reload(page)
    page.wait_for_selector(f"{BOARD}[data-view='live'] .dlsched-dashboard", timeout=60_000)
    page.wait_for_timeout(2000)
    no_broken_widget(page)


# -- the cell's line --------------------------------------------------------------------------


def test_the_cell_line_asks_before_cancelling_and_runs_an_ended_job_again(
    lab: Lab, submitter: Scheduler, new_page: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    notebook(
        lab,
        "line.ipynb",
        "%load_ext jupyter_dlsched",
        "%%schedule --name held --cpus 0.5\n"
        "import os, time\n"
        "for _ in range(1500):\n"
        f"    if os.path.exists({str(gate)!r}):\n"
        "        break\n"
        "    time.sleep(0.2)\n",
    )
    page = new_page("lab/tree/line.ipynb")
    run_all(page)

    # with its kernel: the notebook widget asks in its own bar, with the same words
    page.wait_for_selector(".jp-dlsched-jobline-output .dlsched-jobview", timeout=60_000)
    [job] = submitter.jobs(state=["queued", "running"])
    page.click(".dlsched-jobview button:text-is('Cancel')")
    question = page.wait_for_selector(".dlsched-jobview .dlsched-confirm", state="visible")
    assert f"Cancel job {job.id}?" in question.inner_text()
    page.click(".dlsched-jobview .dlsched-confirm button:text-is('Keep it')")
    page.wait_for_selector(".dlsched-jobview .dlsched-confirm", state="hidden")
    page.wait_for_timeout(1500)
    assert submitter.info(job.id).state in ("queued", "running")

    # without it (restarted): the line from the server asks in JupyterLab's dialog
    restart_kernel(page)
    page.wait_for_selector(f"{LINE}[data-state='running']", timeout=60_000)
    page.click(f"{LINE} button[data-action='cancel']")
    dialog = page.wait_for_selector(".jp-Dialog")
    assert f"Cancel job {job.id}?" in dialog.inner_text()
    assert "held (running) will be stopped and will not be retried." in dialog.inner_text()
    page.click(".jp-Dialog button:has-text('Keep it')")
    page.wait_for_selector(".jp-Dialog", state="detached")
    page.wait_for_timeout(1500)
    assert submitter.info(job.id).state == "running"
    page.click(f"{LINE} button[data-action='cancel']")
    page.click(".jp-Dialog button:has-text('Cancel job')")
    assert submitter.get(job.id).wait(timeout=60).state == "cancelled"

    # the ended job runs again: a new job, which the line follows from then on
    again = page.wait_for_selector(
        f"{LINE}[data-state='cancelled'] button[data-action='run-again']"
    )
    again.click()
    page.wait_for_function(
        "([sel, old]) => { const n = document.querySelector(sel);"
        " return n && n.dataset.jobId && n.dataset.jobId !== old; }",
        arg=[LINE, job.id],
        timeout=30_000,
    )
    fresh = page.get_attribute(LINE, "data-job-id")
    assert fresh and fresh != job.id
    assert f"run again of job {job.id}" in page.inner_text(LINE)
    info = submitter.info(fresh)
    assert info.name == "held" and info.state in ("queued", "running")
    assert submitter.info(job.id).state == "cancelled"
    gate.touch()
    page.wait_for_selector(f"{LINE}[data-state='succeeded']", timeout=90_000)


def test_a_failed_cell_runs_again_from_under_its_summary(
    lab: Lab, submitter: Scheduler, new_page: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    notebook(
        lab,
        "flaky.ipynb",
        "%load_ext jupyter_dlsched",
        "%%schedule --name flaky --cpus 0.5\n"
        "import os\n"
        f"if not os.path.exists({str(gate)!r}):\n"
        "    raise RuntimeError('the data is not there yet')\n",
    )
    page = new_page("lab/tree/flaky.ipynb")
    run_all(page)

    # the kernel is alive and the job failed: its summary, and under it what can be done
    again = page.wait_for_selector(
        f"{LINE}[data-state='ended'] button[data-action='run-again']", timeout=90_000
    )
    [old] = [job for job in submitter.jobs(state=["failed"]) if job.name == "flaky"]
    output = page.inner_text(".jp-dlsched-jobline-output")
    assert "failed" in output and "the data is not there yet" in output
    no_broken_widget(page)
    page.screenshot(path=str(ARTIFACTS / "cell-failed-run-again.png"))

    gate.touch()
    again.click()
    line = page.wait_for_selector(f"{LINE}[data-state='succeeded']", timeout=90_000)
    fresh = line.get_attribute("data-job-id")
    assert fresh and fresh != old.id
    assert f"run again of job {old.id}" in line.inner_text()
    assert submitter.info(fresh).name == "flaky"
    assert submitter.info(old.id).state == "failed"


# -- the sidebar ------------------------------------------------------------------------------


def test_run_again_in_the_sidebar_queues_a_new_job_like_the_failed_one(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    failed = python(submitter, "raise SystemExit(3)", "eval-broken", cpus=1)
    submitter.get(failed).wait(timeout=60)
    page = new_page()
    page.click(f"{SIDEBAR} .jp-dlsched-recent summary")
    row = f"{SIDEBAR} .jp-dlsched-job[data-job-id='{failed}']"
    page.wait_for_selector(f"{row}[data-state='failed']", timeout=30_000)
    # running jobs have no such button; ended ones do
    page.click(f"{row} button[data-action='run-again']")
    fresh = page.wait_for_selector(
        f"{SIDEBAR} .jp-dlsched-queue .jp-dlsched-job .jp-dlsched-name:text-is('eval-broken'), "
        f"{SIDEBAR} .jp-dlsched-recent .jp-dlsched-job:not([data-job-id='{failed}'])"
        " .jp-dlsched-name:text-is('eval-broken')",
        timeout=30_000,
    )
    new_id = fresh.evaluate("n => n.closest('.jp-dlsched-job').dataset.jobId")
    assert new_id != failed
    again = submitter.info(new_id)
    assert again.name == "eval-broken" and again.cpus == 1
    assert submitter.info(failed).state == "failed"


def test_the_sidebar_shows_what_a_running_job_uses_now_and_hides_it_when_unmeasured(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    measured = python(submitter, SILENT, "measured", cpus=1)
    unmeasured = python(submitter, SILENT, "unmeasured", cpus=1)

    def readings(page: Any) -> None:
        # the server's job list with the supervisor's live readings for one job (the ledger
        # of this version may not carry them yet; the sidebar must read them where it does)
        def fill(route: Any) -> None:
            response = route.fetch()
            body = response.json()
            for job in body.get("jobs", []):
                if job["id"] == measured:
                    job.update(cpu_now=180.4, rss_now=int(1.2 * 2**30))
                elif job["id"] == unmeasured:
                    job.update(cpu_now=None, rss_now=None)
            route.fulfill(response=response, json=body)

        page.route(re.compile(r"/dlsched/api/v1/jobs\?"), fill)

    page = new_page(setup=readings)
    using = page.wait_for_selector(
        f"{SIDEBAR} .jp-dlsched-job[data-job-id='{measured}'] .jp-dlsched-using:not([hidden])",
        timeout=30_000,
    )
    assert using.inner_text() == "cpu 180% · 1.2 GiB"
    page.wait_for_selector(f"{SIDEBAR} .jp-dlsched-job[data-job-id='{unmeasured}']")
    assert page.is_hidden(
        f"{SIDEBAR} .jp-dlsched-job[data-job-id='{unmeasured}'] .jp-dlsched-using"
    )
    panel = page.eval_on_selector(SIDEBAR, "p => [p.scrollWidth, p.clientWidth]")
    assert panel[0] <= panel[1], panel


# -- notifications ----------------------------------------------------------------------------


def test_four_failures_one_after_another_bring_one_notification_with_the_count(
    lab: Lab, submitter: Scheduler, new_page: Any, settings: Any
) -> None:
    # no grouping window at all: each failure ends well after the previous one
    settings({"groupWindow": 0})
    page = new_page()
    for n in range(4):
        submitter.submit_command(["false"], name=f"sweep[{n}]", cpus=1).wait(timeout=60)
        words = "failed" if n == 0 else f"{n + 1} jobs failed"
        page.wait_for_selector(f".Toastify__toast:has-text('{words}')", timeout=60_000)
        page.wait_for_timeout(1000)
    toasts = [t.inner_text() for t in page.query_selector_all(".Toastify__toast")]
    assert len(toasts) == 1, toasts
    assert "4 jobs failed: sweep[0], sweep[1], sweep[2], …" in toasts[0]
    page.screenshot(path=str(ARTIFACTS / "notification-failures-grouped.png"))

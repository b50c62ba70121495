"""Daily use, the third hour: the dashboard beside a kernel that is busy training, and the
quickstart as a new user runs it (the lab, browser and pages: ``conftest.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jupyter_dlsched.client.scheduler import Scheduler

from ..conftest import ARTIFACTS, Lab
from ..test_cell_line import call
from .test_daily_use_2 import BOARD, no_broken_widget, notebook, reload, restart_kernel, run_all

QUICKSTART = Path(__file__).parents[4] / "notebooks" / "quickstart.ipynb"
LIVE = f"{BOARD}[data-view='live'] .dlsched-dashboard"
SNAPSHOT = f"{BOARD} .dlsched-dashboard-snapshot"
BUSY = ".jp-Notebook-ExecutionIndicator[data-status='busy']"
IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"

BOARD_CELL = "import time\nimport jupyter_dlsched as dls\nboard = dls.dashboard()\nboard"
TRAIN_CELL = (
    "def w(s):\n    time.sleep(s)\n\n"
    "hs = [dls.submit(w, 3, gpus=1) for i in range(6)]\ntime.sleep(25)"
)


def every_cell_ran(page: Any) -> None:
    """Wait until each code cell has run (an execution count in its prompt)."""
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
                 .every(p => /\\[\\d+\\]/.test(p.textContent))""",
        timeout=240_000,
    )


def wait_live(page: Any, timeout: int) -> None:
    """Wait for the live panel; a timeout says what the output showed instead."""
    try:
        page.wait_for_selector(LIVE, timeout=timeout)
    except Exception as error:
        shown = page.eval_on_selector(BOARD, "n => [n.dataset.view, n.innerText.slice(0, 300)]")
        raise AssertionError(f"no live dashboard: {shown}") from error


def one_board(page: Any) -> None:
    """One dashboard shown in the output: the live panel or one snapshot, never a pile."""
    assert len(page.query_selector_all(BOARD)) == 1
    shown = "nodes => nodes.filter(n => n.checkVisibility()).length"
    live = page.eval_on_selector_all(f"{BOARD} .dlsched-dashboard", shown)
    snapshots = page.eval_on_selector_all(SNAPSHOT, shown)
    assert (live, snapshots) in ((1, 0), (0, 1)), (live, snapshots)


def test_the_dashboard_stays_live_beside_a_busy_kernel_and_never_piles_up_snapshots(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    path = notebook(lab, "busy-board.ipynb", BOARD_CELL, TRAIN_CELL)
    page = new_page(f"lab/tree/{path.name}")
    run_all(page)
    page.wait_for_selector(BUSY, timeout=60_000)
    # the second cell trains (sleeps) for 25 s: the kernel is busy, and it holds the panel
    wait_live(page, 20_000)
    for _ in range(4):  # the jobs move through the queue, the kernel updates the snapshot
        page.wait_for_timeout(4000)
        one_board(page)
        assert page.is_visible(LIVE)
    page.screenshot(path=str(ARTIFACTS / "dashboard-busy-kernel.png"))
    page.wait_for_selector(IDLE, timeout=60_000)
    page.wait_for_timeout(6000)
    one_board(page)
    assert page.is_visible(LIVE)
    no_broken_widget(page)

    # a restart: one snapshot under one true note
    restart_kernel(page)
    note = page.wait_for_selector(
        f"{BOARD}[data-view='snapshot'] .jp-dlsched-dashboard-note", timeout=60_000
    )
    page.wait_for_selector(IDLE, timeout=60_000)
    page.wait_for_timeout(6000)
    assert note.inner_text() == "kernel restarted: run the cell again for a live view"
    one_board(page)
    no_broken_widget(page)

    # Run All again, then a reload of the page while the kernel trains: the snapshot says it
    # looks for the live view, and the live panel comes back when the kernel can answer
    run_all(page)
    wait_live(page, 60_000)
    page.wait_for_selector(BUSY, timeout=60_000)
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1000)
    reload(page)
    page.wait_for_selector(BOARD, timeout=60_000)
    for _ in range(3):
        page.wait_for_timeout(3000)
        one_board(page)
    wait_live(page, 60_000)
    page.wait_for_timeout(6000)
    one_board(page)
    no_broken_widget(page)
    page.screenshot(path=str(ARTIFACTS / "dashboard-after-busy-reload.png"))


def test_the_quickstart_run_all_shows_no_widget_stuck_loading(
    lab: Lab, submitter: Scheduler, new_page: Any, tmp_path: Path
) -> None:
    name = "quickstart-run.ipynb"
    shutil.copy(QUICKSTART, lab.home.parent / "root" / name)
    session = {"path": name, "type": "notebook", "name": "", "kernel": {"name": "python3"}}
    call(lab, "api/sessions", method="POST", body=session)
    page = new_page(f"lab/tree/{name}")
    run_all(page)
    every_cell_ran(page)
    page.wait_for_timeout(5000)
    cell = page.locator(".jp-Notebook .jp-Cell", has_text="--name cell-demo")
    cell.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "quickstart-cell-job.png"))
    stuck = page.locator(".jp-Notebook .jp-Cell", has_text="Loading widget...")
    if stuck.count():
        stuck.first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "quickstart-widget-stuck.png"))
    assert stuck.count() == 0, [stuck.nth(i).inner_text() for i in range(stuck.count())]
    no_broken_widget(page)
    one_board(page)

"""The JupyterLab sidebar in a real browser: real server, real ledger, real jobs."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from jupyter_dlsched.client.scheduler import Scheduler

from .conftest import (
    ARTIFACTS,
    Lab,
    open_lab,
    open_sidebar,
    row,
    show_sidebar,
    sleeper,
    start_lab,
    stop_lab,
)

HOSTILE_NAME = '<img src=x onerror="window.__dlschedXss=1">'


def test_sidebar_shows_the_queue_and_cancelling_moves_it(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    big = sleeper(submitter, "big-run", gpus=2)
    small = sleeper(submitter, HOSTILE_NAME, gpus=1, priority="high")
    page = browser_context.new_page()
    open_lab(page, lab)

    open_sidebar(page)
    page.wait_for_selector(row(big, "running"), timeout=30_000)
    page.wait_for_selector(row(small, "queued"))
    cards = page.query_selector_all("#jupyter-dlsched-sidebar .jp-dlsched-gpu")
    assert len(cards) == 2
    assert all("simulated" in card.inner_text() for card in cards)
    # a job's name is shown as text, never run as markup
    assert page.inner_text(f"{row(small, 'queued')} .jp-dlsched-name") == HOSTILE_NAME
    assert page.evaluate("window.__dlschedXss") is None
    assert "waiting for" in page.inner_text(row(small, "queued"))
    status = page.wait_for_selector(".jp-dlsched-status")
    page.wait_for_function(
        "() => document.querySelector('.jp-dlsched-status').textContent === 'GPU 2/2 · 1 queued'"
    )
    page.screenshot(path=str(ARTIFACTS / "sidebar-running-and-queued.png"))
    status.screenshot(path=str(ARTIFACTS / "statusbar.png"))

    page.click(f'{row(big, "running")} button[data-action="cancel"]')
    page.click(".jp-Dialog .jp-mod-accept.jp-mod-warn")

    page.wait_for_selector(row(big, "cancelled"), state="attached", timeout=30_000)
    page.wait_for_selector(row(small, "running"), timeout=30_000)
    page.wait_for_function(
        "() => document.querySelector('.jp-dlsched-status').textContent === 'GPU 1/2 · 0 queued'"
    )
    page.click("#jupyter-dlsched-sidebar .jp-dlsched-recent summary")
    assert "cancelled" in page.inner_text(row(big, "cancelled"))
    assert submitter.info(big).state == "cancelled"
    page.locator("#jupyter-dlsched-sidebar").screenshot(
        path=str(ARTIFACTS / "sidebar-after-cancel.png")
    )


def test_clicking_a_job_opens_its_live_log_and_endings_are_notified(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    job_id = sleeper(submitter, "log-me", gpus=1)
    page = browser_context.new_page()
    open_lab(page, lab)
    open_sidebar(page)

    page.click(f"{row(job_id, 'running')} .jp-dlsched-name", timeout=30_000)

    log = page.wait_for_selector(".jp-dlsched-log-text")
    page.wait_for_function(
        "() => document.querySelector('.jp-dlsched-log-text').textContent.includes('training started')",
        timeout=30_000,
    )
    assert "training started" in log.inner_text()
    assert re.search(r"log-me", page.inner_text(".jp-dlsched-log-header"))
    page.screenshot(path=str(ARTIFACTS / "job-log.png"))

    # a job of this user that ends while the page watches brings a notification
    quick = submitter.submit_command(
        [sys.executable, "-c", "import time; time.sleep(3)"], name="quick-one", cpus=1
    ).id
    toast = page.wait_for_selector(f"text=Job quick-one ({quick}) done", timeout=30_000)
    assert toast is not None
    page.screenshot(path=str(ARTIFACTS / "notification.png"))


def test_a_missing_server_part_is_explained(tmp_path: Path, browser_context: Any) -> None:
    lab = start_lab(
        tmp_path / "lab",
        server_config={"ServerApp": {"jpserver_extensions": {"jupyter_dlsched": False}}},
    )
    try:
        page = browser_context.new_page()
        open_lab(page, lab)
        show_sidebar(page)

        message = page.wait_for_selector(".jp-dlsched-message-error", timeout=30_000)

        assert "server extension" in message.inner_text()
        page.wait_for_function(
            "() => document.querySelector('.jp-dlsched-status').textContent.includes('missing')"
        )
        page.screenshot(path=str(ARTIFACTS / "server-part-missing.png"))
    finally:
        stop_lab(lab)

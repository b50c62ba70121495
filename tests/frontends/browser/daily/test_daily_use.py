"""What a daily user of the sidebar sees: a narrow panel that fits, logs that say when they are
empty, and one notification for a whole sweep (the lab, browser and pages: ``conftest.py``).
"""

from __future__ import annotations

from typing import Any

from jupyter_dlsched.client.scheduler import Scheduler

from ..conftest import ARTIFACTS, Lab, row
from .conftest import SIDEBAR, python

NOTEBOOK = SESSION_NAME = "/home/anna/experiments/lr-sweep.ipynb"
# A program that reports progress like a training loop, then keeps running.
TRAINING = "import time, jupyter_dlsched as dls\ndls.progress(7, 10, loss=0.31)\ntime.sleep(300)\n"
SILENT = "import time; time.sleep(300)"


def toasts(page: Any) -> list[str]:
    return [t.inner_text() for t in page.query_selector_all(".Toastify__toast")]


def horizontal_overflow(page: Any) -> dict[str, int]:
    return page.evaluate(
        f"""() => {{
            const panel = document.querySelector('{SIDEBAR}');
            return {{
                scrollWidth: panel.scrollWidth,
                clientWidth: panel.clientWidth,
                scrollLeft: panel.scrollLeft
            }};
        }}"""
    )


def fits(page: Any, selector: str) -> bool:
    """The element's text is shown whole: inside the panel and not cut off by an ellipsis."""
    return bool(
        page.evaluate(
            """([panelSelector, selector]) => {
                const panel = document.querySelector(panelSelector).getBoundingClientRect();
                const node = document.querySelector(selector);
                const range = document.createRange();
                range.selectNodeContents(node);
                const text = range.getBoundingClientRect();
                return text.width > 0 && text.left >= panel.left && text.right <= panel.right
                    && node.scrollWidth <= node.clientWidth + 1;
            }""",
            [SIDEBAR, selector],
        )
    )


def test_the_sidebar_at_its_default_width_shows_every_job_without_sideways_scrolling(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    prepared = submitter.submit_command(["true"], name="prepare-data", cpus=1)
    broken = python(submitter, "raise SystemExit(3)", "eval-old", cpus=1, priority="low")
    training = python(submitter, TRAINING, "resnet-lr3", gpus=1, priority="high")
    other = python(submitter, SILENT, "bert-base", gpus=1)
    waiting = python(submitter, SILENT, "sweep-7", gpus=2, priority=25)
    prepared.wait(timeout=60)
    submitter.get(broken).wait(timeout=60)
    page = new_page()
    page.click(f"{SIDEBAR} .jp-dlsched-recent summary")

    page.wait_for_selector(row(training, "running"), timeout=30_000)
    page.wait_for_selector(row(other, "running"), timeout=30_000)
    page.wait_for_selector(row(waiting, "queued"))
    page.wait_for_selector(f"{row(training)} .jp-dlsched-progress .jp-dlsched-bar", timeout=30_000)

    # the panel is at JupyterLab's default width, and nothing in it is wider
    overflow = horizontal_overflow(page)
    assert overflow["clientWidth"] <= 300, overflow
    assert overflow["scrollWidth"] <= overflow["clientWidth"], overflow
    expected = {
        training: ("running", "resnet-lr3", "high", "1 GPU"),
        other: ("running", "bert-base", "normal", "1 GPU"),
        waiting: ("queued", "sweep-7", "priority 25", "2 GPU"),
        prepared.id: ("done", "prepare-data", "normal", "1 CPU"),
        broken: ("failed", "eval-old", "low", "1 CPU"),
    }
    for job_id, (chip, name, priority, request) in expected.items():
        assert page.inner_text(f"{row(job_id)} .jp-dlsched-chip") == chip
        assert page.inner_text(f"{row(job_id)} .jp-dlsched-name") == name
        assert page.inner_text(f"{row(job_id)} .jp-dlsched-priority") == priority
        assert request in page.inner_text(f"{row(job_id)} .jp-dlsched-request")
        for part in ("chip", "name", "priority", "request", "id"):
            assert fits(page, f"{row(job_id)} .jp-dlsched-{part}"), (job_id, part)
    assert page.inner_text(f"{row(training)} .jp-dlsched-progress") == "70%"
    assert fits(page, f"{row(training)} .jp-dlsched-progress")
    assert page.inner_text(f"{row(training)} .jp-dlsched-metric") == "loss 0.31"
    assert "waiting for" in page.inner_text(f"{row(waiting)} .jp-dlsched-why")
    assert "exit code 3" in page.inner_text(f"{row(broken)} .jp-dlsched-why")

    # the notebook by its file name; the full path in the tooltip
    owner = page.query_selector(f"{row(training)} .jp-dlsched-owner")
    assert owner.inner_text().endswith("lr-sweep.ipynb")
    assert NOTEBOOK not in owner.inner_text()
    assert NOTEBOOK in owner.get_attribute("title")

    page.locator(SIDEBAR).screenshot(path=str(ARTIFACTS / "sidebar-default-width.png"))

    # opening a log and closing it again leaves the panel where it was
    page.click(f"{row(training)} .jp-dlsched-name")
    page.wait_for_selector(".jp-dlsched-log-header .jp-dlsched-chip")
    page.click(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon")
    page.wait_for_selector(".jp-dlsched-log", state="detached")
    overflow = horizontal_overflow(page)
    assert overflow["scrollLeft"] == 0, overflow
    assert overflow["scrollWidth"] <= overflow["clientWidth"], overflow
    assert fits(page, f"{row(training)} .jp-dlsched-chip")

    # the next poll patches the rows in place: no row leaves the page, so a button that holds
    # the keyboard focus keeps it, and the buttons are the very same elements
    raise_button = f"{row(other)} button[data-action='raise']"
    page.eval_on_selector(raise_button, "node => { node.dataset.marked = 'yes'; }")
    page.evaluate(
        """(selector) => {
            window.__removedRows = 0;
            new MutationObserver(records => {
                for (const record of records) {
                    window.__removedRows += record.removedNodes.length;
                }
            }).observe(document.querySelector(selector), { childList: true });
        }""",
        f"{SIDEBAR} .jp-dlsched-queue .jp-dlsched-jobs",
    )
    ran = page.inner_text(f"{row(other)} .jp-dlsched-ran")
    page.wait_for_function(
        "([selector, ran]) => document.querySelector(selector).textContent !== ran",
        arg=[f"{row(other)} .jp-dlsched-ran", ran],
        timeout=30_000,
    )
    assert page.get_attribute(raise_button, "data-marked") == "yes"
    assert page.evaluate("() => window.__removedRows") == 0


def test_the_log_of_a_job_that_printed_nothing_says_so(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    silent = python(submitter, SILENT, "quiet-run", cpus=1)
    ended = submitter.submit_command(["true"], name="quiet-end", cpus=1)
    ended.wait(timeout=60)
    page = new_page()

    page.click(f"{row(silent, 'running')} .jp-dlsched-name", timeout=30_000)
    empty = page.wait_for_selector(".jp-dlsched-log-empty:not([hidden])", timeout=30_000)
    page.wait_for_function(
        "() => document.querySelector('.jp-dlsched-log-empty').textContent === 'no output yet'"
    )
    assert empty.inner_text() == "no output yet"
    assert page.inner_text(".jp-dlsched-log-text") == ""

    page.click(f"{SIDEBAR} .jp-dlsched-recent summary")
    page.click(f"{row(ended.id, 'succeeded')} .jp-dlsched-name")
    page.wait_for_selector(
        ".lm-DockPanel .jp-dlsched-log-empty:text('the job printed nothing')", timeout=30_000
    )


def test_a_sweep_of_ten_jobs_brings_one_notification(
    lab: Lab, submitter: Scheduler, new_page: Any
) -> None:
    page = new_page()  # has had its first look: what ends from now on is news

    for n in range(9):
        submitter.submit_command(["true"], name=f"sweep-{n}", cpus=1)
    submitter.submit_command(["false"], name="sweep-9", cpus=1)

    page.wait_for_selector(
        ".Toastify__toast:has-text('10 jobs finished: 9 done, 1 failed')", timeout=60_000
    )
    assert toasts(page) == [page.inner_text(".Toastify__toast")]
    page.screenshot(path=str(ARTIFACTS / "notification-grouped.png"))
    page.click(".Toastify__toast button:has-text('Show jobs')")
    page.wait_for_selector(f"{SIDEBAR} .jp-dlsched-recent[open]")


def test_the_setting_turns_finish_notifications_off(
    lab: Lab, submitter: Scheduler, new_page: Any, settings: Any
) -> None:
    notified = new_page()
    settings({"notifyFinished": False})
    quiet = new_page()  # reads the settings as it loads

    job = submitter.submit_command(["true"], name="setting-check", cpus=1).id

    # the page that loaded with notifications on tells; the one with them off sees the same end
    notified.wait_for_selector(f".Toastify__toast:has-text('setting-check ({job}) done')")
    quiet.click(f"{SIDEBAR} .jp-dlsched-recent summary")
    quiet.wait_for_selector(row(job, "succeeded"), timeout=30_000)
    # a notification would have been counted in the same refresh that drew the row; the count
    # in the status bar is drawn on the next animation frame
    quiet.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    count = ".jp-Notification-Status .jp-Notification-Status-Text"
    assert quiet.inner_text(count) == "0"
    assert toasts(quiet) == []
    assert notified.inner_text(count) == "1"

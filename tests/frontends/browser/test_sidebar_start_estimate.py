"""The sidebar says when a waiting job should start: real browser, server, ledger and jobs."""

from __future__ import annotations

import sys
import time
from typing import Any

from jupyter_dlsched.client.scheduler import Scheduler

from .conftest import ARTIFACTS, Lab, open_lab, open_sidebar, row


def step(s: Scheduler, seconds: float, name: str = "step", gpus: int = 1) -> str:
    code = f"import time; time.sleep({seconds})"
    return s.submit_command([sys.executable, "-c", code], gpus=gpus, name=name).id


def test_a_waiting_job_in_the_sidebar_says_when_it_should_start(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    for _ in range(3):
        done = step(submitter, 0.5)
        deadline = time.monotonic() + 60
        while submitter.info(done).state != "succeeded":
            assert time.monotonic() < deadline, submitter.info(done)
            time.sleep(0.1)
    # the next step holds both GPUs for minutes: the three before it ran half a second, so
    # soon it has outlived them all and the job behind it is given a long-tailed estimate
    long = step(submitter, 300, gpus=2)
    behind = step(submitter, 1, name="after")
    page = browser_context.new_page()
    open_lab(page, lab)
    open_sidebar(page)
    page.wait_for_selector(row(long, "running"), timeout=30_000)
    queued = page.wait_for_selector(row(behind, "queued"))
    # a number while the estimate is tight; once the step has outlived the three before,
    # its P80 is far past the expected start and the sidebar says so, in words.py's words
    page.wait_for_function(
        "(el) => el.textContent.includes('start uncertain: the queue ahead may take')",
        arg=queued,
        timeout=60_000,
    )
    text = queued.inner_text()
    info = submitter.info(behind)
    assert info.start_p80 is not None and info.expected_start is not None
    assert info.start_p80 - time.time() > 3 * max(0.0, info.expected_start - time.time())
    assert "#1 in line" in text
    page.locator("#jupyter-dlsched-sidebar").screenshot(
        path=str(ARTIFACTS / "sidebar-start-estimate.png")
    )

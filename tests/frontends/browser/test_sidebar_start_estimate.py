"""The sidebar says when a waiting job should start: real browser, server, ledger and jobs."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.scheduler import Scheduler

from .conftest import ARTIFACTS, Lab, start_lab, stop_lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = start_lab(tmp_path / "lab")
    try:
        yield lab
    finally:
        stop_lab(lab)


@pytest.fixture
def submitter(lab: Lab) -> Iterator[Scheduler]:
    s = Scheduler(home=lab.home, loop=False)
    yield s
    for job in s.jobs(state=["queued", "running", "preempted"]):
        s.cancel(job.id)
    s.close()
    shutil.rmtree(lab.home, ignore_errors=True)  # lets the job launcher exit


def open_lab(page: Any, lab: Lab) -> None:
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)


def open_sidebar(page: Any) -> Any:
    page.click('.lm-TabBar-tab[data-id="jupyter-dlsched-sidebar"]')
    return page.wait_for_selector("#jupyter-dlsched-sidebar .jp-dlsched-gpu")


def row(job_id: str, state: str) -> str:
    return f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{job_id}"][data-state="{state}"]'


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
    page.wait_for_function(
        "(el) => el.textContent.includes('starts in')", arg=queued, timeout=30_000
    )
    text = queued.inner_text()
    assert "starts in ~" in text or "starts in <1 min" in text
    assert "#1 in line" in text
    page.locator("#jupyter-dlsched-sidebar").screenshot(
        path=str(ARTIFACTS / "sidebar-start-estimate.png")
    )

"""A GPU kernel in a real JupyterLab and Chromium: its wait in line, then a reclaim warned of
and announced."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

from .conftest import ARTIFACTS, Lab, show_sidebar, start_lab, stop_lab

NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {},
            "source": "1 + 1",
            "outputs": [],
            "execution_count": None,
        }
    ],
    "metadata": {"kernelspec": {"name": "gpu", "display_name": "GPU", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    folder = tmp_path / "lab"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(folder / "data"))
    install(GpuKernelRequest(gpus=1, idle="3s", idle_grace="8s"), user=True, name="gpu")
    (folder / "root").mkdir(parents=True)
    (folder / "root" / "train.ipynb").write_text(json.dumps(NOTEBOOK))
    lab = start_lab(folder)
    try:
        yield lab
    finally:
        stop_lab(lab)


def sleeper(s: Scheduler, name: str, **resources: Any) -> str:
    return s.submit_command(
        [sys.executable, "-c", "import time; time.sleep(300)"], name=name, **resources
    ).id


def kernel_lease(s: Scheduler, state: str) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leases = [j for j in s.jobs(state=state) if j.kind == "kernel"]
        if leases:
            return leases[0]
        time.sleep(0.2)
    raise AssertionError(f"no {state} kernel lease")


def test_a_gpu_kernel_waits_in_line_visibly_and_its_reclaim_is_announced(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    holder = sleeper(submitter, "holds-both-gpus", gpus=2)
    page = browser_context.new_page()
    page.goto(f"{lab.url}lab/tree/train.ipynb?token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)

    # the kernel's lease waits in the queue: the notebook says so where the user looks (a
    # notification and the status bar), and the sidebar opens with the lease's row in view,
    # the notebook and the reason in it
    lease = kernel_lease(submitter, "queued")
    toast = page.wait_for_selector(
        ".jp-toast-message:has-text('The GPU kernel of train.ipynb has not started')",
        timeout=30_000,
    )
    assert "#1 in line" in toast.inner_text() and "waiting for 1 GPU" in toast.inner_text()
    page.wait_for_selector(".jp-dlsched-status:has-text('your kernel #1 in line')")
    waiting = (
        f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{lease.id}"][data-state="queued"]'
    )
    page.wait_for_selector(waiting, state="visible", timeout=30_000)
    in_view = page.eval_on_selector(
        waiting,
        """n => { const r = n.getBoundingClientRect();
                  return r.top >= 0 && r.bottom <= window.innerHeight; }""",
    )
    assert in_view
    text = page.inner_text(waiting)
    assert "kernel · train.ipynb" in text and "waiting for 1 GPU" in text, text
    page.wait_for_timeout(1000)  # the notification has slid in
    page.screenshot(path=str(ARTIFACTS / "kernel-waiting.png"))

    # the GPUs come free: the kernel starts on one, the notification says so and the status
    # bar no more; the notebook runs a cell
    submitter.cancel(holder)
    kernel_lease(submitter, "running")
    page.wait_for_selector(".jp-toast-message:has-text('got its GPU')", timeout=30_000)
    page.wait_for_selector(".jp-toast-message:has-text('has not started')", state="detached")
    page.wait_for_selector(".jp-dlsched-status:not(:has-text('your kernel'))")
    running = (
        f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{lease.id}"][data-state="running"]'
    )
    page.wait_for_selector(f"{running}:has-text('idle <1 min')", timeout=30_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    # the lease's row in words (cells run, idle for), never the raw metric names
    row = page.inner_text(running)
    assert re.search(r"\b\d+ cells?\b", row) and "step" not in row and "idle_min" not in row, row

    # work waits for both GPUs while the kernel sits idle: warned, then reclaimed
    sleeper(submitter, "wants-both-gpus", gpus=2)
    page.wait_for_selector(".jp-toast-message:has-text('unless a cell runs')", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "kernel-reclaim-warning.png"))
    page.wait_for_selector(".jp-toast-message:has-text('was shut down')", timeout=60_000)
    # one message tells the story: the warning became the notice
    page.wait_for_selector(
        ".jp-toast-message:has-text('unless a cell runs')", state="detached", timeout=10_000
    )
    page.screenshot(path=str(ARTIFACTS / "kernel-reclaimed.png"))
    assert submitter.get(lease.id).result()["ended"] == "reclaimed"


def test_cancelling_a_waiting_kernels_lease_in_the_sidebar_fails_its_start_with_the_reason(
    lab: Lab, submitter: Scheduler, browser_context: Any
) -> None:
    sleeper(submitter, "holds-both-gpus", gpus=2)
    page = browser_context.new_page()
    page.goto(f"{lab.url}lab/tree/train.ipynb?token={lab.token}")
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    lease = kernel_lease(submitter, "queued")
    show_sidebar(page)
    waiting = (
        f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{lease.id}"][data-state="queued"]'
    )
    page.click(f'{waiting} button[data-action="cancel"]', timeout=30_000)
    page.click(".jp-Dialog .jp-mod-accept.jp-mod-warn")

    dialog = page.wait_for_selector(
        f".jp-Dialog:has-text('GPU lease {lease.id} was cancelled while it waited')",
        timeout=60_000,
    )
    page.screenshot(path=str(ARTIFACTS / "kernel-start-cancelled.png"))
    assert "the kernel was not started" in dialog.inner_text()

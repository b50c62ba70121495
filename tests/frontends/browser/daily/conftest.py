"""Daily use in a browser: one JupyterLab and one Chromium serve every test of a module here;
each test opens its own page (a fresh JupyterLab app, with its own notifications) in its own
browser context, 1400x900, the scheduler's sidebar open.

A module names the notebook its jobs come from with ``SESSION_NAME`` (what a kernel started
by Jupyter has: the notebook's full path becomes the job's origin).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from jupyter_dlsched.client.scheduler import Scheduler

from ..conftest import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_FLAGS,
    Lab,
    keep_pictures,
    leave,
    show_sidebar,
    start_lab,
    stop_lab,
)
from ..test_cell_line import call

SIDEBAR = "#jupyter-dlsched-sidebar"
PLUGIN = "jupyter-dlsched:plugin"
SESSION_NAME = "/home/anna/experiments/a-notebook.ipynb"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = start_lab(tmp_path_factory.mktemp("daily") / "lab")
    try:
        yield lab
    finally:
        stop_lab(lab)


@pytest.fixture(scope="module")
def submitter(lab: Lab, request: pytest.FixtureRequest) -> Iterator[Scheduler]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
        env.setenv("JPY_SESSION_NAME", getattr(request.module, "SESSION_NAME", SESSION_NAME))
        s = Scheduler(home=lab.home, loop=False)
        yield s
        leave(s, lab)


@pytest.fixture(autouse=True)
def cancel_leftovers(submitter: Scheduler, lab: Lab) -> Iterator[None]:
    """Each test starts with free GPUs and CPUs and no kernels, even after one that failed
    half-way."""
    yield
    for job in submitter.jobs(state=["queued", "running", "preempted"]):
        submitter.cancel(job.id)
    for kernel in call(lab, "api/kernels"):
        call(lab, f"api/kernels/{kernel['id']}", method="DELETE")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def new_page(browser: Any, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``new_page(path="lab", setup=None)``: a page at ``path`` (the lab, or a notebook) in a
    fresh context, ``setup(page)`` called before it loads, its sidebar open and filled in.

    The sidebar is at JupyterLab's default width; the GPU cards appear with the first answer of
    the server, so the page has had its first look at the queue when this returns.
    """
    contexts: list[Any] = []

    def open_page(path: str = "lab", setup: Any = None) -> Any:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        if setup is not None:
            setup(page)
        # `reset`: start from the default layout, not the one an earlier test left behind
        page.goto(f"{lab.url}{path}?reset&token={lab.token}")
        page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
        show_sidebar(page)
        page.wait_for_selector(f"{SIDEBAR} .jp-dlsched-gpu", timeout=30_000)
        return page

    yield open_page
    keep_pictures(request, contexts)
    for context in contexts:
        context.close()


@pytest.fixture
def settings(lab: Lab) -> Iterator[Any]:
    """Write this extension's user settings through JupyterLab's settings API; reset after."""

    def put(values: dict[str, Any]) -> None:
        body = json.dumps({"raw": json.dumps(values)}).encode()
        request = urllib.request.Request(
            f"{lab.url}lab/api/settings/{PLUGIN}",
            data=body,
            method="PUT",
            headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 204

    yield put
    put({})


def python(s: Scheduler, code: str, name: str, **resources: Any) -> str:
    """A job that runs ``code`` in this interpreter."""
    return s.submit_command([sys.executable, "-c", code], name=name, **resources).id

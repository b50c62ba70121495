"""A real JupyterLab on loopback and Debian's Chromium driven by Playwright.

Nothing here downloads a browser: Chromium comes from the system package
(``apt-get install chromium``); without it these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.client.scheduler import Scheduler

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"
LABEXTENSION = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyter-dlsched"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = None
    if not CHROMIUM.exists():
        reason = f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)"
    elif not (LABEXTENSION / "package.json").exists():
        reason = f"the JupyterLab extension is not installed at {LABEXTENSION} (pip install -e .)"
    if reason:
        here = Path(__file__).parent
        for item in items:
            if here in Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.skip(reason=reason))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Lab:
    url: str
    token: str
    home: Path
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}", headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


def start_lab(
    tmp: Path,
    server_config: dict[str, Any] | None = None,
    user: Any = None,
    env: dict[str, str] | None = None,
) -> Lab:
    """JupyterLab on 127.0.0.1 with private HOME, config, data and runtime folders.

    ``user`` (an ``OtherUser``): run it as that Unix user, with the system interpreter
    and this environment's packages (as on a shared machine); ``tmp`` must be theirs.
    """
    for name in ("home", "config/labconfig", "data", "runtime", "root", "dlsched"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
    # Nothing in the page may reach out: no news, no update checks.
    (tmp / "config/labconfig/page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    if server_config:
        (tmp / "config/jupyter_server_config.json").write_text(json.dumps(server_config))
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **(os.environ if user is None else user.client_env()),
        **(env or {}),
        "HOME": str(tmp / "home"),
        "XDG_CONFIG_HOME": str(tmp / "home/.config"),
        "XDG_CACHE_HOME": str(tmp / "home/.cache"),
        "XDG_DATA_HOME": str(tmp / "home/.local/share"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "DLSCHED_HOME": str(tmp / "dlsched"),
        "DLSCHED_SIMULATE_GPUS": "2x16GiB",
    }
    command = [sys.executable, "-m", "jupyterlab"]
    if user is not None:
        # the system interpreter, with this environment's packages, labextensions and config
        env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
        env["JUPYTER_CONFIG_PATH"] = str(Path(sys.prefix) / "etc" / "jupyter")
        app_dir = Path(sys.prefix) / "share" / "jupyter" / "lab"
        command = [
            *user.command("/usr/bin/python3"),
            "-m",
            "jupyterlab",
            f"--LabApp.app_dir={app_dir}",
        ]
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(tmp)], check=True)
    log = tmp / "lab.log"
    process = subprocess.Popen(
        [
            *command,
            "--no-browser",
            "--ServerApp.allow_root=True",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp / 'root'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
            "--DlschedApp.sample_interval=0.5",
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lab = Lab(f"http://127.0.0.1:{port}/", token, tmp / "dlsched", process, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            lab.api("api/status")
            return lab
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_lab(lab)
                raise RuntimeError(
                    f"JupyterLab did not start:\n{log.read_text()[-3000:]}"
                ) from None
            time.sleep(0.25)


def stop_lab(lab: Lab) -> None:
    if lab.process.poll() is None:
        lab.process.terminate()
        try:
            lab.process.wait(15)
        except subprocess.TimeoutExpired:
            lab.process.kill()
            lab.process.wait(5)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Marks a test whose body failed, for ``keep_pictures`` in its fixtures' teardown."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True


FAILED = pytest.StashKey[bool]()


def keep_pictures(request: pytest.FixtureRequest, contexts: list[Any]) -> None:
    """When the test failed: a picture of each page it left open, in ``artifacts/``, named by
    the test (what the page showed is the first clue to a failure seen once in a whole run)."""
    if not request.node.stash.get(FAILED, False):
        return
    ARTIFACTS.mkdir(exist_ok=True)
    for c, context in enumerate(contexts):
        for p, page in enumerate(context.pages):
            try:
                page.screenshot(path=str(ARTIFACTS / f"failed-{request.node.name}-{c}-{p}.png"))
            except Exception:  # a page that crashed: nothing to show
                pass


@pytest.fixture
def browser_context(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context
        finally:
            keep_pictures(request, [context])
            context.close()


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A JupyterLab of this test's own, on a pool of two simulated GPUs."""
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    lab = start_lab(tmp_path / "lab")
    try:
        yield lab
    finally:
        stop_lab(lab)
        shutil.rmtree(lab.home, ignore_errors=True)  # lets the agent and launcher exit


@pytest.fixture
def submitter(lab: Lab) -> Iterator[Scheduler]:
    """A client of the lab's pool, as a user's script would be; what it left is cancelled."""
    s = Scheduler(home=lab.home, loop=False)
    yield s
    leave(s, lab)


def leave(s: Scheduler, lab: Lab) -> None:
    """Cancel what a submitter left, close it, and remove the lab's state folder (which
    lets the job launcher exit)."""
    for job in s.jobs(state=["queued", "running", "preempted"]):
        s.cancel(job.id)
    s.close()
    shutil.rmtree(lab.home, ignore_errors=True)


def sleeper(s: Scheduler, name: str, **resources: Any) -> str:
    """A job that says it started, then holds what it was given for two minutes."""
    code = "import time; print('training started', flush=True); time.sleep(120)"
    return s.submit_command([sys.executable, "-c", code], name=name, **resources).id


def open_lab(page: Any, lab: Lab) -> None:
    """JupyterLab loaded in ``page``, its splash screen gone."""
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)


SIDEBAR_TAB = '.lm-TabBar-tab[data-id="jupyter-dlsched-sidebar"]'


def show_sidebar(page: Any, tries: int = 5) -> None:
    """The scheduler's sidebar shown. Its tab toggles it, and a lab still restoring its
    layout may put the file browser back after a click: click only while it is hidden."""
    for _ in range(tries):
        if page.is_visible("#jupyter-dlsched-sidebar"):
            return
        page.click(SIDEBAR_TAB)
        try:
            page.wait_for_selector("#jupyter-dlsched-sidebar", state="visible", timeout=5_000)
        except Exception:  # put back by the layout's restore: look again
            continue
    page.wait_for_selector("#jupyter-dlsched-sidebar", state="visible", timeout=5_000)


def open_sidebar(page: Any) -> Any:
    """The scheduler's sidebar opened, once it shows the GPUs."""
    show_sidebar(page)
    return page.wait_for_selector("#jupyter-dlsched-sidebar .jp-dlsched-gpu")


def row(job_id: str, state: str | None = None) -> str:
    """The selector of a job's row in the sidebar (in ``state``, if given)."""
    in_state = f'[data-state="{state}"]' if state else ""
    return f'#jupyter-dlsched-sidebar .jp-dlsched-job[data-job-id="{job_id}"]{in_state}'

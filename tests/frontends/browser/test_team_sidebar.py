"""The sidebar of a pool shared by the machine's users, in Chromium, as one of them.

User B's own JupyterLab (the system interpreter, run as B) talks to the shared
service; A's job is listed for B without cancel, priority or log actions, and
B's own job with them; "mine" hides A's job.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from team_pool import STAGE_EACH, Service, shared_pool, wait_for

from .conftest import ARTIFACTS, Lab, start_lab, stop_lab
from .test_sidebar import open_lab, open_sidebar, row


@pytest.fixture
def service() -> Iterator[Service]:
    with shared_pool('[limits]\nmax_cache_bytes = "4MiB"\n') as pool:
        yield pool


@pytest.fixture
def lab_as_b(service: Service, team_users) -> Iterator[Lab]:
    _, b = team_users
    tmp = Path(tempfile.mkdtemp(prefix="dlsched-lab-b-"))
    os.chmod(tmp, 0o755)
    lab = start_lab(tmp / "lab", user=b, env={"DLSCHED_SOCKET": str(service.socket)})
    try:
        yield lab
    finally:
        stop_lab(lab)
        os.system(f"rm -rf {tmp}")


def test_b_sees_a_job_of_a_without_actions_and_its_own_with_them(
    service, team_users, lab_as_b, browser_context
):
    a, b = team_users
    [a_job] = service.submit(a, 120, "a-training", gpus=1)
    [b_job] = service.submit(b, 120, "b-training", gpus=1)
    wait_for(lambda: all(service.job(j)["state"] == "running" for j in (a_job, b_job)))
    status = lab_as_b.api("dlsched/api/v1/status")
    assert (status["user"], status["shared"], status["admin"]) == (b.name, True, False)
    # B's server refuses A's job over REST too, with the owner named
    for method, path in (("POST", f"jobs/{a_job}/cancel"), ("GET", f"jobs/{a_job}/log")):
        code, body = rest(lab_as_b, method, f"dlsched/api/v1/{path}")
        assert code == 403 and f"belongs to {a.name}" in body["message"], (path, code, body)
    code, body = rest(lab_as_b, "PATCH", f"dlsched/api/v1/jobs/{a_job}", {"priority": "high"})
    assert code == 403, body
    assert service.job(a_job)["priority"] == 50 and not service.job(a_job)["cancel_requested"]
    page = browser_context.new_page()
    open_lab(page, lab_as_b)
    open_sidebar(page)
    theirs, mine = row(a_job, "running"), row(b_job, "running")
    page.wait_for_selector(theirs)
    page.wait_for_selector(mine)
    assert a.name in page.inner_text(theirs)
    for action in ("cancel", "raise", "lower", "log"):
        assert page.is_hidden(f'{theirs} [data-action="{action}"]'), action
        assert page.is_visible(f'{mine} [data-action="{action}"]'), action
    page.screenshot(path=str(ARTIFACTS / "sidebar-shared-pool.png"))
    # only mine: A's job leaves the list, B's stays
    page.click('#jupyter-dlsched-sidebar .jp-dlsched-filter [data-show="mine"]')
    page.wait_for_selector(theirs, state="detached")
    assert page.is_visible(mine)
    # B's cancel works on B's job, through the service
    page.click(f'{mine} [data-action="cancel"]')
    page.click(".jp-Dialog .jp-mod-accept.jp-mod-warn")
    wait_for(lambda: service.job(b_job)["state"] == "cancelled")
    assert service.job(a_job)["state"] == "running"
    # accounting per user over REST: B's cancelled job is counted, A's is still running
    users = {u["user"]: u for u in lab_as_b.api("dlsched/api/v1/accounting?since=3600")["users"]}
    assert users[b.name]["jobs"] == 1 and a.name not in users


def rest(lab: Lab, method: str, path: str, body: object = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{lab.url}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_b_sees_the_services_history_and_their_share_of_the_data_cache(
    service, team_users, lab_as_b, browser_context
):
    """Team mode: the charts are drawn from the service's samples (B's server takes no
    readings of its own), and the data cache line shows B's own share."""
    import time

    _, b = team_users
    staged = service.as_user(b, STAGE_EACH, "b-data", str(1 << 20))
    assert staged.returncode == 0, staged.stderr + service.log.read_text()[-3000:]
    out = json.loads(staged.stdout)
    try:
        assert out["runs"][0]["state"] == "succeeded", out
        # the service's samples reach B's server: GPU and host readings, from the service
        now = time.time()
        samples = wait_for(
            lambda: lab_as_b.api(f"dlsched/api/v1/metrics?since={now - 600}&until={now + 60}")[
                "samples"
            ]
        )
        sources = {sample["source"] for sample in samples}
        assert {"gpu:0", "gpu:1"} <= sources, sources
        page = browser_context.new_page()
        open_lab(page, lab_as_b)
        open_sidebar(page)
        share = "#jupyter-dlsched-sidebar .jp-dlsched-cache-share"
        page.wait_for_selector(share)
        assert page.inner_text(f"{share} .jp-dlsched-value") == "1 MiB / 4 MiB"
        counts = page.inner_text("#jupyter-dlsched-sidebar .jp-dlsched-cache-counts")
        assert counts.startswith("data cache · 1 entry"), counts
        page.screenshot(path=str(ARTIFACTS / "sidebar-shared-cache.png"))
    finally:
        import subprocess

        subprocess.run(["rm", "-rf", out["folder"]], check=False)

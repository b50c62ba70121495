"""Start estimates over REST: a waiting job's row carries expected_start and start_p80."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_cases import server_config, submitting

from jupyter_dlsched.client.scheduler import Scheduler

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def dls_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dlsched"
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def jp_server_config(dls_home: Path) -> dict[str, Any]:
    return server_config(dls_home)


@pytest.fixture
def submitter(dls_home: Path) -> Iterator[Scheduler]:
    yield from submitting(dls_home)


def step(s: Scheduler, seconds: float, name: str = "step") -> str:
    code = f"import time; time.sleep({seconds})"
    return s.submit_command([sys.executable, "-c", code], gpus=1, name=name).id


async def job_of(jp_fetch: Any, job_id: str) -> Any:
    response = await jp_fetch("dlsched", "api", "v1", "jobs", job_id)
    assert response.code == 200
    return json.loads(response.body)


async def until(jp_fetch: Any, job_id: str, test: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = await job_of(jp_fetch, job_id)
        if test(job):
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)


async def test_a_waiting_job_says_over_rest_when_it_should_start(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    for _ in range(3):
        done = step(submitter, 1.0)
        await until(jp_fetch, done, lambda j: j["state"] == "succeeded")
    running = step(submitter, 60.0)
    await until(jp_fetch, running, lambda j: j["state"] == "running")
    behind = step(submitter, 1.0, name="after")

    job = await until(jp_fetch, behind, lambda j: j["expected_start"] is not None)

    started = (await job_of(jp_fetch, running))["started"]
    assert job["state"] == "queued"
    # the running step should take about as long as the three before it
    assert job["expected_start"] == pytest.approx(started + 1.0, abs=1.0)
    assert job["start_p80"] >= job["expected_start"]
    listed = json.loads((await jp_fetch("dlsched", "api", "v1", "jobs")).body)["jobs"]
    row = next(j for j in listed if j["id"] == behind)
    # (re-forecast once the running step outlives its assumed end, so not the same number)
    assert row["expected_start"] is not None and row["start_p80"] >= row["expected_start"]

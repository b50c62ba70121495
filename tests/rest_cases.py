"""What the REST tests of the server extension share: the pool's GPUs, a job that holds
them, and the answers read as JSON (``jp_fetch``, of ``pytest_jupyter``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_dlsched.client.scheduler import Scheduler

SIMULATED = "2x16GiB"


def server_config(home: Path) -> dict[str, Any]:
    """A Jupyter server's config (``jp_server_config``) with this extension on ``home``,
    sampling every 0.1 s."""
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}},
        "DlschedApp": {"home": str(home), "sample_interval": 0.1},
    }


def submitting(home: Path) -> Iterator[Scheduler]:
    """For a ``submitter`` fixture: a participant that only submits, like a kernel that goes
    away (the server runs the loop); what it left is cancelled, so the next test finds the
    queue empty."""
    s = Scheduler(home=home, loop=False)
    yield s
    for job in s.jobs(state=["queued", "running", "preempted"]):
        s.cancel(job.id)
    s.close()


def sleeper(s: Scheduler, seconds: float = 60, **resources: Any) -> str:
    code = f"import time; print('started', flush=True); time.sleep({seconds})"
    return s.submit_command([sys.executable, "-c", code], **resources).id


async def get_json(jp_fetch: Any, *path: str, **params: Any) -> Any:
    response = await jp_fetch("dlsched", "api", "v1", *path, params=params or None)
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def error_of(
    jp_fetch: Any, *path: str, method: str = "GET", **kwargs: Any
) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch("dlsched", "api", "v1", *path, method=method, **kwargs)
    response = caught.value.response
    assert response is not None
    assert response.headers["Content-Type"].startswith("application/json")
    body = json.loads(response.body)
    # the one documented error shape (Error in openapi.json)
    assert body == {"message": body["message"], "status": caught.value.code}
    return caught.value.code, body["message"]

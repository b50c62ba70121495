"""GPU kernels in a real Jupyter server: sessions of a notebook, the REST view, the restarter."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.kernels.kernelspecs import GpuKernelRequest, install

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def dls_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dlsched"
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "1x16GiB")
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    yield home
    with Scheduler(home, loop=False) as s:
        for job in s.jobs(state=["queued", "running"]):
            s.cancel(job.id)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def jp_server_config(dls_home: Path, jp_environ: None) -> dict[str, Any]:
    install(GpuKernelRequest(gpus=1, idle="never"), user=True, name="gpu")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}},
        "DlschedApp": {"home": str(dls_home), "sample_interval": 0.5},
    }


async def api(jp_fetch: Any, *path: str, method: str = "GET", body: Any = None) -> Any:
    kwargs: dict[str, Any] = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch(*path, **kwargs)
    return json.loads(response.body) if response.body else None


async def until(predicate: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"not met within {timeout} s")


async def kernel_leases_scraped(jp_fetch: Any) -> dict[str, float]:
    """``dlsched_kernel_leases`` by state, as Prometheus scrapes it from the server."""
    from jupyter_dlsched.machine.metrics import parse

    response = await jp_fetch("dlsched", "metrics")
    families = parse(response.body.decode())
    return {labels["state"]: value for labels, value, _ in families["dlsched_kernel_leases"]}


async def kernel_lease(jp_fetch: Any) -> dict[str, Any] | None:
    jobs = await api(jp_fetch, "dlsched", "api", "v1", "jobs")
    leases = [j for j in jobs["jobs"] if j["kind"] == "kernel"]
    return leases[0] if leases else None


async def test_a_notebooks_gpu_kernel_is_a_lease_in_rest_kept_by_the_restarter(
    jp_fetch: Any, jp_serverapp: Any, dls_home: Path
) -> None:
    session = await api(
        jp_fetch,
        "api",
        "sessions",
        method="POST",
        body={"path": "sweep.ipynb", "type": "notebook", "kernel": {"name": "gpu"}},
    )
    kernel_id = session["kernel"]["id"]
    lease = await until(lambda: kernel_lease(jp_fetch))
    assert lease["state"] == "running"
    assert lease["name"] == "kernel · sweep.ipynb"
    assert lease["origin"].endswith("sweep.ipynb")
    assert (await kernel_leases_scraped(jp_fetch)).get("running") == 1

    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    old_pid = manager.provisioner.pid
    os.kill(old_pid, signal.SIGKILL)  # the server's restarter brings it back: same lease

    async def restarted() -> bool:
        # and the restart finished: jupyter_client answers a shutdown asked before its
        # ``ready`` is set with a 500 (InvalidStateError), which a loaded machine reached
        pid = manager.provisioner.pid
        done = manager.ready.done()
        return bool(pid and pid != old_pid and done and await manager.is_alive())

    await until(restarted, timeout=60)
    after = await kernel_lease(jp_fetch)
    assert after is not None and after["id"] == lease["id"] and after["state"] == "running"

    await api(jp_fetch, "api", "sessions", session["id"], method="DELETE")

    async def ended() -> bool:
        job = await api(jp_fetch, "dlsched", "api", "v1", "jobs", lease["id"])
        return bool(job["state"] == "succeeded")

    await until(ended, timeout=60)
    assert (await kernel_leases_scraped(jp_fetch)).get("running", 0) == 0

"""Prometheus metrics: scraped from the Jupyter server and from a shared pool's service while
a job runs, and read back with ``prometheus_client``'s own parser."""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.machine.metrics import parse

pytest_plugins = ["pytest_jupyter.jupyter_server"]

#: Prometheus' rule for metric and label names.
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


@pytest.fixture
def dls_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dlsched"
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", "2x16GiB")
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    yield home


@pytest.fixture
def jp_server_config(dls_home: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    open_metrics = getattr(request, "param", False)
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_dlsched": True}},
        "DlschedApp": {"home": str(dls_home), "sample_interval": 0, "open_metrics": open_metrics},
    }


def one_gpu_job(home: Path) -> tuple[Scheduler, str]:
    s = Scheduler(home=home, loop=False)
    code = "import time; time.sleep(60)"
    job = s.submit_command([sys.executable, "-c", code], gpus=1, cpus=0.5, name="train")
    wait_for(lambda: s.get(job.id).info().job_pid, timeout=60)
    return s, job.id


def check_names(families: dict[str, Any]) -> None:
    for name, samples in families.items():
        assert NAME.match(name) and name.startswith("dlsched_"), name
        for labels, _, sample_name in samples:
            assert NAME.match(sample_name)
            assert all(NAME.match(label) for label in labels)


def value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    for got, number, name in families[family]:
        if got == labels and (sample is None or name == sample):
            return float(number)
    raise AssertionError(f"no {family} {labels} in {families.get(family)}")


async def test_the_server_serves_prometheus_metrics_of_a_running_job(
    jp_fetch: Any, dls_home: Path
) -> None:
    import getpass

    s, job_id = one_gpu_job(dls_home)
    try:
        response = await jp_fetch("dlsched", "metrics")
        assert response.code == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        families = parse(response.body.decode())
        check_names(families)
        assert value(families, "dlsched_jobs", state="running") == 1
        assert value(families, "dlsched_jobs", state="queued") == 0
        [gpu] = s.get(job_id).devices
        assert value(families, "dlsched_gpu_allocated_ratio", gpu=str(gpu)) == 1.0
        assert value(families, "dlsched_gpu_allocated_ratio", gpu=str(1 - gpu)) == 0.0
        assert value(families, "dlsched_gpus", simulated="1") == 2
        # simulated GPUs are never reported as measured
        assert families["dlsched_gpu_utilization_ratio"] == []
        assert families["dlsched_gpu_memory_used_bytes"] == []
        count = value(families, "dlsched_queue_wait_seconds", "dlsched_queue_wait_seconds_count")
        assert count == 1
        inf = value(families, "dlsched_queue_wait_seconds", le="+Inf")
        assert inf == 1
        me = getpass.getuser()
        assert value(families, "dlsched_user_gpus_allocated", user=me) == 1.0
        assert value(families, "dlsched_user_jobs_running", user=me) == 1
        held = value(
            families, "dlsched_user_gpu_seconds", "dlsched_user_gpu_seconds_total", user=me
        )
        assert held >= 0
    finally:
        s.cancel(job_id)
        s.close()


async def test_the_servers_metrics_need_a_token_unless_opened(
    http_server_client: Any, jp_base_url: str, dls_home: Path
) -> None:
    url = jp_base_url.rstrip("/") + "/dlsched/metrics"
    response = await http_server_client.fetch(url, raise_error=False, follow_redirects=False)
    assert response.code in (401, 403)


@pytest.mark.parametrize("jp_server_config", [True], indirect=True)
async def test_open_metrics_answers_a_scraper_without_a_token(
    http_server_client: Any, jp_base_url: str, dls_home: Path
) -> None:
    url = jp_base_url.rstrip("/") + "/dlsched/metrics"
    response = await http_server_client.fetch(url, raise_error=False, follow_redirects=False)
    assert response.code == 200, response.code
    assert "dlsched_jobs" in parse(response.body.decode())
    # the JSON API stays closed
    api = jp_base_url.rstrip("/") + "/dlsched/api/v1/status"
    closed = await http_server_client.fetch(api, raise_error=False, follow_redirects=False)
    assert closed.code in (401, 403)


def _scrape(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_shared_pools_service_serves_metrics_with_each_users_gpus(team_users) -> None:
    from team_pool import shared_pool

    a, b = team_users
    with shared_pool(args=("--metrics", "127.0.0.1:0")) as service:
        line = wait_for(
            lambda: re.search(
                r"Prometheus metrics at (http://\S+/metrics)", service.log.read_text()
            )
        )
        url = line.group(1)
        [job_id] = service.submit(b, 60, "b-train", gpus=1)
        wait_for(lambda: service.job(job_id)["job_pid"])
        status, text = _scrape(url)
        assert status == 200, text
        families = parse(text)
        check_names(families)
        assert value(families, "dlsched_jobs", state="running") == 1
        assert value(families, "dlsched_user_gpus_allocated", user=b.name) == 1.0
        [gpu] = service.job(job_id)["placement"]["gpus"]
        assert value(families, "dlsched_gpu_allocated_ratio", gpu=str(gpu)) == 1.0
        assert (
            value(families, "dlsched_queue_wait_seconds", "dlsched_queue_wait_seconds_count") == 1
        )
        assert _scrape(url.replace("/metrics", "/other"))[0] == 404
        # the same numbers through the socket, for users' Jupyter servers
        again = a.python(
            "import jupyter_dlsched as dls, sys; s = dls.Scheduler(loop=False); "
            "sys.stdout.write(s.link.client.call('metrics')['text'])",
            env={"DLSCHED_SOCKET": str(service.socket)},
        )
        assert again.returncode == 0, again.stderr
        assert value(parse(again.stdout), "dlsched_user_gpus_allocated", user=b.name) == 1.0
        assert service.job(job_id)["state"] == "running"


def test_a_bad_metrics_address_is_refused_in_one_line(tmp_path: Path) -> None:
    import subprocess

    from team_pool import DLSCHED

    done = subprocess.run(
        [
            DLSCHED,
            "service",
            "run",
            "--home",
            str(tmp_path / "h"),
            "--socket",
            "/run/dlsched-never/s.sock",
            "--metrics",
            "localhost:99999",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--metrics" in done.stderr and "HOST:PORT" in done.stderr
    assert not Path("/run/dlsched-never").exists()


def test_a_shared_pools_service_records_the_history_every_users_sidebar_draws(
    team_users, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service samples the pool (a user's server no longer draws empty charts)."""
    import json

    from team_pool import shared_pool

    from jupyter_dlsched.server.state import ServerState

    a, b = team_users
    with shared_pool() as service:
        [job_id] = service.submit(b, 30, "b-train", gpus=1)
        wait_for(lambda: service.job(job_id)["job_pid"])
        [gpu] = service.job(job_id)["placement"]["gpus"]
        # A, another user, reads the history through the service
        script = (
            "import json, sys; from jupyter_dlsched.agent.client import AgentClient; "
            "print(json.dumps(AgentClient(sys.argv[1]).call('samples', since=0)['samples']))"
        )

        def allocated() -> list:
            done = a.python(script, str(service.socket))
            assert done.returncode == 0, done.stderr
            return [
                r
                for r in json.loads(done.stdout)
                if r["source"] == f"gpu:{gpu}" and job_id in (r["data"] or {}).get("allocated", [])
            ]

        rows = wait_for(allocated, timeout=30, step=0.5)
        assert rows[0]["data"]["simulated"] is True and rows[0]["mem_total"] == 16 << 30
        # and a Jupyter server of the shared pool answers REST's history from it
        monkeypatch.setenv("DLSCHED_SOCKET", str(service.socket))
        state = ServerState(Scheduler(loop=False), sample_interval=5, history_retention=86400)
        try:
            history = state.samples(0.0, 2e9, f"gpu:{gpu}", 1000)
        finally:
            state.close()
        assert any(job_id in (r["data"] or {}).get("allocated", []) for r in history)
        assert {r["source"] for r in history} == {f"gpu:{gpu}"}

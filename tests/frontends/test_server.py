"""The server extension against a real Jupyter server, a real ledger and real jobs."""

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
from rest_cases import SIMULATED, error_of, get_json, server_config, sleeper, submitting

from jupyter_dlsched.client.scheduler import Scheduler

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def dls_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "dlsched"
    monkeypatch.setenv("DLSCHED_SIMULATE_GPUS", SIMULATED)
    monkeypatch.setenv("DLSCHED_HOME", str(home))
    yield home
    # The job launcher of a state folder exits once the folder is gone.
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def jp_server_config(dls_home: Path) -> dict[str, Any]:
    return server_config(dls_home)


@pytest.fixture
def submitter(dls_home: Path) -> Iterator[Scheduler]:
    yield from submitting(dls_home)


async def wait_for_state(jp_fetch: Any, job_id: str, state: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = await get_json(jp_fetch, "jobs", job_id)
        if job["state"] == state or time.monotonic() > deadline:
            assert job["state"] == state, job
            return job
        await asyncio.sleep(0.1)


async def test_status_counts_jobs_and_names_the_user(jp_fetch: Any, submitter: Scheduler) -> None:
    sleeper(submitter, gpus=2)
    sleeper(submitter, gpus=1)

    status = await get_json(jp_fetch, "status")

    assert status["counts"]["running"] + status["counts"]["queued"] == 2
    assert status["gpus"]["total"] == 2
    assert status["gpus"]["simulated"] == 2
    assert status["user"] == submitter.owner


async def test_pool_shows_simulated_gpus_and_the_job_on_them(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, gpus=1, gpu_mem="4GiB")
    await wait_for_state(jp_fetch, job_id, "running")

    # a reading is shared for about a second, so the new job shows up within that
    readings = []
    deadline = time.monotonic() + 10
    while len(readings) < 3 and time.monotonic() < deadline:
        pool = await get_json(jp_fetch, "pool")
        if any(job_id in g["jobs"] for g in pool["gpus"]):
            readings.append(pool)
        await asyncio.sleep(0.6)

    assert len(readings) == 3
    for pool in readings:
        assert [g["simulated"] for g in pool["gpus"]] == [True, True]
        assert sum(job_id in g["jobs"] for g in pool["gpus"]) == 1
        # granted memory counts once, however often the pool is read
        assert all(0 < g["mem_used"] <= g["mem_total"] for g in pool["gpus"] if g["jobs"])
        assert [g["mem_used"] for g in pool["gpus"]] == [g["mem_used"] for g in readings[0]["gpus"]]
        assert pool["cpus"]["count"] >= 1 and pool["memory"]["total"] > 0


async def test_the_queue_moves_under_the_server_after_a_cancel_with_no_kernel(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    big = sleeper(submitter, gpus=2)
    small = sleeper(submitter, gpus=1)
    await wait_for_state(jp_fetch, big, "running")
    waiting = await get_json(jp_fetch, "jobs", small)
    assert waiting["state"] == "queued"
    assert waiting["waiting"]
    submitter.close()  # the submitting "kernel" is gone; only the server ticks now

    cancelled = await get_json_post(jp_fetch, "jobs", big, "cancel")

    assert cancelled["id"] == big
    await wait_for_state(jp_fetch, big, "cancelled")
    started = await wait_for_state(jp_fetch, small, "running")
    assert len(started["devices"]) == 1


async def test_the_stage_in_cache_is_served_as_the_scheduler_reports_it(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    cache = await get_json(jp_fetch, "cache")

    assert cache == submitter.cache_info()
    assert (cache["entries"], cache["bytes"], cache["staging"], cache["items"]) == (0, 0, [], [])
    assert cache["max_bytes"] > 0 and cache["folder"].startswith(str(submitter.home))


async def test_the_stage_in_cache_is_served_once_jobs_staged_their_data(
    jp_fetch: Any, submitter: Scheduler, tmp_path: Path
) -> None:
    before = await get_json(jp_fetch, "cache")
    assert (before["entries"], before["bytes"], before["misses"], before["items"]) == (0, 0, 0, [])
    data = tmp_path / "shards"
    data.mkdir()
    (data / "part-0.bin").write_bytes(b"\x01" * 300_000)
    (data / "part-1.bin").write_bytes(b"\x02" * 200_000)
    # each job reads its staged copy and then runs until the test ends
    code = (
        "import os, time, jupyter_dlsched as dls\n"
        "print(sorted(os.listdir(dls.data('train'))), flush=True)\n"
        "time.sleep(120)\n"
    )
    argv = [sys.executable, "-c", code]
    first = submitter.submit_command(argv, cpus=0.5, stage_in={"train": str(data)})
    await wait_for_state(jp_fetch, first.id, "running", timeout=60)
    second = submitter.submit_command(argv, cpus=0.5, stage_in={"train": str(data)})
    await wait_for_state(jp_fetch, second.id, "running", timeout=60)

    # the answer is shared for at most a second while no job changes
    await asyncio.sleep(1.1)
    cache = await get_json(jp_fetch, "cache")

    assert cache["entries"] == 1 and cache["bytes"] == 500_000 and cache["in_use"] == 1
    assert (cache["misses"], cache["hits"], cache["evictions"]) == (1, 1, 0)
    assert cache["max_bytes"] >= cache["bytes"] and cache["staging"] == []
    [item] = cache["items"]
    assert item["source"] == str(data) and item["files"] == 2 and item["in_use"] is True
    assert cache["folder"] == submitter.cache_info()["folder"]


async def get_json_post(jp_fetch: Any, *path: str) -> Any:
    response = await jp_fetch("dlsched", "api", "v1", *path, method="POST", body=b"")
    assert response.code == 200
    return json.loads(response.body)


async def test_a_running_jobs_log_can_be_tailed_and_followed(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, cpus=1)
    await wait_for_state(jp_fetch, job_id, "running")
    deadline = time.monotonic() + 20
    while True:
        chunk = await get_json(jp_fetch, "jobs", job_id, "log", tail=10)
        if "started" in chunk["text"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)

    assert "started" in chunk["text"]
    later = await get_json(jp_fetch, "jobs", job_id, "log", offset=chunk["next_offset"])
    assert later["offset"] == chunk["next_offset"]
    assert later["text"] == ""


async def test_jobs_filter_by_state_and_owner_and_page(jp_fetch: Any, submitter: Scheduler) -> None:
    ids = [sleeper(submitter, gpus=2, name=f"sweep-{i}") for i in range(4)]
    await wait_for_state(jp_fetch, ids[0], "running")

    queued = await get_json(jp_fetch, "jobs", state="queued", order="queue")
    first = await get_json(jp_fetch, "jobs", limit=2)
    second = await get_json(jp_fetch, "jobs", limit=2, offset=2)
    nobody = await get_json(jp_fetch, "jobs", owner="nobody-at-all")

    assert [j["id"] for j in queued["jobs"]] == ids[1:]
    assert [j["position"] for j in queued["jobs"]] == [1, 2, 3]
    assert [j["id"] for j in first["jobs"] + second["jobs"]] == ids[::-1]
    assert first["next_offset"] == 2
    assert nobody["jobs"] == [] and nobody["next_offset"] is None


async def test_priority_changes_by_name_and_number(jp_fetch: Any, submitter: Scheduler) -> None:
    job_id = sleeper(submitter, gpus=2, priority="low")

    raised = await jp_fetch(
        "dlsched",
        "api",
        "v1",
        "jobs",
        job_id,
        method="PATCH",
        body=json.dumps({"priority": "high"}),
    )
    numbered = await jp_fetch(
        "dlsched", "api", "v1", "jobs", job_id, method="PATCH", body=json.dumps({"priority": 7})
    )

    assert json.loads(raised.body)["priority"] == 100
    assert json.loads(numbered.body)["priority"] == 7


async def test_metrics_hold_gpu_cpu_and_ram_samples(jp_fetch: Any, dls_home: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        metrics = await get_json(jp_fetch, "metrics")
        sources = {s["source"] for s in metrics["samples"]}
        if {"gpu:0", "gpu:1", "cpu", "ram"} <= sources or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)

    assert {"gpu:0", "gpu:1", "cpu", "ram"} <= sources
    gpus = await get_json(jp_fetch, "metrics", source="gpu")
    assert {s["source"] for s in gpus["samples"]} == {"gpu:0", "gpu:1"}
    assert all(s["mem_total"] == 16 * 1024**3 for s in gpus["samples"])
    assert metrics["interval"] == 0.1


# -- every route: authentication and the OpenAPI description ---------------------------------


def dlsched_routes(app: Any) -> list[tuple[str, type]]:
    """(regex, handler) of every registered route under /dlsched/, from tornado's routers."""
    found: list[tuple[str, type]] = []

    def walk(router: Any) -> None:
        for rule in getattr(router, "rules", []):
            target = rule.target
            if hasattr(target, "rules"):
                walk(target)
                continue
            regex = getattr(rule.matcher, "regex", None)
            if regex is not None and "/dlsched/" in regex.pattern:
                found.append((regex.pattern, target))

    walk(app.default_router)
    walk(app.wildcard_router)
    return found


def concrete(pattern: str) -> str:
    """The route as a path below the base URL, with a job id filled in: /dlsched/api/v1/..."""
    path = pattern.rstrip("$").replace("(?P<job_id>[^/]+)", "abcd1234")
    return path[path.index("/dlsched/") :]


def methods_of(handler: type) -> set[str]:
    return {m for m in ("get", "post", "patch", "put", "delete") if m in vars(handler)}


async def test_every_route_refuses_an_unauthenticated_call(
    jp_serverapp: Any, http_server_client: Any, jp_base_url: str, dls_home: Path
) -> None:
    routes = dlsched_routes(jp_serverapp.web_app)
    assert len(routes) >= 7

    for pattern, handler in routes:
        path = jp_base_url.rstrip("/") + concrete(pattern)
        for method in methods_of(handler):
            body = b"{}" if method in ("post", "patch", "put") else None
            response = await http_server_client.fetch(
                path, method=method.upper(), body=body, raise_error=False, follow_redirects=False
            )
            assert response.code in (401, 403), (method, path, response.code)


async def test_the_openapi_file_describes_exactly_the_registered_routes(
    jp_serverapp: Any, jp_base_url: str, dls_home: Path
) -> None:
    import jupyter_dlsched.server

    spec_path = Path(jupyter_dlsched.server.__file__).parent / "openapi.json"
    spec = json.loads(spec_path.read_text())
    prefix = spec["servers"][0]["url"]
    described = {
        (prefix + path.replace("{job_id}", "abcd1234"), method)
        for path, operations in spec["paths"].items()
        for method in operations
    }

    registered = {
        (concrete(pattern), method)
        for pattern, handler in dlsched_routes(jp_serverapp.web_app)
        for method in methods_of(handler)
        if concrete(pattern).startswith(prefix)  # not /dlsched/metrics: Prometheus' text
    }

    assert registered == described
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"200", "201"} & set(responses), (path, method)  # a success answer
            assert "403" in responses, (path, method)
            if "{job_id}" in path:
                assert "404" in responses, (path, method)
            for status, response in responses.items():
                if status.startswith("4"):
                    # every error answer is documented as the one Error shape
                    ref = response["$ref"].rsplit("/", 1)[-1]
                    shared = spec["components"]["responses"][ref]
                    schema = shared["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, method, status)


def test_the_extension_is_enabled_by_the_shipped_config() -> None:
    config = Path(__file__).parents[2] / "jupyter-config" / "server-config" / "jupyter_dlsched.json"
    enabled = json.loads(config.read_text())["ServerApp"]["jpserver_extensions"]

    assert enabled == {"jupyter_dlsched": True}


# a finished job's record stays as it ended; requeue runs it again as a new job


async def finished_job(jp_fetch: Any, submitter: Scheduler) -> str:
    job_id = submitter.submit_command(["true"], cpus=0.25, name="short", priority=5).id
    await wait_for_state(jp_fetch, job_id, "succeeded")
    return job_id


async def test_the_priority_of_a_finished_job_is_a_409_and_its_record_stays(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = await finished_job(jp_fetch, submitter)
    before = submitter.store.events(job_id)

    code, message = await error_of(
        jp_fetch, "jobs", job_id, method="PATCH", body=json.dumps({"priority": "high"})
    )

    assert code == 409
    assert f"job {job_id} already succeeded" in message and "requeue" in message
    assert (await get_json(jp_fetch, "jobs", job_id))["priority"] == 5
    assert submitter.store.events(job_id) == before


async def test_requeue_makes_a_new_job_with_the_same_spec_linked_to_the_old(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = await finished_job(jp_fetch, submitter)

    response = await jp_fetch(
        "dlsched", "api", "v1", "jobs", job_id, "requeue", method="POST", body=b""
    )

    assert response.code == 201
    body = json.loads(response.body)
    assert set(body) == {"job"}
    new = body["job"]
    old = await get_json(jp_fetch, "jobs", job_id)
    assert new["id"] != job_id and new["requeue_of"] == job_id and old["requeue_of"] is None
    assert (new["name"], new["priority"], new["request"]) == (
        old["name"],
        old["priority"],
        old["request"],
    )
    await wait_for_state(jp_fetch, new["id"], "succeeded")
    assert any(f"requeued as {new['id']}" in e["reason"] for e in submitter.store.events(job_id))


async def test_requeue_of_an_unfinished_job_is_a_409_and_of_no_job_a_404(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    running = sleeper(submitter, cpus=0.25)
    await wait_for_state(jp_fetch, running, "running")

    code, message = await error_of(jp_fetch, "jobs", running, "requeue", method="POST", body=b"")
    assert code == 409 and f"job {running} is running" in message
    code, _ = await error_of(jp_fetch, "jobs", "nosuchjob", "requeue", method="POST", body=b"")
    assert code == 404
    assert len(submitter.jobs()) == 1

"""What the server extension refuses, and how it says so: every refusal is a 4xx in the
one documented error shape, never a 500, and changes nothing (``test_server.py``: what it
serves).

The module's tests share one pool: a refusal leaves the pool as it was, and each test
brings its own Jupyter server (and its own job, cancelled after it) all the same.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_cases import SIMULATED, error_of, get_json, server_config, sleeper, submitting
from tornado.httpclient import HTTPClientError

from jupyter_dlsched.client.scheduler import Scheduler

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(scope="module")
def dls_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("refusals") / "dlsched"
    patch = pytest.MonkeyPatch()
    patch.setenv("DLSCHED_SIMULATE_GPUS", SIMULATED)
    patch.setenv("DLSCHED_HOME", str(home))
    try:
        yield home
    finally:
        patch.undo()
        # The job launcher of a state folder exits once the folder is gone.
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def jp_server_config(dls_home: Path) -> dict[str, Any]:
    return server_config(dls_home)


@pytest.fixture
def submitter(dls_home: Path) -> Iterator[Scheduler]:
    yield from submitting(dls_home)


@pytest.mark.parametrize(
    "body",
    [
        {"priority": "very"},
        {"priority": True},
        {"priority": None},
        {"priority": [1]},
        {"priority": 1, "name": "x"},
        {},
        [],
        "high",
    ],
)
async def test_a_bad_priority_is_a_400_that_says_why(
    jp_fetch: Any, submitter: Scheduler, body: Any
) -> None:
    job_id = sleeper(submitter, gpus=2)

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=json.dumps(body))

    assert code == 400
    assert "priority" in message


async def test_a_body_that_is_not_json_is_a_400(jp_fetch: Any, submitter: Scheduler) -> None:
    job_id = sleeper(submitter, gpus=2)

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=b"{nope")

    assert code == 400 and "JSON" in message


# -- the answers fuzzing found as 500s, and the limits that keep them 4xx ----------------------


@pytest.mark.parametrize(
    "path, params",
    [
        (("jobs",), {"offset": str(2**63)}),  # once a 500: SQLite's integers end at 2**63 - 1
        (("jobs",), {"offset": str(2**63 - 1), "order": "queue"}),
        (("jobs",), {"offset": "1" * 5000}),  # past Python's digit limit for int()
        (("jobs",), {"limit": str(2**64)}),
        (("metrics",), {"since": "1e999"}),
    ],
)
async def test_numbers_too_large_for_the_ledger_are_a_400_that_names_the_argument(
    jp_fetch: Any, dls_home: Path, path: tuple[str], params: dict[str, str]
) -> None:
    code, message = await error_of(jp_fetch, *path, params=params)

    assert code == 400
    assert next(iter(params)) in message


async def test_the_largest_offset_accepted_reads_an_empty_page(
    jp_fetch: Any, dls_home: Path
) -> None:
    from jupyter_dlsched.server.handlers import MAX_OFFSET

    for order in ("newest", "queue"):
        page = await get_json(jp_fetch, "jobs", offset=MAX_OFFSET, limit=1000, order=order)
        assert page["jobs"] == [] and page["next_offset"] is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"priority": 99999999999999999999999999}',  # once a 500 (SQLite integer overflow)
        b'{"priority": "99999999999999999999999999"}',  # once a 500, through parse_priority
        b'{"priority": 1000000001}',
        b'{"priority": -1000000001}',
        b'{"priority": "12"}',  # a JSON client sends numbers as numbers
        b'{"priority": "HIGH"}',
        b'{"priority": 7.5}',
        b'{"priority": 1e400}',
        b'{"priority": NaN}',
    ],
)
async def test_a_priority_out_of_range_or_of_the_wrong_kind_is_a_400_that_says_what_is_allowed(
    jp_fetch: Any, submitter: Scheduler, body: bytes
) -> None:
    job_id = sleeper(submitter, gpus=2, priority=3)

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=body)

    assert code == 400
    assert "priority" in message and "1,000,000,000" in message and "urgent" in message
    assert submitter.info(job_id).priority == 3


async def test_the_largest_priorities_accepted_are_stored(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, gpus=2)

    for priority in (10**9, -(10**9)):
        body = json.dumps({"priority": priority})
        response = await jp_fetch("dlsched", "api", "v1", "jobs", job_id, method="PATCH", body=body)
        assert json.loads(response.body)["priority"] == priority
        assert submitter.info(job_id).priority == priority


async def test_a_body_nested_100000_deep_is_refused_for_its_size(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, gpus=2)
    body = b'{"priority": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # once a 500

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=body)

    assert code == 413
    assert "16384" in message


async def test_a_body_nested_too_deep_to_parse_is_a_400(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, gpus=2)
    body = b'{"priority": ' + b"[" * 5000 + b"]" * 5000 + b"}"  # small, but past json's depth

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=body)

    assert code == 400
    assert "nested too deeply" in message


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"", "empty"),
        (b'{"priority": "\xc3\x28"}', "not JSON"),  # not UTF-8
        (b"[1, 2]", "array"),
        (b"null", "null"),
        (b'{"priority": 1, "owner": "me"}', "'owner'"),
        (b'{"name": "x"}', "'name'"),
        (b'{"prio": 1}', "'prio'"),
    ],
)
async def test_a_body_that_is_not_one_object_with_priority_is_a_400_that_says_why(
    jp_fetch: Any, submitter: Scheduler, body: bytes, expected: str
) -> None:
    job_id = sleeper(submitter, gpus=2)

    code, message = await error_of(jp_fetch, "jobs", job_id, method="PATCH", body=body)

    assert code == 400
    assert expected in message


async def test_a_method_a_route_does_not_have_is_a_405_that_names_the_ones_it_has(
    jp_fetch: Any, submitter: Scheduler
) -> None:
    job_id = sleeper(submitter, gpus=2)

    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch("dlsched", "api", "v1", "jobs", job_id, method="DELETE")

    response = caught.value.response
    assert response is not None and response.code == 405
    assert response.headers["Allow"] == "GET, PATCH"
    assert json.loads(response.body) == {
        "message": "DELETE is not allowed here; use GET or PATCH",
        "status": 405,
    }
    assert submitter.info(job_id).state in ("queued", "running")


@pytest.mark.parametrize(
    "path",
    [
        ("jobs", "zzzz9999"),
        ("jobs", "zzzz9999", "log"),
    ],
)
async def test_an_unknown_job_is_a_404(jp_fetch: Any, dls_home: Path, path: tuple[str]) -> None:
    code, message = await error_of(jp_fetch, *path)

    assert code == 404
    assert "zzzz9999" in message


async def test_cancelling_or_reprioritising_an_unknown_job_is_a_404(
    jp_fetch: Any, dls_home: Path
) -> None:
    assert (await error_of(jp_fetch, "jobs", "zzzz9999", "cancel", method="POST", body=b""))[
        0
    ] == 404
    patch = json.dumps({"priority": 1})
    assert (await error_of(jp_fetch, "jobs", "zzzz9999", method="PATCH", body=patch))[0] == 404


@pytest.mark.parametrize(
    "raw_id",
    ["..", "..%2F..%2Fetc%2Fpasswd", "%2E%2E", "ABCD", "a b", "a%00b", "x" * 200, "%2Fetc"],
)
async def test_path_tricks_in_ids_are_refused(jp_fetch: Any, dls_home: Path, raw_id: str) -> None:
    for suffix in ("", "/log"):
        url = f"dlsched/api/v1/jobs/{raw_id}{suffix}"
        with pytest.raises(HTTPClientError) as caught:
            await jp_fetch(url)
        assert caught.value.code in (400, 404), (url, caught.value.code)


@pytest.mark.parametrize(
    "path, params",
    [
        (("jobs",), {"limit": "abc"}),
        (("jobs",), {"limit": "0"}),
        (("jobs",), {"limit": "100000"}),
        (("jobs",), {"offset": "-1"}),
        (("jobs",), {"state": "sleeping"}),
        (("jobs",), {"state": "queued,"}),
        (("jobs",), {"state": ""}),
        (("jobs",), {"limit": ""}),
        (("jobs",), {"order": "random"}),
        (("metrics",), {"since": "yesterday"}),
        (("metrics",), {"since": "nan"}),
        (("metrics",), {"since": "200", "until": "100"}),
    ],
)
async def test_bad_query_arguments_are_a_400(
    jp_fetch: Any, dls_home: Path, path: tuple[str], params: dict[str, str]
) -> None:
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch("dlsched", "api", "v1", *path, params=params)

    assert caught.value.code == 400
    response = caught.value.response
    assert response is not None
    name = next(iter(params))
    assert name in json.loads(response.body)["message"]


async def test_log_arguments_are_checked(jp_fetch: Any, submitter: Scheduler) -> None:
    job_id = sleeper(submitter, gpus=2)

    for params in (
        {"offset": "-5"},
        {"tail": "x"},
        {"offset": "0", "tail": "5"},
        {"offset": str(2**63)},
        {"tail": str(2**63)},
        {"max_bytes": str(2**63)},
        {"max_bytes": "0"},
    ):
        code, message = await error_of(jp_fetch, "jobs", job_id, "log", params=params)
        assert code == 400
        assert any(name in message for name in params), (params, message)

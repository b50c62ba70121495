"""A shared pool checks what a raw submission stores before it queues it.

The client library always sends a well-formed job; a raw request over the socket need
not. What the job process could not read (``argv`` as a string, a ``command.json`` that
is not JSON, a ``context.json`` of the wrong shape) is refused at submit with the field
named, rather than accepted and failed when the job's turn came; a ``kernel`` lease may
not carry a command; and a job without a working folder runs in its owner's home (or
``/``), never in the service's. Two real Unix users (CI runs as root).
"""

from __future__ import annotations

import json
import os

import pytest
from team_pool import shared_pool, wait_for

from jupyter_dlsched.agent.client import AgentClient

RAW = """
import json, sys
from jupyter_dlsched.agent.client import AgentClient
from jupyter_dlsched.vocab.errors import DlschedError
client = AgentClient(sys.argv[1])
pwd = json.dumps({"argv": ["pwd"]}).encode()
requests = [
    ("command", {"command.json": json.dumps({"argv": "sleep 1"}).encode()}),
    ("command", {"command.json": b"sleep 1"}),
    ("command", {"command.json": json.dumps({"argv": []}).encode()}),
    ("command", {}),
    ("kernel", {"command.json": pwd}),
    ("function", {"command.json": pwd}),
    ("function", {}),
    ("command", {"command.json": pwd, "context.json": b"[]"}),
    ("command", {"command.json": pwd, "context.json": json.dumps({"env": ["A"]}).encode()}),
    ("command", {"command.json": pwd, "context.json": json.dumps({"cwd": 5}).encode()}),
    ("command", {"command.json": pwd}),
]
out = []
for kind, files in requests:
    names = sorted(files)
    jobs = [{"files": {name: i for i, name in enumerate(names)}}]
    try:
        reply = client.call(
            "submit", [files[n] for n in names], kind=kind, jobs=jobs,
            options={"cpus": 0.25}, default_name="raw",
        )
        out.append(["accepted", reply["ids"][0]])
    except DlschedError as error:
        out.append([type(error).__name__, str(error)])
print(json.dumps(out))
"""


@pytest.fixture
def users(team_users):
    return team_users


def test_a_raw_submission_is_checked_at_the_door_and_never_runs_in_the_services_folder(
    users,
):
    _, b = users
    with shared_pool() as service:
        done = service.as_user(b, RAW, str(service.socket))
        assert done.returncode == 0, done.stderr
        *refused, accepted = json.loads(done.stdout)
        assert [kind for kind, _ in refused] == ["SpecError"] * len(refused), refused
        words = [message for _, message in refused]
        assert words[0].startswith("argv='sleep 1' is invalid: expected a non-empty list")
        assert words[1].startswith("command.json='sleep 1' is invalid: expected JSON")
        assert words[2].startswith("argv=[] is invalid")
        assert words[3].startswith("command.json=None is invalid: expected a command")
        assert words[4] == (
            "command.json='...' is invalid: expected no command for a job of kind 'kernel'"
        )
        assert words[5].startswith("command.json='...' is invalid: expected no command")
        assert words[6].startswith("payload.pkl=None is invalid: expected the pickled")
        assert words[7].startswith("context.json=[] is invalid: expected a JSON object")
        assert words[8].startswith("context.env=['A'] is invalid")
        assert words[9].startswith("context.cwd=5 is invalid: expected a path")
        # nothing refused was queued
        root = AgentClient(str(service.socket))
        assert [j["id"] for j in root.call("jobs", owner=b.name)["jobs"]] == [accepted[1]]

        # a command without a context runs in its owner's home (these users have none: /)
        job_id = accepted[1]
        wait_for(lambda: service.job(job_id)["state"] == "succeeded", timeout=60)
        home = os.path.expanduser(f"~{b.name}")
        where = home if os.path.isdir(home) else "/"
        log = (service.home / "spool" / job_id / "log").read_text()
        assert log.strip() == where, (log, os.getcwd())

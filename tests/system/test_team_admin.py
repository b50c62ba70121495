"""What an admin reads of another user's job in a shared pool, and what only the owner loads.

A job's result is a pickle its job wrote as its owner, and loading a pickle runs the code
it names: were root to load another user's result, that user would run code as root. So
an admin reads another user's job's state, log and error report, and the result is the
owner's to load; root is told so, in words that fit (not advice about state folders).
Two real Unix users (created for the session; CI runs as root) and root.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from team_pool import DLSCHED, shared_pool, wait_for

from jupyter_dlsched.client.scheduler import Scheduler
from jupyter_dlsched.vocab.errors import JobFailed, PermissionDenied

FAILS = """
import sys
import jupyter_dlsched as dls

def fails():
    print("checked the data", flush=True)
    raise ValueError("learning rate too high")

print(dls.Scheduler(loop=False).submit(fails, cpus=0.25).id)
"""


@pytest.fixture
def users(team_users):
    return team_users


def test_root_reads_another_users_log_and_error_but_leaves_the_result_to_its_owner(users):
    a, b = users
    with shared_pool() as service:
        [done] = service.submit(b, 0, "b-result")
        failed = service.as_user(b, FAILS).stdout.strip()
        wait_for(lambda: service.job(done)["state"] == "succeeded", timeout=60)
        wait_for(lambda: service.job(failed)["state"] == "failed", timeout=60)
        env = {**os.environ, "DLSCHED_SOCKET": str(service.socket)}
        with Scheduler(loop=False, socket_path=service.socket) as root:
            with pytest.raises(PermissionDenied) as refused:
                root.get(done).result(timeout=30)
            assert str(refused.value) == (
                f"job {done} belongs to {b.name}: its result is a pickle its job wrote as "
                f"{b.name}, and loading a pickle runs the code it names, so only "
                f"{b.name} loads it (an admin reads its state and log: dlsched logs {done})"
            )
            assert "DLSCHED_HOME" not in str(refused.value)
            # the error report is JSON: root reads the failure's words
            with pytest.raises(JobFailed, match="learning rate too high"):
                root.get(failed).result(timeout=30)
        logs = subprocess.run(
            [DLSCHED, "logs", failed], env=env, capture_output=True, text=True, timeout=60
        )
        assert logs.returncode == 0, logs.stderr
        assert "checked the data" in logs.stdout
        # the owner loads it; the other user is refused, as before
        assert json.loads(service.as_user(b, RESULT_OF, done).stdout) == ["b-result", b.uid]
        other = service.as_user(a, RESULT_OF, done)
        assert f"belongs to {b.name}" in other.stderr and "PermissionDenied" in other.stderr


RESULT_OF = """
import json, sys
import jupyter_dlsched as dls
print(json.dumps(dls.Scheduler(loop=False).get(sys.argv[1]).result(timeout=60)))
"""

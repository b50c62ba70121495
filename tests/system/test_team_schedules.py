"""A shared pool's schedules (``--every``) cannot be made to flood it.

Each tick of a schedule makes a job, which ends at once and so never counts in
``max_queued``: twenty schedules of ``1s`` from one user slowed every other user's
requests. The pool refuses an interval below ``min_schedule_interval`` (a minute by
default), caps each user's schedules (``max_schedules``), and skips a tick once the
user's schedules made ``max_schedule_runs_per_hour`` runs in the last hour. Two
real Unix users (created for the session; CI runs as root).
"""

from __future__ import annotations

import json

import pytest
from team_pool import shared_pool, wait_for

from jupyter_dlsched.agent.client import AgentClient

SCHEDULE = """
import json, os, sys
import jupyter_dlsched as dls
from jupyter_dlsched.vocab.errors import DlschedError
s = dls.Scheduler(loop=False)
out = []
for every in sys.argv[1:]:
    try:
        s.submit(os.getpid, every=every, cpus=0.25, name="tick")
        out.append("accepted")
    except DlschedError as error:
        out.append(f"{type(error).__name__}: {error}")
print(json.dumps(out))
"""


@pytest.fixture
def users(team_users):
    return team_users


def schedule(service, user, *every: str) -> list[str]:
    done = service.as_user(user, SCHEDULE, *every)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_schedule_below_the_pools_minimum_interval_is_refused_with_the_figures(users):
    _, b = users
    with shared_pool() as service:
        fast, cron = schedule(service, b, "1s", "* * * * *")
        assert fast == (
            "SpecError: --every 1s is below this pool's minimum interval of 1m "
            "(min_schedule_interval)"
        )
        assert cron == "accepted"  # cron ticks a minute apart at most: the default allows it
        assert schedule(service, b, "2s") == [
            "SpecError: --every 2s is below this pool's minimum interval of 1m "
            "(min_schedule_interval)"
        ]
    with shared_pool('min_schedule_interval = "5m"\n') as service:
        assert schedule(service, b, "* * * * *", "*/5 * * * *", "4m") == [
            "SpecError: --every '* * * * *' is below this pool's minimum interval of 5m "
            "(min_schedule_interval)",
            "accepted",
            "SpecError: --every 4m is below this pool's minimum interval of 5m "
            "(min_schedule_interval)",
        ]


def test_a_users_schedules_are_capped_and_their_runs_counted_per_hour(users):
    a, b = users
    config = (
        'min_schedule_interval = "1s"\n[limits]\nmax_schedules = 3\n'
        "max_schedule_runs_per_hour = 4\n"
    )
    with shared_pool(config) as service:
        made = schedule(service, b, "1s", "1s", "1s", "1s")
        assert made[:3] == ["accepted"] * 3
        assert made[3] == (
            f"PermissionDenied: {b.name} has 3 schedules; the limit per user is 3 "
            "(max_schedules; this request adds 1): remove one with "
            "`dlsched schedules remove ID`"
        )
        assert schedule(service, a, "1s") == ["accepted"]  # the cap is each user's own
        root = AgentClient(str(service.socket))

        def of(user) -> list[dict]:
            rows = root.call("schedules")["schedules"]
            return [r for r in rows if r["owner"] == user.name]

        # b's three schedules tick every second: a tick whose last run still goes is
        # skipped, and past 4 runs in the hour every tick is skipped
        wait_for(lambda: sum(s["runs"] for s in of(b)) >= 4, timeout=90, what=lambda: of(b))
        going = ("queued", "running", "preempted")
        wait_for(
            lambda: all(s["last_state"] not in going for s in of(b)), timeout=90, what=lambda: of(b)
        )
        skipped = sum(s["skipped"] for s in of(b))
        # every run has ended: these skips are the cap's alone
        wait_for(
            lambda: sum(s["skipped"] for s in of(b)) >= skipped + 6, timeout=90, what=lambda: of(b)
        )
        assert sum(s["runs"] for s in of(b)) == 4, of(b)
        # a's schedule is counted on its own: its runs go on
        wait_for(lambda: of(a)[0]["runs"] >= 2, timeout=60, what=lambda: of(a))
        for row in root.call("schedules")["schedules"]:
            root.call("schedules", remove=row["id"])

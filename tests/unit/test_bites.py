"""A limit that bites is logged once a minute for each user, and counted every time."""

from __future__ import annotations

import logging

import pytest

from jupyter_dlsched.agent.bites import Bites


def test_each_bite_is_counted_and_logged_once_a_minute_per_limit_and_user(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    bites = Bites(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="jupyter_dlsched.agent"):
        for _ in range(5):
            bites.hit("max_queued", "ana", "ana has %d jobs waiting", 10)
        bites.hit("max_queued", "ben", "ben has %d jobs waiting", 10)
        now[0] = 61.0
        bites.hit("max_queued", "ana", "ana has %d jobs waiting", 11)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "dlsched agent: limit max_queued: ana has 10 jobs waiting",
        "dlsched agent: limit max_queued: ben has 10 jobs waiting",
        "dlsched agent: limit max_queued: ana has 11 jobs waiting "
        "(4 more times since the last line)",
    ]
    assert bites.counts == {"max_queued": 7}

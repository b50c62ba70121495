"""Which spare supervisor a job gets, and which goes while too many wait, from what each
said on its channel (``agent/spares.py``): real socket pairs, no processes."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from jupyter_dlsched.agent.spares import BACK, LENT, READY, WARMING, Spare, best, least_use


@pytest.fixture
def make() -> Iterator:
    made: list[tuple[Spare, socket.socket]] = []

    def spare(pid: int) -> tuple[Spare, socket.socket]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        made.append((Spare(pid, ours, -1), theirs))
        return made[-1]

    yield spare
    for s, theirs in made:
        s.close()
        theirs.close()


def say(s: Spare, theirs: socket.socket, *words: str) -> None:
    theirs.sendall("".join(f"{w}\n" for w in words).encode())
    assert s.hear()


def test_a_ready_spare_with_all_that_was_learnt_comes_first_then_the_longest_importing(make):
    stale, stale_end = make(1)
    first, first_end = make(2)
    later, later_end = make(3)
    say(stale, stale_end, "r0 0")
    say(first, first_end, "w4 0")
    say(later, later_end, "w4 0")
    assert (stale.state, first.state) == (READY, WARMING)
    # importing it beats lacking it, and the import begun first beats a later one
    assert best([stale, later, first], 4) is first
    say(later, later_end, "r4 0")
    assert best([stale, first, later], 4) is later
    # before anything was learnt, a ready one is as good as any
    assert best([stale, first], 0) is stale


def test_what_a_spare_said_before_its_next_job_is_no_news(make):
    s, theirs = make(1)
    say(s, theirs, "r4 0")
    s.jobs = 1  # a job was handed to it
    s.told(LENT)
    say(s, theirs, "r4 0")  # said before it read that job
    s.back()
    assert s.state == BACK
    # said once that job ended, before the agent heard of it: counts when it is back
    s.told(LENT)
    say(s, theirs, "r4 1")
    s.back()
    assert s.state == READY and s.learnt == 4


def test_while_too_many_wait_the_one_lacking_what_was_learnt_goes_then_one_importing(make):
    stale, stale_end = make(1)
    importing, importing_end = make(2)
    served, served_end = make(3)
    fresh, fresh_end = make(4)
    back, _ = make(5)
    say(stale, stale_end, "r0 0")
    say(importing, importing_end, "w4 0")
    served.jobs = 3
    say(served, served_end, "r4 3")
    say(fresh, fresh_end, "r4 0")
    back.told(BACK)
    everyone = [stale, importing, served, fresh, back]
    assert least_use(everyone, 4) is stale
    assert least_use([importing, served, fresh, back], 4) is importing
    # of two alike, the one that has run no job goes; one not heard from never does
    assert least_use([served, fresh, back], 4) is fresh
    assert least_use([back], 4) is None


def test_a_spare_whose_channel_closed_has_gone(make):
    s, theirs = make(1)
    theirs.close()
    assert not s.hear()

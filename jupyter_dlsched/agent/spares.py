"""What the pool agent knows of each spare supervisor, and which one a job gets.

A spare imports what this user's jobs were learnt to import (``local/preload.py``) before
it forks the process for its next job, and that takes as long as the job's own import
would (a second or two for torch). Each spare says on its channel where it stands:
``w<n> <runs>`` (importing what was learnt, ``n`` the size of the learnt set it read,
after ``runs`` jobs) and ``r<n> <runs>`` (its process is forked ahead: it takes a job at
once), so that

* a job goes to a spare that is ready with everything learnt; else to one whose job has
  just ended (the job is handed to it when it says it waits again: a client that submits
  the moment its last job ended is quicker than that job's supervisor coming back); else
  to the one that has been importing longest (the job waits for that import, which began
  before the job: never slower than importing it in the job); a spare forked before the
  last learning comes last (its job imports what it lacks itself);
* a spare that lacks what was learnt since it got ready is told to import it
  (``WARM``) as soon as any spare says there is more;
* while more than ``SPARES`` wait, the one of least use goes: one that lacks what was
  learnt, else one still importing (killed at once: its import only takes the cores from
  the jobs), else one that has run no job (a spare forked while a job ran, when the
  job's own supervisor is back), never one that has not said where it stands since.

The agent writes a job's id (or ``WARM``) to the channel, one a line.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ..vocab.schema import TERMINAL, JobInfo

#: the line that tells a waiting spare to import what was learnt since it got ready
WARM = "warm"

FORKED = "forked"  # not heard from yet
LENT = "lent"  # running a job
BACK = "back"  # its job ended and it waits again: not heard from since
WARMING = "warming"
READY = "ready"


@dataclass(eq=False)
class Spare:
    """One spare supervisor, seen from the agent (its channel's selector data)."""

    pid: int
    channel: socket.socket
    #: a pidfd taken at its fork: a spare killed by the agent is never a reused pid
    pidfd: int
    #: the size of the learnt set it last said it holds (or imports)
    learnt: int = 0
    state: str = FORKED
    #: jobs handed to it: of two spares alike, the one that has run none goes first
    jobs: int = 0
    #: the job it runs (``LENT``), and the one it takes next when it says it waits again
    job: str | None = None
    queued: JobInfo | None = None
    since: float = field(default_factory=time.monotonic)
    _partial: bytes = b""
    #: what it said once its job ended, before the agent was told: applied when it is
    _early: tuple[str, int] | None = None

    def rank(self, learnt: int) -> tuple[int, float]:
        """Which spare a job gets (the lowest): ready with everything learnt, then one that
        has not said since its job (it was ready before it and imports nothing new), then
        the one importing longest, then one that lacks what was learnt."""
        current = self.learnt >= learnt
        if self.state == READY:
            return (0 if current else 3, self.since)
        if self.state in (FORKED, BACK) and current:
            return (1, self.since)
        return (2, self.since)

    def told(self, state: str) -> None:
        self.state, self.since = state, time.monotonic()
        self._early = None

    def lend(self, job: JobInfo) -> bool:
        """Hand it ``job``; False when it has gone."""
        if not self.send(job.id):
            return False
        self.told(LENT)
        self.jobs += 1
        self.job = job.id
        return True

    def back(self) -> None:
        """Its job has ended and it waits again (what it said meanwhile counts now)."""
        early = self._early
        self.told(BACK)
        self.job = None
        if early is not None:
            self.told(early[0])
            self.learnt = early[1]

    def returning(self, store: Any, learnt: int, reuse: int) -> bool:
        """Lent, with everything learnt, for another job after this one, which has ended:
        it is about to wait again (one read of the ledger)."""
        if self.state != LENT or self.queued is not None or self.job is None:
            return False
        if self.learnt < learnt or self.jobs >= reuse:
            return False
        try:
            return store.get(self.job).state in TERMINAL
        except Exception:
            return False

    def send(self, line: str) -> bool:
        """Write one line to the spare; False when it has gone."""
        try:
            self.channel.send(f"{line}\n".encode())
        except OSError:
            return False
        return True

    def hear(self) -> bool:
        """Read what the spare said; False once its channel is closed. What it said before
        it ran every job handed to it is no news (it reads the next one then)."""
        try:
            data = self.channel.recv(256)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            word, _, rest = line.partition(b" ")
            kind, number = word[:1], word[1:]
            if kind not in (b"w", b"r") or not number.isdigit() or not rest.isdigit():
                continue
            if int(rest) != self.jobs:
                continue
            state = WARMING if kind == b"w" else READY
            if self.state == LENT:
                self._early = (state, int(number))
            else:
                self.told(state)
                self.learnt = int(number)
        return True

    def kill(self) -> None:
        """Stop it at once (it was never handed a job: nothing of a job is lost)."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def close(self) -> None:
        """Let go of its channel (a spare reading its end exits) and its pidfd."""
        self.channel.close()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def best(spares: list[Spare], learnt: int) -> Spare:
    """The spare a job gets (see the module's docstring)."""
    return min(spares, key=lambda s: s.rank(learnt))


def least_use(spares: list[Spare], learnt: int) -> Spare | None:
    """The spare to let go while too many wait; None while none has said where it stands."""
    said = [s for s in spares if s.state in (WARMING, READY)]
    if not said:
        return None
    return max(said, key=lambda s: (s.rank(learnt)[0], -s.jobs, s.since))

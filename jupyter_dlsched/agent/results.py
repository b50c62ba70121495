"""Results written before their job has ended: the notes the agent passes to its clients.

A function job's process writes its return value, then exits; tearing down a forked
process and recording the end take milliseconds more. The job's supervisor tells the
agent as soon as the result is written (``result``), and the agent hands the note to
every client waiting in a ``changes`` request that asks for them (``results``: the
number of the last note it has seen), so ``JobHandle.result()`` returns without
waiting for the end. The ledger is not touched: the job stays ``running``, its grant
held, until its supervisor has seen its processes exit and recorded how it ended.

A note is a hint, not a state: a client reads the result only if ``result.pkl`` is
there, and otherwise waits for the end as before. Only the latest notes are kept; a
client that missed one is resolved by the job's end.

    >>> notes = WrittenResults()
    >>> notes.add("a1b2c3")
    >>> notes.since(0)
    [(1, 'a1b2c3')]
"""

from __future__ import annotations

import collections
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connections import Peer

#: Notes kept for clients that have not read them yet.
KEPT = 1024


class WrittenResults:
    """The agent's latest notes of written results, numbered from 1."""

    def __init__(self) -> None:
        self._notes: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEPT)
        self.newest = 0
        #: the note each held ``changes`` request has seen (its client's cursor)
        self.held: weakref.WeakKeyDictionary[Peer, int] = weakref.WeakKeyDictionary()

    def add(self, job_id: str) -> None:
        self.newest += 1
        self._notes.append((self.newest, job_id))

    def since(self, seen: int) -> list[tuple[int, str]]:
        """The notes after ``seen``, oldest first (a cursor ahead of this agent's notes,
        one a restarted agent never gave, reads them all)."""
        if seen > self.newest:
            seen = 0
        return [note for note in self._notes if note[0] > seen]

    def waiting_for(self, peer: Peer) -> bool:
        """Whether ``peer``'s held request has notes it has not seen."""
        seen = self.held.get(peer)
        if seen is None:
            return False
        return seen < self.newest or (seen > self.newest and self.newest > 0)

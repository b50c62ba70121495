"""The client's loop: follow the pool's state changes and resolve the handles of jobs that ended.

A ``Scheduler`` started with ``loop=True`` (the default) has a ``Follower``: a
background thread that waits on its link for state changes (an agent answers
them as they happen; an in-process engine link ticks the engine while it
waits), hands them to the scheduler to resolve its handles, and starts this
process's inline jobs when they are allocated. It decides nothing itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .inline import InlineRunner

log = logging.getLogger("jupyter_dlsched")


class ChangeSource(Protocol):
    """What the loop uses of a link: state changes after an event, and ending a wait."""

    def changes(self, since: int, wait: float) -> list[tuple[int, str, str]]: ...

    def interrupt(self) -> None: ...


class Follower:
    """The thread that follows ``link``'s state changes for a ``Scheduler``.

    >>> follower = Follower(link, resolve, inline, since=store.last_event_seq())  # doctest: +SKIP
    >>> follower.start()  # doctest: +SKIP
    """

    def __init__(
        self,
        link: ChangeSource,
        resolve: Callable[[Sequence[tuple[int, str, str]]], None],
        inline: InlineRunner,
        since: int,
    ) -> None:
        self.link = link
        self.resolve = resolve
        self.inline = inline
        self.seq = since
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def looping(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if not self.looping:
            self._closed.clear()
            self._thread = threading.Thread(target=self._run, name="dlsched-scheduler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread (a wait on the link ends at once)."""
        self._closed.set()
        self.link.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                wait = 0.05 if self.inline.pending else 1.0
                rows = self.link.changes(self.seq, wait)
                if rows:
                    self.seq = rows[-1][0]
                    self.resolve(rows)
                self.inline.launch_allocated()
                self.inline.maintain()
            except Exception as error:
                if self._closed.is_set():
                    break
                log.warning("dlsched: %s", error)
                self._closed.wait(1.0)
        from ..store import Store

        store = getattr(self.link, "store", None)
        if isinstance(store, Store):
            store.close()  # this thread's connection to the ledger

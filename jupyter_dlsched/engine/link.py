"""A ``Scheduler``'s link to an engine in its own process: the pool without an agent.

``Scheduler(agent=False)`` (or ``DLSCHED_AGENT=0``), the SLURM backend and a policy
object passed in all decide in the caller's process. The ``Scheduler`` does not
know: it talks to an ``EngineLink`` exactly as it talks to an ``AgentLink``
(submit, steer, status, tick, settings, ``changes``), and the link calls the engine.

``changes`` is where the engine is driven: while a client waits for state changes,
the link ticks when the ledger moved (``PRAGMA data_version``, another participant
committed), when something asked for a decision (``wake``), and at least once a
second to reap expired leases; it polls fast just after a change (results come back
in milliseconds) and slowly when quiet. Any participant may tick: ``BEGIN
IMMEDIATE`` makes concurrent ticks safe.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..policy import Decisions
from ..store import JobInfo, Store
from ..vocab.errors import LedgerUnavailable
from .core import Engine

log = logging.getLogger("jupyter_dlsched")


class EngineLink:
    """Submit, steer and read through an engine held in this process.

    >>> link = EngineLink(Engine(Store(home)), owner="ana", uid=1000)  # doctest: +SKIP
    >>> link.submit("function", [files], default_name="f", origin="x.py", options={})
    ['k3x9m2ab']
    """

    shared = False
    through_agent = False

    def __init__(self, engine: Engine, *, owner: str, uid: int) -> None:
        self.engine = engine
        self.owner = owner
        self.uid = uid
        self._woken = threading.Event()
        self._interrupted = threading.Event()
        self._driving = False  # a thread waits in ``changes``: it ticks when woken
        self._version: int | None = None
        self._seen_event = -1
        self._last_change = self._last_tick = self._last_refill = time.monotonic()
        self._last_warned = -math.inf
        if engine.on_wake is None:  # an engine composed with a loop of its own keeps it
            engine.on_wake = self.wake

    @property
    def store(self) -> Store:
        return self.engine.store

    def ledger(self) -> Store:
        return self.engine.store

    # -- the requests --------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        jobs: Sequence[dict[str, bytes]],
        *,
        default_name: str,
        origin: str,
        options: dict[str, Any],
        inline: bool = False,
        backend: str = "local",
        suffixes: Sequence[str] | None = None,
    ) -> list[str]:
        """Queue ``jobs`` (each its files) with the same options; their ids."""
        batch = self.engine.prepare(
            kind,
            jobs,
            default_name=default_name,
            origin=origin,
            options=options,
            suffixes=suffixes,
            inline=inline,
        )
        return self.engine.insert(batch, owner=self.owner, uid=self.uid, inline=inline)

    def cancel(self, job_id: str) -> JobInfo:
        return self.engine.cancel(job_id)

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo:
        return self.engine.set_priority(job_id, priority)

    def requeue(self, job_id: str) -> JobInfo:
        return self.engine.requeue(job_id)

    def status(self) -> dict[str, Any]:
        return self.engine.status()

    def settings(self, **values: Any) -> None:
        self.engine.write_settings(**values)

    def tick(self, now: float | None = None) -> Decisions | None:
        return self.engine.tick(now)

    def schedules(self, msg: dict[str, Any]) -> dict[str, Any]:
        """List the schedules, or remove one (``{"remove": id}``): this user is the admin."""
        from ..schedules.requests import answer

        return answer(self.engine.store, msg, uid=self.uid, admin=True)

    # -- driving the engine while a client waits -------------------------------------------------

    def wake(self) -> None:
        """A decision is wanted: at once in the thread waiting in ``changes``, else now."""
        if self._driving:
            self._woken.set()
        else:
            self.engine.tick()

    def changes(self, since: int, wait: float) -> list[tuple[int, str, str]]:
        """State changes after event ``since``, ticking the engine while waiting up to
        ``wait`` seconds for one (what an ``AgentLink``'s agent does for its clients)."""
        self._driving = True
        store = self.engine.store
        deadline = time.monotonic() + wait
        if self._version is None:
            self._version = store.data_version()
            self._seen_event = store.last_event_seq()
        while not self._interrupted.is_set():
            quiet = time.monotonic() - self._last_change
            interval = min(0.25, max(0.002, quiet / 20))
            woke = self._woken.wait(min(interval, max(0.0, deadline - time.monotonic())))
            self._woken.clear()
            if self._interrupted.is_set():
                break
            try:
                if self._turn(woke) or since < self._seen_event:
                    rows = store.state_changes_since(since)
                    if rows:
                        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]
            except LedgerUnavailable as error:
                # a full disk is the user's to fix; say so once a minute, not a traceback a tick
                if time.monotonic() - self._last_warned >= 60.0:
                    self._last_warned = time.monotonic()
                    log.warning("dlsched: %s", error)
                time.sleep(0.5)
            except Exception:
                log.exception("dlsched scheduler loop")
                time.sleep(0.5)
            if time.monotonic() >= deadline:
                break
        return []

    def _turn(self, woke: bool) -> bool:
        """One turn of driving: tick if the ledger moved, a decision was asked for, or a
        second passed; True when a job changed state since the last turn."""
        store = self.engine.store
        moved = False
        current = store.data_version()
        if current != self._version:
            self._version = current
            event = store.last_event_seq()
            moved, self._seen_event = event != self._seen_event, event
        now = time.monotonic()
        if woke or moved:
            self._last_change = now
        if woke or moved or now - self._last_tick >= 1.0:
            self.engine.tick()
            self._last_tick = now
            event = store.last_event_seq()
            moved, self._seen_event = moved or event != self._seen_event, event
        if now - self._last_refill >= 30.0:
            self._last_refill = now
            store.reserve.refill()  # space came back: be ready for the next time
        return woke or moved

    def interrupt(self) -> None:
        """End a ``changes`` wait now (the scheduler is closing)."""
        self._interrupted.set()
        self._woken.set()

    def close(self) -> None:
        self._driving = False

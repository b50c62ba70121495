"""How a ``Scheduler`` decides: the direct path's tick, launching what it started, the loop.

``Scheduler`` (``scheduler.py``) is what callers use: settings, submitting,
steering, reading, results. This is the part that runs on its own: ``tick``
(one decision on the ledger, then launching this user's jobs it started, with
the stagers it armed and the inline jobs of this process), and the background
thread that ticks when the ledger changes and resolves the handles of jobs
that ended. Through a pool agent the agent decides; the loop then only waits
for its news and runs this process's inline jobs.

Any participant may tick (a kernel, the CLI, the server extension, the
supervisor of a job that just ended); ``BEGIN IMMEDIATE`` makes concurrent
ticks safe. The loop is woken at once by its own submissions and by ledger
changes (``PRAGMA data_version``), and ticks at least once a second to reap
expired leases.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import tick as tick_steps
from .errors import LedgerUnavailable
from .local import launcher
from .policy import Decisions, Policy
from .policy.elastic import with_elastic
from .schedules.firing import fire_due
from .staging import StagingGate
from .store import JobInfo

if TYPE_CHECKING:
    from .agent.link import AgentLink
    from .backends import Backend
    from .inline import InlineRunner
    from .settings import Settings

log = logging.getLogger("jupyter_dlsched")

UNLAUNCHED_GRACE = 2.0
REDECIDE_EVERY = 10.0  # seconds between decisions when nothing changed


class Deciding:
    """The deciding half of a ``Scheduler``: tick, launch, and the loop thread.

    >>> s = Scheduler(home, loop=False)  # doctest: +SKIP
    >>> decisions = s.tick()  # doctest: +SKIP
    >>> [start.job_id for start in decisions.starts]  # started, and launched from here  # doctest: +SKIP
    ['k3x9m2ab']
    """

    if TYPE_CHECKING:  # provided by the Scheduler this is part of
        store: Any  # the ledger (read through the agent in a shared pool)
        backend: Backend
        link: AgentLink | None
        home: Path
        uid: int
        _inline: InlineRunner
        _event_seq: int

        @property
        def settings(self) -> Settings: ...
        @property
        def inventory(self) -> dict[str, Any]: ...
        def policy(self) -> Policy: ...
        def _resolve_watched(self) -> None: ...
        def _resolve_rows(self, rows: Sequence[Any]) -> None: ...

    def __init__(self) -> None:
        self._orphan_tries: dict[str, float] = {}
        self._decided_on: tuple[int, str | None] = (-1, None)
        self._decide_again = 0.0
        #: the waiting jobs kept between decisions (only by a pool agent, the one decider)
        self._index: tick_steps.QueueIndex | None = None
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the tick --------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> Decisions | None:
        """Reap expired leases, ask the policy, commit allocations, launch what starts here.

        ``now`` is for replays and tests; by default the clock is read once the
        write lock is held, so a job never appears to start before the one it
        replaced ended.
        """
        if self.link is not None:
            self.link.tick()  # the agent decides; only this process can run its inline jobs
            self._launch_inline()
            return None
        fixed_now = now
        now = time.time() if now is None else now
        backend = self.backend.name
        fire_due(self.store, now)  # schedules whose tick came submit their next run
        waiting, expired, last_event, settings_json = self.store.tick_inputs(backend, now)
        # Deciding again is only worth it when a job changed state (every change is an
        # event), the settings changed, the policy asked for a wake-up, or a while passed
        # (aging, GPU memory used outside the scheduler).
        due = (
            fixed_now is not None
            or expired
            or (last_event, settings_json) != self._decided_on
            or now >= self._decide_again
        )
        decisions: Decisions | None = None
        reaped: list[JobInfo] = []
        gate: StagingGate | None = None
        positions: list[tuple[int | None, str | None, str]] = []
        if (waiting or expired) and due:
            settings = self.settings
            policy = self.policy()
            if backend == "local":
                # elastic jobs (gpus="1:4") grow and shrink under whatever policy decides;
                # elsewhere they run at their minimum
                policy = with_elastic(
                    policy, resize_every=settings.resize_every, restart_cost=settings.resize_cost
                )
            if backend == "local":
                # jobs whose inputs are not staged yet wait; the next ones get stagers
                policy = gate = StagingGate(self.store, policy, uid=self.stager_uid)
            inventory = self.inventory
            # NVML is read before taking the write lock, never while holding it
            job_pids = self.store.running_job_pids(backend)
            external = self.backend.external_gpu_mem(job_pids)
            self.backend.before_reap()
            with self.store.transaction() as wdb:
                now = time.time() if fixed_now is None else fixed_now
                reaped = tick_steps.reap(self.store, wdb, backend, now)
                decisions = tick_steps.decide(
                    self.store,
                    wdb,
                    backend=backend,
                    policy=policy,
                    inventory=inventory,
                    external_gpu_mem=external,
                    lease_ttl=settings.lease_ttl,
                    now=now,
                    deferred=positions,
                    index=self._index,
                )
                last_event = self.store.last_event_seq(wdb)
            self._decided_on = (last_event, settings_json)
            wake = decisions.wake_at if decisions.wake_at is not None else float("inf")
            self._decide_again = min(wake, now + REDECIDE_EVERY)
        for job in reaped:
            self.backend.reap(job)
        for source_id in gate.armed if gate is not None else ():
            self._launch_stager(source_id)
        self._launch_mine(now, [s.job_id for s in decisions.starts] if decisions else [])
        if decisions is not None:
            self._queue_positions(positions)
        return decisions

    def _queue_positions(self, changed: list[tuple[int | None, str | None, str]]) -> None:
        """Write the waiting jobs' places in line and reasons (after launching what started)."""
        if changed:
            with self.store.transaction() as db:
                self.store.set_queue_positions(db, changed)

    def _launch_mine(self, now: float, just_started: Iterable[str]) -> None:
        """Launch jobs of this user allocated by this tick, and orphans nobody launched."""
        fresh = set(just_started)
        rows = self.store.unlaunched(self.uid, self.backend.name)
        for job_id, started, inline in rows:
            if inline:
                # only the process that holds the cell can run it; the lease reaps the rest
                self._inline.launch(self.store.get(job_id))
                continue
            if job_id not in fresh:
                # allocated by another participant, which launches it; step in if it did not
                if started is None or now - started < UNLAUNCHED_GRACE:
                    continue
                if now - self._orphan_tries.get(job_id, 0.0) < UNLAUNCHED_GRACE:
                    continue
                self._orphan_tries[job_id] = now
            self.backend.launch(self.store.get(job_id))

    @property
    def stager_uid(self) -> int | None:
        """Whose stagings this scheduler starts: its own user's (None: everyone's)."""
        return int(self.uid)

    def _launch_stager(self, source_id: str) -> None:
        """Start the stager of a staging this tick armed."""
        launcher.launch_stager(self.home, source_id)

    def _launch_inline(self) -> None:
        """Start the threads of this process's inline jobs the agent has allocated."""
        if not self._inline.pending:
            return
        for job_id, _started, inline in self.store.unlaunched(self.uid, "local"):
            if inline and job_id in self._inline.pending:
                self._inline.launch(self.store.get(job_id))

    # -- the background loop ---------------------------------------------------------------

    @property
    def looping(self) -> bool:
        """True while the background loop runs in this process."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the background loop (``loop=True`` does this for you)."""
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self._thread = threading.Thread(target=self._run, name="dlsched-scheduler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the background loop; jobs keep running and the queue lives on in the ledger."""
        self._closed.set()
        self._wake.set()
        if self.link is not None:
            self.link.interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.backend.close()
        if self.link is not None:
            self.link.close()

    def wake(self) -> None:
        """Tick soon: at once in the background loop, or right here without one."""
        if self.looping:
            self._wake.set()
        else:
            self.tick()

    def _run(self) -> None:
        """Poll fast just after a job changed state (results come back in milliseconds),
        slowly when quiet; lease renewals and progress writes do not count as changes."""
        if self.link is not None:
            self._run_linked()
            return
        version = self.store.data_version()
        seen_event = self._last_event_seq()
        last_change = last_tick = last_refill = time.monotonic()
        last_warned = -math.inf
        while not self._closed.is_set():
            quiet = time.monotonic() - last_change
            interval = min(0.25, max(0.002, quiet / 20))
            woke = self._wake.wait(interval)
            self._wake.clear()
            if self._closed.is_set():
                break
            try:
                current = self.store.data_version()
                moved = False
                if current != version:
                    version = current
                    event = self._last_event_seq()
                    moved, seen_event = event != seen_event, event
                now = time.monotonic()
                if woke or moved:
                    last_change = now
                if woke or moved or now - last_tick >= 1.0:
                    self.tick()
                    self._inline.maintain()
                    last_tick = now
                if woke or moved:
                    self._resolve_watched()
                if now - last_refill >= 30.0:
                    last_refill = now
                    self.store.reserve.refill()  # space came back: be ready for the next time
            except LedgerUnavailable as error:
                # a full disk is the user's to fix; say so once a minute, not a traceback a tick
                if time.monotonic() - last_warned >= 60.0:
                    last_warned = time.monotonic()
                    log.warning("dlsched: %s", error)
                time.sleep(0.5)
            except Exception:
                log.exception("dlsched scheduler loop")
                time.sleep(0.5)
        self.store.close()

    def _run_linked(self) -> None:
        """Through an agent: wait for state changes (it answers as they happen), resolve
        handles, and run this process's inline jobs when they are allocated."""
        assert self.link is not None
        seq = self._event_seq
        while not self._closed.is_set():
            try:
                wait = 0.05 if self._inline.pending else 1.0
                rows = self.link.changes(seq, wait)
                if rows:
                    seq = rows[-1][0]
                    self._resolve_rows(rows)
                self._launch_inline()
                self._inline.maintain()
            except Exception as error:
                if self._closed.is_set():
                    break
                log.warning("dlsched: %s", error)
                self._closed.wait(1.0)

    def _last_event_seq(self) -> int:
        return self.store.last_event_seq()

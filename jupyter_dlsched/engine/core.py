"""The engine: the one place that validates, writes, decides and launches.

An ``Engine`` holds a ledger (``Store``) and a backend, and does what a pool's
decider does: it keeps the ledger's settings and the pool's inventory, checks
and inserts submissions, steers jobs (cancel, priority, requeue), and ticks —
reaps expired leases, asks the policy, commits allocations in one transaction,
then launches what started and the stagers it armed. It is composed, never
subclassed, by whoever decides:

* the pool agent (``agent/deciding.py``): its per-user limits as the policy's
  ``gate``, its forks as the ``launching``, its loop as the ``wake`` hook;
* a ``Scheduler`` without an agent, through ``EngineLink`` (``engine/link.py``);
* a job's supervisor, for its one decision after the job (``local/wake.tick_after``);
* the Ray driver.

The engine is also the ``Port`` of its backend: the backend records jobs in the
engine's ledger and wakes it, and holds nothing else of it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..backends import Backend, make_backend
from ..forecast import start_times
from ..machine.inventory import idle_capacity
from ..machine.pool_view import pool_shape, pool_with_jobs
from ..policy import Decisions, Policy, get_policy
from ..policy.elastic import with_elastic
from ..schedules.firing import fire_due
from ..staging import StagingGate
from ..store import JobInfo, Store, inventory_key
from ..store.settings import Settings, check_resize_every
from ..vocab.errors import SpecError
from ..vocab.every import check_interval
from ..vocab.options import RESOURCE_ARGS
from ..vocab.spec import MAX_NAME, JobSpec, build_spec, parse_priority
from ..vocab.sweep import member_name
from . import tick as tick_steps
from .job_files import check_job_files
from .launching import Launching, OwnJobs
from .queue_index import QueueIndex

if TYPE_CHECKING:
    from ..machine.inventory import PoolInfo
    from ..vocab.schedule_info import ScheduleInfo

#: Seconds between decisions when nothing changed (aging, GPU memory used outside the pool).
REDECIDE_EVERY = 10.0

#: A submission as the engine stores it: ``(job_id, spec, files)``.
Batch = list[tuple[str, JobSpec, dict[str, bytes]]]


#: Ranks in line written per transaction by ``Engine.flush_positions``.
POSITIONS_PER_WRITE = 2_000
#: A new ledger's ``min_schedule_interval`` (a duration), as ``DLSCHED_POLICY`` its policy.
MIN_INTERVAL_ENV = "DLSCHED_MIN_SCHEDULE_INTERVAL"

#: Seconds at least between two start-time forecasts. A drain of short jobs decides every
#: few milliseconds, and the forecast is most of such a decision (it holds up the next):
#: a decision within this of the last forecast leaves its own for a tick after it.
FORECAST_EVERY = 0.5


class Engine:
    """Validate, write, decide and launch for one ledger and one backend.

    >>> engine = Engine(Store(home), "local")  # doctest: +SKIP
    >>> batch = engine.prepare("function", [files], default_name="train", origin="x.py",
    ...                        options={"gpus": 1})  # doctest: +SKIP
    >>> engine.insert(batch, owner="ana", uid=1000)  # doctest: +SKIP
    ['k3x9m2ab']
    >>> [start.job_id for start in engine.tick().starts]  # doctest: +SKIP
    ['k3x9m2ab']

    ``launching`` starts allocated jobs and stagers (default: this user's, the way a
    pool without an agent does, ``OwnJobs``); ``gate`` wraps the policy (a shared
    pool's per-user limits); ``wake`` asks whoever drives the engine for a tick soon
    (default: tick now); ``keep_index`` keeps the waiting jobs in memory between
    decisions (only the one decider of a ledger may: the agent); with it and
    ``positions_at_once``, ranks in line are written at once only when that few
    changed, else at most once a second (``flush_positions``).
    """

    def __init__(
        self,
        store: Store,
        backend: str | Backend = "local",
        *,
        launching: Launching | None = None,
        gate: Callable[[Policy], Policy] | None = None,
        wake: Callable[[], None] | None = None,
        policy: Policy | None = None,
        keep_index: bool = False,
        positions_at_once: int | None = None,
        probe_pool: bool = True,
        **backend_options: Any,
    ) -> None:
        self.store = store
        self.home: Path = store.home
        self.uid = os.getuid()
        self.launching = launching if launching is not None else OwnJobs(self.uid)
        self.gate = gate
        self.on_wake = wake
        self._policy_object = policy
        #: whether a schedule's tick may make its run (a shared pool's rate per user)
        self.fire_gate: Callable[[ScheduleInfo, float], bool] | None = None
        self.backend = make_backend(backend, self, **backend_options)
        self.inventory_key = inventory_key(self.backend.name)
        #: ``((newest event, grants held past an end), settings)`` at the last decision
        self._decided_on: tuple[tuple[int, int], str | None] = ((-1, 0), None)
        self._decide_again = 0.0
        self._positions_at_once = positions_at_once
        self._positions: dict[str, tuple[float | None, str | None]] = {}
        self._index: QueueIndex | None = QueueIndex(self._positions) if keep_index else None
        self._positions_at = 0.0
        #: the latest whole-queue decision's forecast, not made yet, and when one last was
        self._forecast_waiting: start_times.Forecasting | None = None
        self._forecast_at = -math.inf
        if probe_pool or self.store.get_meta(self.inventory_key) is None:
            self.refresh_inventory()

    # -- the Port its backend holds ----------------------------------------------------------

    @property
    def through_agent(self) -> bool:
        return False  # the engine is the decider

    @property
    def inventory(self) -> dict[str, Any]:
        return dict(self.store.get_meta(self.inventory_key) or self.refresh_inventory())

    def wake(self) -> None:
        """Ask for a decision soon: through the hook of whoever drives this engine, or now."""
        if self.on_wake is not None:
            self.on_wake()
        else:
            self.tick()

    # -- settings and inventory --------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return Settings.load(self.store)

    def write_settings(
        self,
        policy: str | Policy | None = None,
        lease_ttl: float | None = None,
        grace: float | None = None,
        policy_params: dict[str, Any] | None = None,
        resize_every: object = None,
        resize_cost: object = None,
        min_schedule_interval: object = None,
    ) -> None:
        """Write the given settings to the ledger (unset ones keep theirs); a policy object
        decides for this engine only and is not written."""
        if policy is not None and not isinstance(policy, str):
            self._policy_object = policy
            policy = None
        if policy is not None:
            get_policy(policy, **(policy_params or {}))  # fail now on a bad name or parameter
        stored = self.store.get_meta("settings", None)
        settings = dict(stored or {})
        if stored is None:
            settings.update(
                {"policy": os.environ.get("DLSCHED_POLICY", "priority"), "policy_params": {}}
            )
            env_resize = os.environ.get("DLSCHED_RESIZE_EVERY")
            if env_resize is not None:  # a new ledger's default, as DLSCHED_POLICY
                settings["resize_every"] = check_resize_every(env_resize, "DLSCHED_RESIZE_EVERY")
            env_floor = os.environ.get(MIN_INTERVAL_ENV)
            if env_floor is not None:
                settings["min_schedule_interval"] = check_resize_every(env_floor, MIN_INTERVAL_ENV)
        updates = {
            "policy": policy,
            "policy_params": policy_params if policy is not None else None,
            "lease_ttl": lease_ttl,
            "grace": grace,
            "resize_every": check_resize_every(resize_every),
            "resize_cost": check_resize_every(resize_cost, "resize_cost"),
            "min_schedule_interval": check_resize_every(
                min_schedule_interval, "min_schedule_interval"
            ),
        }
        changed = stored is None
        for key, value in updates.items():
            if value is not None and settings.get(key) != value:
                settings[key] = value
                changed = True
        if changed:
            self.store.set_meta("settings", settings)

    def policy(self) -> Policy:
        """What decides: a policy object given to this engine, the backend's own (SLURM's),
        or the ledger's by name; inside the gate when there is one."""
        policy = self._policy_object or self.backend.policy()
        if policy is None:
            s = self.settings
            policy = get_policy(s.policy, **(s.policy_params or {}))
        return self.gate(policy) if self.gate is not None else policy

    def refresh_inventory(self) -> dict[str, Any]:
        """Probe the machine (or cluster) and store its shape in the ledger."""
        inventory = self.backend.inventory()
        if self.store.get_meta(self.inventory_key) != inventory:
            self.store.set_meta(self.inventory_key, inventory)
        return inventory

    # -- submitting and steering -------------------------------------------------------------

    def prepare(
        self,
        kind: str,
        jobs: Sequence[dict[str, bytes]],
        *,
        default_name: str,
        origin: str,
        options: dict[str, Any],
        suffixes: Sequence[str | None] | None = None,
        inventory: dict[str, Any] | None = None,
        check: Callable[[JobSpec], None] | None = None,
        inline: bool = False,
    ) -> Batch:
        """Validate a submission (one spec for every job of it) and give each job its id and
        name: ``(job_id, spec, files)`` for ``insert``. The one copy of the checks every
        door uses; ``SpecError`` says what is wrong.

        ``suffixes`` tell a sweep's members apart (``train[2] lr=0.01``); ``inventory``
        and ``check`` are another backend's (the agent's Ray jobs), by default this one's.
        """
        unknown = sorted(set(options) - set(RESOURCE_ARGS))
        if unknown:
            raise SpecError(unknown[0], options[unknown[0]], "a known option")
        spec = build_spec(
            capacity=idle_capacity(self.inventory if inventory is None else inventory),
            kind=kind,
            default_name=default_name,
            origin=origin,
            **options,
        )
        (self.backend.check if check is None else check)(spec)
        for files in jobs:
            check_job_files(kind, files, inline=inline)
        if spec.every is not None:
            check_interval(spec.every, self.settings.min_schedule_interval)
        names = list(suffixes) if suffixes is not None else [None] * len(jobs)
        if len(names) != len(jobs):
            raise SpecError("suffixes", len(names), f"one per job ({len(jobs)})")
        return [
            (
                self.store.new_id(),
                replace(spec, name=member_name(spec.name, suffix, MAX_NAME)) if suffix else spec,
                files,
            )
            for files, suffix in zip(jobs, names, strict=True)
        ]

    def insert(
        self,
        batch: Batch,
        *,
        owner: str,
        uid: int,
        inline: bool = False,
        backend: str | None = None,
    ) -> list[str]:
        """Store a prepared submission in one transaction and ask for a decision."""
        self.store.insert_jobs(
            batch, owner=owner, uid=uid, backend=backend or self.backend.name, inline=inline
        )
        self.wake()
        return [job_id for job_id, _, _ in batch]

    def cancel(self, job_id: str) -> JobInfo:
        """Cancel a job: queued ones end now, running ones are stopped by their supervisor."""
        self.store.cancel(job_id, unsupervised_ends=self.backend.name == "local")
        info = self.store.get(job_id)
        if info.state == "running":
            self.backend.cancel(info)
        self.wake()
        return info

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo:
        self.store.set_priority(job_id, parse_priority(priority))
        self.wake()
        return self.store.get(job_id)

    def requeue(self, job_id: str) -> JobInfo:
        info = self.store.requeue(job_id)
        self.wake()
        return info

    # -- reading -----------------------------------------------------------------------------

    def pool(self) -> PoolInfo:
        """The machine now, with each GPU's jobs and the memory granted on it."""
        if self.backend.name != "local":
            return self.backend.pool()
        return pool_with_jobs(self.store, self.inventory)

    def status(self) -> dict[str, Any]:
        """Counts by state and the pool's shape, for the CLI, REST and status bar."""
        return {
            "version": __version__,
            "home": str(self.home),
            "backend": self.backend.name,
            "policy": getattr(self.policy(), "name", str(self.settings.policy)),
            "counts": self.store.count_jobs(),
            **pool_shape(self.store, self.inventory, self.backend.name),
        }

    # -- the tick ----------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> Decisions | None:
        """Reap expired leases, ask the policy, commit allocations, launch what started.

        ``now`` is for replays and tests; by default the clock is read once the write lock
        is held, so a job never appears to start before the one it replaced ended. None
        when nothing needed deciding.
        """
        try:
            return self._tick(now)
        except BaseException:
            if self._index is not None:
                # read everything again after a failure, as the ledger has it
                self._positions.clear()
                self._index = QueueIndex(self._positions)
            raise

    def _tick(self, fixed_now: float | None) -> Decisions | None:
        now = time.time() if fixed_now is None else fixed_now
        backend = self.backend.name
        fire_due(self.store, now, self.fire_gate)  # schedules whose tick came: their next run
        waiting, expired, last_event, settings_json = self.store.queue.tick_inputs(backend, now)
        # Deciding again is only worth it when a job changed state (every change is an
        # event) or released the grant it held past its end, the settings changed, the
        # policy asked for a wake-up, or a while passed (aging, GPU memory used outside
        # the scheduler).
        due = (
            fixed_now is not None
            or expired
            or (last_event, settings_json) != self._decided_on
            or now >= self._decide_again
        )
        decisions: Decisions | None = None
        reaped: list[JobInfo] = []
        gate: StagingGate | None = None
        positions: list[tuple[float | None, str | None, str]] = []
        forecasts: list[start_times.Forecasting] = []
        if (waiting or expired) and due:
            settings = self.settings
            policy = self.policy()
            if backend == "local":
                # elastic jobs (gpus="1:4") grow and shrink under whatever policy decides;
                # elsewhere they run at their minimum
                policy = with_elastic(
                    policy, resize_every=settings.resize_every, restart_cost=settings.resize_cost
                )
                # jobs whose inputs are not staged yet wait; the next ones get stagers
                policy = gate = StagingGate(self.store, policy, uid=self.launching.stager_uid)
            inventory = self.inventory
            # NVML is read before taking the write lock, never while holding it
            job_pids = self.store.queue.running_job_pids(backend)
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
                    forecasts=forecasts,
                )
                last_event = (
                    self.store.last_event_seq(wdb),
                    self.store.queue.held_grants(wdb, backend),
                )
            self._decided_on = (last_event, settings_json)
            wake = decisions.wake_at if decisions.wake_at is not None else math.inf
            self._decide_again = min(wake, now + REDECIDE_EVERY)
        for job in reaped:
            self.backend.reap(job)
        for source_id in gate.armed if gate is not None else ():
            self.launching.launch_stager(self, source_id)
        started = {s.job_id for s in decisions.starts} if decisions is not None else set()
        self.launching.launch_jobs(self, now, started)
        if decisions is not None:
            self._queue_positions(positions)
        if forecasts:
            self._forecast_waiting = forecasts[-1]  # the latest saw the most
        self._forecast(decisions, at_once=fixed_now is not None)
        return decisions

    def _forecast(self, decisions: Decisions | None, at_once: bool) -> None:
        """The start-time estimates the latest whole-queue decision asked for, made once
        what it started is launched and without the write lock, at most every
        ``FORECAST_EVERY`` seconds (a tick at a given moment, ``at_once``: now); decide
        again when they may go stale."""
        asked = self._forecast_waiting
        if asked is None:
            return
        if not at_once and time.monotonic() - self._forecast_at < FORECAST_EVERY:
            return  # a later tick makes it: the agent ticks at least once a second
        self._forecast_waiting = None
        self._forecast_at = time.monotonic()
        changes, refresh = start_times.estimate(self.store, asked)
        if changes:
            with self.store.transaction() as db:
                self.store.queue.set_start_estimates(db, changes)
        if self._index is not None:
            self._index.refresh_at = refresh if refresh is not None else math.inf
        if refresh is not None:
            # a running job may outlive its assumed end: look again then
            if decisions is not None and (decisions.wake_at is None or refresh < decisions.wake_at):
                decisions.wake_at = refresh
            self._decide_again = min(self._decide_again, refresh)

    def _queue_positions(self, changed: list[tuple[float | None, str | None, str]]) -> None:
        """Write the waiting jobs' ranks in line and reasons that changed (after launching
        what started); with ``positions_at_once``, many at once (a new deep queue ranked, or
        one reason for all of it) wait for ``flush_positions``. Only the decider that keeps
        the queue index keeps them back: it knows what it has not written yet."""
        if self._positions_at_once is None or self._index is None:
            if changed:
                with self.store.transaction() as db:
                    self.store.queue.set_queue_positions(db, changed)
            return
        self._positions.update((job_id, (pos, why)) for pos, why, job_id in changed)
        if len(self._positions) <= self._positions_at_once:
            self.flush_positions(force=True)

    def flush_positions(self, force: bool = False) -> None:
        """Write the ranks in line kept back, at most once a second unless ``force``.

        In transactions of ``POSITIONS_PER_WRITE`` rows, so that a deep queue's (a new one
        ranked at once) do not hold the write lock for most of a second while submits and
        claims wait; a reader between two of them may see some jobs already in their new
        order and others not yet, as between any two decisions (the places read are 1..n
        all the same: they are numbered from the ranks as they are read)."""
        now = time.monotonic()
        if self._positions and (force or now - self._positions_at >= 1.0):
            rows = [(pos, why, job_id) for job_id, (pos, why) in self._positions.items()]
            for i in range(0, len(rows), POSITIONS_PER_WRITE):
                chunk = rows[i : i + POSITIONS_PER_WRITE]
                with self.store.transaction() as db:  # the rest kept if the disk is full
                    self.store.queue.set_queue_positions(db, chunk)
                for _, _, job_id in chunk:
                    del self._positions[job_id]
            self._positions_at = now

    def close(self) -> None:
        """Stop the backend's threads; jobs keep running and the queue lives on."""
        self.backend.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

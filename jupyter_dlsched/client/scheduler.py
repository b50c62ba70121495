"""The scheduler: what callers use to submit, steer and read jobs, and get their results.

A ``Scheduler`` is a client only. Whatever decides — this user's pool agent
(``agent/``, the default), a shared pool's service, or an engine in this very
process (``engine/``: ``agent=False``, the SLURM backend, a policy object) — it
reaches over one link with one set of calls: submit, cancel, priority, requeue,
status, tick, settings and the state changes its loop (``following.py``) reads to
resolve handles. It holds the link, the pool's inventory as the ledger has it,
the submit paths, steering, and decoding results.
"""

from __future__ import annotations

import getpass
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..agent.link import AgentLink, connect
from ..backends import Backend, make_backend
from ..backends.port import Link
from ..machine.inventory import PoolInfo
from ..machine.pool_view import pool_shape, pool_with_jobs
from ..store import JobInfo, Store, inventory_key
from ..store.buffers import DataTooLarge
from ..store.settings import Settings, check_resize_every
from ..vocab.errors import PermissionDenied, SpecError, raised_here
from ..vocab.options import RESOURCE_ARGS
from ..vocab.schedule_info import ScheduleInfo
from ..vocab.sweep import member_suffixes
from ..vocab.words import over_payload_limit
from .context import origin, submit_context
from .data import data_folder, data_status, pickle_job
from .following import Follower
from .handle import JobHandle, Watching
from .inline import InlineRunner

if TYPE_CHECKING:
    from ..engine import Engine
    from ..policy import Decisions, Policy


class Scheduler(Watching):
    """One participant in the machine's shared queue.

    >>> s = Scheduler(home="/tmp/dls-demo")  # doctest: +SKIP
    >>> h = s.submit(pow, 2, 10, cpus=1)  # doctest: +SKIP
    >>> h.result()  # doctest: +SKIP
    1024

    ``policy`` and ``lease_ttl``/``grace`` given here are written to the ledger
    and used by every participant; left out, the ledger's (or
    ``DLSCHED_POLICY``) apply. So are ``resize_every`` (seconds between two
    resizes of one elastic job, 300 by default, ``DLSCHED_RESIZE_EVERY`` for a
    new ledger) and ``resize_cost`` (seconds a resize is taken to cost, 30);
    see ``docs/elastic.md``; and ``min_schedule_interval`` (seconds at least between
    two ticks of a schedule, 60, ``DLSCHED_MIN_SCHEDULE_INTERVAL`` for a new ledger;
    in a shared pool ``service.toml`` sets it).
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        policy: str | Policy | None = None,
        backend: str | Backend | None = None,
        *,
        loop: bool = True,
        lease_ttl: float | None = None,
        grace: float | None = None,
        policy_params: dict[str, Any] | None = None,
        resize_every: float | None = None,
        resize_cost: float | None = None,
        min_schedule_interval: float | str | None = None,
        probe_pool: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max: int | str | None = None,
        agent: bool | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        **backend_options: Any,
    ) -> None:
        backend_name = backend if backend is not None else os.environ.get("DLSCHED_BACKEND")
        in_process = policy is not None and not isinstance(policy, str)
        agent_link: AgentLink | None = None
        if backend_name in (None, "local") and not in_process and not backend_options:
            agent_link = connect(home, socket_path=socket_path, agent=agent)
        elif backend_name == "ray" and not in_process and socket_path is None:
            # Ray jobs are run by this user's agent's Ray driver: they outlive this process
            agent_link = connect(home, agent=agent, shared_pool=False)
        elif socket_path is not None or agent:
            raise SpecError(
                "agent",
                socket_path or agent,
                "the local backend and a policy by name (a shared pool runs local jobs only, "
                "and a pool agent runs the policy in its own process)"
                if socket_path is not None
                else "the local or ray backend and a policy by name (a pool agent runs the "
                "policy in its own process)",
            )
        self.owner = getpass.getuser()
        self.uid = os.getuid()
        settings: dict[str, Any] = {
            "policy": policy,
            "lease_ttl": lease_ttl,
            "grace": grace,
            "policy_params": policy_params,
            "resize_every": check_resize_every(resize_every),
            "resize_cost": check_resize_every(resize_cost, "resize_cost"),
            "min_schedule_interval": check_resize_every(
                min_schedule_interval, "min_schedule_interval"
            ),
        }
        if agent_link is not None:
            agent_link.settings(**settings)
            self._attach(agent_link, make_backend(backend_name or "local", self, **backend_options))
        else:
            # no agent: an engine in this process decides, behind the same kind of link (the
            # engine, its policies and forecasts imported only here: a CLI run or a kernel
            # that reaches an agent does without them)
            from ..engine import Engine, EngineLink

            engine = Engine(
                Store(home), backend_name or "local", probe_pool=False, **backend_options
            )
            engine.write_settings(**settings)
            if probe_pool or engine.store.get_meta(engine.inventory_key) is None:
                engine.refresh_inventory()
            link = EngineLink(engine, owner=self.owner, uid=self.uid)
            self._attach(link, engine.backend, engine)
        if cache_dir is not None or cache_max is not None:
            self.configure_cache(folder=cache_dir, max_size=cache_max)
        if isinstance(self.link, AgentLink) and self.backend.name == "ray":
            if probe_pool or self.store.get_meta(inventory_key("ray")) is None:
                self.link.join_ray(**self.backend.driver_options())  # type: ignore[attr-defined]
        if loop:
            self.start()

    @classmethod
    def of_engine(cls, engine: Engine, *, loop: bool = False) -> Scheduler:
        """A client of an engine composed elsewhere in this process (the pool agent's own,
        in a test or a benchmark): it decides with that engine's parts, limits and
        launching included.

        >>> s = Scheduler.of_engine(agent.sched)  # doctest: +SKIP
        """
        from ..engine import EngineLink

        self = cls.__new__(cls)
        self.owner = getpass.getuser()
        self.uid = os.getuid()
        self._attach(EngineLink(engine, owner=self.owner, uid=self.uid), engine.backend, engine)
        if loop:
            self.start()
        return self

    def _attach(self, link: Link, backend: Backend, engine: Engine | None = None) -> None:
        """Take ``link`` as this scheduler's one way to the pool, and ``backend`` as its own;
        ``engine``: the one in this process behind ``link``, where no agent decides."""
        self.link: Link = link
        self._engine = engine
        self.store = link.ledger()
        self.home = self.store.home
        self.backend = backend
        self.inventory_key = inventory_key(backend.name)
        self._watched: dict[str, list[JobHandle]] = {}
        self._inline = InlineRunner(self)
        self._watch_lock = threading.Lock()
        since = self.store.last_event_seq()
        self._follower = Follower(link, self._resolve_rows, self._inline, since)

    # -- settings and pool ---------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return Settings.load(self.store)

    def policy(self) -> Policy:
        """What decides this scheduler's jobs (the agent's policy is its own)."""
        if self._engine is not None:
            return self._engine.policy()
        from ..policy import get_policy

        s = self.settings
        return get_policy(s.policy, **(s.policy_params or {}))

    def refresh_inventory(self) -> dict[str, Any]:
        """Probe the machine (or cluster) and store its shape in the ledger (whoever decides
        probes it: through an agent, the inventory it stored)."""
        if self._engine is not None:
            return self._engine.refresh_inventory()
        return dict(self.store.get_meta(self.inventory_key) or {})

    @property
    def through_agent(self) -> bool:
        """Whether a pool agent decides and launches for this scheduler (its backend's port)."""
        return self.link.through_agent

    @property
    def inventory(self) -> dict[str, Any]:
        return dict(self.store.get_meta(self.inventory_key) or self.refresh_inventory())

    @property
    def shared(self) -> bool:
        """Whether this is a client of a pool every user of the machine shares (a service)."""
        return self.link.shared

    def ask_service(self, op: Literal["metrics", "samples"], **msg: Any) -> dict[str, Any]:
        """A request only a shared pool's service answers (its metrics, its samples)."""
        if not isinstance(self.link, AgentLink) or not self.link.shared:
            raise SpecError("op", op, "a request to a shared pool's service (this pool is yours)")
        return dict(self.link.client.call(op, **msg))

    # -- the loop ----------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> Decisions | None:
        """Ask for a decision now, and start this process's inline jobs it allocated; the
        decisions when this process's engine made them (``now`` is for replays and tests)."""
        decisions = self.link.tick(now)
        self._inline.launch_allocated()
        return decisions

    @property
    def looping(self) -> bool:
        """True while the background loop runs in this process."""
        return self._follower.looping

    def start(self) -> None:
        """Start the background loop (``loop=True`` does this for you)."""
        self._follower.start()

    def close(self) -> None:
        """Stop the background loop; jobs keep running and the queue lives on in the ledger."""
        self._follower.close()
        self.backend.close()
        self.link.close()

    def wake(self) -> None:
        """Ask for a decision soon (the backend's threads do when resources came free)."""
        self.link.wake()

    def configure_cache(
        self,
        folder: str | os.PathLike[str] | None = None,
        max_size: int | str | None = None,
        ahead: int | None = None,
        max_rate: int | str | None = None,
    ) -> dict[str, Any]:
        """Set where staged data is cached and how much (ledger-wide; unset ones keep theirs).

        >>> s.configure_cache(folder="/scratch/dlsched-cache", max_size="500GiB")  # doctest: +SKIP

        ``ahead``: how many of the next jobs in the queue get their data staged;
        ``max_rate``: bytes per second staging may read (spares a shared file server).
        """
        from ..staging import configure

        configure(self.store, folder, max_size, ahead, max_rate)
        return self.cache_info()

    def cache_info(self) -> dict[str, Any]:
        """The staging cache: folder, cap, bytes, entries, hits, what is being staged.

        >>> s.cache_info()  # doctest: +SKIP
        {'folder': '.../cache', 'max_bytes': ..., 'bytes': 209715200, 'entries': 1, 'hits': 3, ...}
        """
        from ..staging import cache_info

        if isinstance(self.link, AgentLink) and self.link.shared:
            return self.link.cache()
        return cache_info(self.store)

    # -- submitting ------------------------------------------------------------------------

    @raised_here
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> JobHandle:
        """Queue ``fn(*args, **kwargs)`` as a job; resource keywords are taken out first.

        >>> h = s.submit(train, 1e-3, gpus=1, cpus=2, mem="8GiB", priority="high")  # doctest: +SKIP
        """
        if not callable(fn):
            raise SpecError("fn", fn, "a function or other callable")
        resources = {k: kwargs.pop(k) for k in RESOURCE_ARGS if k in kwargs}
        payload = {"fn": fn, "args": args, "kwargs": kwargs}
        default = getattr(fn, "__name__", type(fn).__name__)
        return self.submit_payload("function", payload, default_name=default, **resources)

    def submit_command(self, argv: Sequence[str], **resources: Any) -> JobHandle:
        """Queue a program (``argv``) as a job in the same queue as notebook jobs."""
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise SpecError("argv", argv, "a non-empty list of strings, e.g. ['python', 'x.py']")
        files = {"command.json": json.dumps({"argv": list(argv)}).encode()}
        return self._insert("command", files, default_name=Path(argv[0]).name, **resources)

    @raised_here
    def submit_notebook(
        self,
        path: str | os.PathLike[str],
        *,
        parameters: dict[str, Any] | None = None,
        output: str | os.PathLike[str] | None = None,
        kernel: str | None = None,
        **resources: Any,
    ) -> JobHandle:
        """Queue a whole notebook; the result is the executed copy's path (``nbjobs/``).

        >>> s.submit_notebook("train.ipynb", parameters={"lr": 3e-4}, gpus=1)  # doctest: +SKIP
        """
        from ..nbjobs.submit import submit_notebook

        return submit_notebook(
            self, path, parameters=parameters, output=output, kernel=kernel, **resources
        )

    def submit_payload(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        default_name: str = "job",
        origin_text: str | None = None,
        **resources: Any,
    ) -> JobHandle:
        """Queue a pickled payload: ``{"fn", "args", "kwargs"}`` or ``{"runner", ...}``.

        ``runner(payload)`` is called in the job process when present (cells use this).
        ``origin_text`` says whom the job serves when not this process (a kernel's notebook).
        """
        files = {"payload.pkl": self._pickle_job(payload, self._data_folder())}
        return self._insert(
            kind, files, default_name=default_name, origin_text=origin_text, **resources
        )

    def submit_inline(
        self,
        fn: Callable[[JobInfo], Any],
        *,
        kind: str = "cell",
        default_name: str = "cell",
        **resources: Any,
    ) -> JobHandle:
        """Queue ``fn(info)`` to run in a thread of this process once resources are granted.

        See ``jupyter_dlsched.client.inline`` for what cancel and time limits can do there.
        """
        if resources.get("every") is not None:
            raise SpecError(
                "every",
                resources["every"],
                "no schedule for a job that runs in this process (--inline): it runs once",
            )
        if resources.get("retries"):
            raise SpecError(
                "retries",
                resources["retries"],
                "0 for a job that runs in this process (--inline): it runs once, in a thread",
            )
        return self._insert(kind, {}, default_name=default_name, inline_fn=fn, **resources)

    def _data_folder(self) -> Path | None:
        return data_folder(self.home, shared=self.shared, backend=self.backend.name)

    def _pickle_job(
        self,
        payload: dict[str, Any],
        folder: Path | None,
        written: dict[int, tuple[Any, str]] | None = None,
    ) -> bytes:
        """``pickle_job``; data that does not fit beside what ended jobs keep for a requeue
        takes their room (nothing was written yet when it is refused). In a shared pool
        the service is asked first whether the data fits in this user's payload limit."""
        room = self._payload_room if self.shared else None
        try:
            return pickle_job(payload, folder, written, room=room)
        except DataTooLarge:
            if self.shared or folder is None or not self.store.release_kept_payloads(self.uid):
                raise
            return pickle_job(payload, folder, written)

    def _payload_room(self, need: int) -> None:
        """Refuse ``need`` bytes of new data over this user's payload limit before they are
        written, in the service's words (it checks again at submit)."""
        assert isinstance(self.link, AgentLink)
        reply = self.link.client.call("room")
        limit = reply["limit"]
        if limit is not None and reply["held"] + need > limit:
            raise PermissionDenied(over_payload_limit(self.owner, reply["held"], limit, need))

    def _insert(
        self,
        kind: str,
        files: dict[str, bytes],
        *,
        default_name: str,
        inline_fn: Callable[[JobInfo], Any] | None = None,
        origin_text: str | None = None,
        **resources: Any,
    ) -> JobHandle:
        unknown = set(resources) - set(RESOURCE_ARGS)
        if unknown:
            raise SpecError(sorted(unknown)[0], resources[sorted(unknown)[0]], "a known option")
        files["context.json"] = json.dumps(submit_context()).encode()
        [job_id] = self.link.submit(
            kind,
            [files],
            default_name=default_name,
            origin=origin_text or origin(),
            options=resources,
            inline=inline_fn is not None,
            backend=self.backend.name,
        )
        if inline_fn is not None:
            self._inline.register(job_id, inline_fn)
            self._inline.launch_allocated()  # a decision may have come before the register
        handle = JobHandle(self, job_id)
        self._watch(handle, check=False)
        return handle

    @raised_here
    def map(
        self, fn: Callable[..., Any], items: Iterable[Any], **resources: Any
    ) -> list[JobHandle]:
        """One job per item, stored in one transaction: ``s.map(train, [1e-3, 1e-4], gpus=1)``."""
        if not callable(fn):
            raise SpecError("fn", fn, "a function or other callable")
        unknown = set(resources) - set(RESOURCE_ARGS)
        if unknown:
            key = sorted(unknown)[0]
            raise SpecError(key, resources[key], "a known option")
        items = list(items)
        suffixes = member_suffixes(fn, items)  # "[2] lr=0.01": members told apart
        folder, written = self._data_folder(), {}  # type: ignore[var-annotated]
        fn_pickle = self._pickle_job({"fn": fn}, folder, written)
        context = json.dumps(submit_context()).encode()
        ids = self.link.submit(
            "function",
            [
                {
                    "payload.pkl": self._pickle_job(
                        {"fn_pickle": fn_pickle, "args": (item,)}, folder, written
                    ),
                    "context.json": context,
                }
                for item in items
            ],
            default_name=getattr(fn, "__name__", type(fn).__name__),
            origin=origin(),
            options=resources,
            backend=self.backend.name,
            suffixes=suffixes,
        )
        handles = [JobHandle(self, job_id) for job_id in ids]
        for handle in handles:
            self._watch(handle, check=False)
        return handles

    # -- reading and steering --------------------------------------------------------------

    def jobs(
        self,
        state: str | Iterable[str] | None = None,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[JobInfo]:
        """Jobs in submit order, optionally by state(s) and owner."""
        states = [state] if isinstance(state, str) else state
        return self.store.jobs(states=states, owner=owner, limit=limit, offset=offset)

    def info(self, job_id: str) -> JobInfo:
        return self.store.get(job_id)

    def get(self, job_id: str) -> JobHandle:
        """A handle on an existing job (``JobNotFound`` if there is none)."""
        self.store.get(job_id)
        handle = JobHandle(self, job_id)
        self._watch(handle)
        return handle

    def log_path(self, job_id: str) -> Path:
        return self.store.spool(job_id) / "log"

    def cancel(self, job_id: str) -> JobInfo:
        """Cancel a job: queued ones end now, running ones are stopped by their supervisor."""
        return self.link.cancel(job_id)

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo:
        """Change a job's priority (``"high"`` or an integer); takes effect at the next tick."""
        return self.link.set_priority(job_id, priority)

    @raised_here
    def requeue(self, job_id: str) -> JobHandle:
        """Run a finished job again: a new job with the same spec (what it runs, what it
        needs, its name), linked to the old one (``JobInfo.requeue_of``).

        >>> again = s.requeue("k3x9m2ab")  # doctest: +SKIP
        >>> again.info().requeue_of  # doctest: +SKIP
        'k3x9m2ab'

        Only a job in a final state can be requeued (``IllegalTransition`` otherwise);
        in a shared pool, only its owner or an admin may.
        """
        return self.get(self.requeue_job(job_id).id)

    def requeue_job(self, job_id: str) -> JobInfo:
        """``requeue`` answering the new job's row (what the agent and REST send back)."""
        return self.link.requeue(job_id)

    def schedules(self) -> list[ScheduleInfo]:
        """The schedules made with ``every=`` (yours; an admin's: all), next to run first.

        >>> s.submit(report, every="0 2 * * *")  # doctest: +SKIP
        >>> [(x.id, x.every, x.name) for x in s.schedules()]  # doctest: +SKIP
        [('s4k2m9qa', '0 2 * * *', 'report')]
        """
        reply = self._schedule_request({})
        return [ScheduleInfo(**row) for row in reply["schedules"]]

    def remove_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Stop a schedule: no new runs (a run going on goes on); the removed schedule."""
        return ScheduleInfo(**self._schedule_request({"remove": schedule_id})["schedule"])

    def _schedule_request(self, msg: dict[str, Any]) -> dict[str, Any]:
        return self.link.schedules(msg)

    def pool(self) -> PoolInfo:
        """The machine now, with each GPU's jobs and the memory the scheduler granted."""
        if self.backend.name != "local":
            return self.backend.pool()
        return pool_with_jobs(self.store, self.inventory)

    def status(self) -> dict[str, Any]:
        """Counts by state and the pool's shape, for the CLI, REST and status bar."""
        status = self.link.status()
        status["data"] = data_status(self.home, shared=self.shared, backend=self.backend.name)
        if not self.shared:  # what this user's own pool imports ahead of their jobs
            status["preload"] = list(self.store.get_meta(f"preload:{self.uid}") or [])
        if isinstance(self.link, AgentLink) and self.backend.name != "local":
            # the agent's own pool is the local one
            status.update(pool_shape(self.store, self.inventory, self.backend.name))
        return status

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The scheduler: what callers use to submit, steer and read jobs, and get their results.

A ``Scheduler`` is one participant in the machine's queue: by default a client
of the pool agent (``agent/``), else it writes the ledger itself. How it
decides and launches (``tick``) and its background loop (``start``, ``close``,
``wake``) are in ``deciding.py``; this module holds its settings and the
pool's inventory, the submit paths, steering, and decoding results.
"""

from __future__ import annotations

import copy
import getpass
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from ._version import __version__
from .agent.link import AgentLink, connect
from .backends import Backend, make_backend
from .deciding import Deciding
from .errors import JobNotFound, SpecError, raised_here
from .handle import JobHandle, Watching
from .inline import InlineRunner
from .options import RESOURCE_ARGS
from .policy import Policy, get_policy
from .pool import PoolInfo, idle_capacity, probe, remembered_simulation
from .schedules.info import ScheduleInfo
from .schedules.requests import answer as schedule_request
from .settings import Settings, check_resize_every
from .spec import MAX_NAME, build_spec, parse_priority, pickle_payload
from .store import WAITING, JobInfo, Store
from .sweep import member_name, member_suffixes

# variables that describe the submitting kernel, not the job
_ENV_DROP = (
    "DLSCHED_JOB_ID",
    "DLSCHED_DEVICES",
    "DLSCHED_GPU_MEM",
    "CUDA_VISIBLE_DEVICES",
    # a GPU kernel's own lease (docs/kernels.md): a job it submits is not that kernel
    "DLSCHED_KERNEL_LEASE",
    "DLSCHED_KERNEL_JOB",
)


def origin() -> str:
    """Where a submission comes from: the notebook path in a Jupyter kernel, else the program."""
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        return session
    if "ipykernel" in sys.modules:
        return "notebook"
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


def submit_context() -> dict[str, Any]:
    """Working folder, import path and environment a job process will get."""
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    if env.get("MPLBACKEND", "").startswith("module://"):
        env.pop("MPLBACKEND")  # an inline backend means nothing in a background process
    return {
        "cwd": os.getcwd(),
        "sys_path": [p for p in sys.path if p],
        "env": env,
        # a shared pool runs the job in this interpreter (as its owner), not in the service's
        "executable": sys.executable,
    }


def _job_of(pid: int, by_pid: dict[int, str]) -> str | None:
    """The job a GPU process belongs to: its own pid, or any ancestor's (a rank, a data
    loader worker, a process the job started), is a job's or its supervisor's."""
    if pid in by_pid:
        return by_pid[pid]
    try:
        for parent in psutil.Process(pid).parents():
            if parent.pid in by_pid:
                return by_pid[parent.pid]
    except psutil.Error:
        pass
    return None


class Scheduler(Deciding, Watching):
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
    see ``docs/elastic.md``.
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
        probe_pool: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max: int | str | None = None,
        agent: bool | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        **backend_options: Any,
    ) -> None:
        self.link: AgentLink | None = None
        backend_name = backend if backend is not None else os.environ.get("DLSCHED_BACKEND")
        in_process = policy is not None and not isinstance(policy, str)
        if backend_name in (None, "local") and not in_process and not backend_options:
            self.link = connect(home, socket_path=socket_path, agent=agent)
        elif backend_name == "ray" and not in_process and socket_path is None:
            # Ray jobs are run by this user's agent's Ray driver: they outlive this process
            self.link = connect(home, agent=agent, shared_pool=False)
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
        self._policy_object: Policy | None = None
        if self.link is not None:
            self.store = self.link.ledger()
            self.home = self.store.home
            self.link.settings(
                policy=policy,
                lease_ttl=lease_ttl,
                grace=grace,
                policy_params=policy_params,
                resize_every=check_resize_every(resize_every),
                resize_cost=check_resize_every(resize_cost, "resize_cost"),
            )
        else:
            self.store = Store(home)
            self.home = self.store.home
            self._write_settings(
                policy,
                lease_ttl,
                grace,
                policy_params,
                resize_every=resize_every,
                resize_cost=resize_cost,
            )
        if cache_dir is not None or cache_max is not None:
            self.configure_cache(folder=cache_dir, max_size=cache_max)
        self.backend = make_backend(backend_name or "local", self, **backend_options)
        if self.link is not None and self.backend.name == "ray":
            if probe_pool or self.store.get_meta("inventory:ray") is None:
                self.link.join_ray(**self.backend.driver_options())  # type: ignore[attr-defined]
        self.inventory_key = (
            "inventory" if self.backend.name == "local" else f"inventory:{self.backend.name}"
        )
        if self.link is None and (probe_pool or self.store.get_meta(self.inventory_key) is None):
            self.refresh_inventory()
        self.owner = getpass.getuser()
        self.uid = os.getuid()
        self._watched: dict[str, list[JobHandle]] = {}
        super().__init__()  # what deciding keeps: the last decision, the loop's thread
        self._inline = InlineRunner(self)
        self._watch_lock = threading.Lock()
        self._event_seq = self._last_event_seq()
        if loop:
            self.start()

    # -- settings and pool ---------------------------------------------------------------

    def _write_settings(
        self,
        policy: str | Policy | None,
        lease_ttl: float | None,
        grace: float | None,
        policy_params: dict[str, Any] | None,
        resize_every: float | None = None,
        resize_cost: float | None = None,
    ) -> None:
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
        updates = {
            "policy": policy,
            "policy_params": policy_params if policy is not None else None,
            "lease_ttl": lease_ttl,
            "grace": grace,
            "resize_every": check_resize_every(resize_every),
            "resize_cost": check_resize_every(resize_cost, "resize_cost"),
        }
        changed = stored is None
        for key, value in updates.items():
            if value is not None and settings.get(key) != value:
                settings[key] = value
                changed = True
        if changed:
            self.store.set_meta("settings", settings)

    @property
    def settings(self) -> Settings:
        return Settings.load(self.store)

    def policy(self) -> Policy:
        if self._policy_object is not None:
            return self._policy_object
        decides = self.backend.policy()
        if decides is not None:
            return decides
        s = self.settings
        return get_policy(s.policy, **(s.policy_params or {}))

    def refresh_inventory(self) -> dict[str, Any]:
        """Probe the machine (or cluster) and store its shape in the ledger."""
        if self.link is not None:
            return dict(self.store.get_meta(self.inventory_key) or {})  # the agent probes
        inventory = self.backend.inventory()
        if self.store.get_meta(self.inventory_key) != inventory:
            self.store.set_meta(self.inventory_key, inventory)
        return inventory

    @property
    def through_agent(self) -> bool:
        """Whether a pool agent decides and launches for this scheduler (its backend's port)."""
        return self.link is not None

    @property
    def inventory(self) -> dict[str, Any]:
        return dict(self.store.get_meta(self.inventory_key) or self.refresh_inventory())

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
        from .staging import configure

        configure(self.store, folder, max_size, ahead, max_rate)
        return self.cache_info()

    def cache_info(self) -> dict[str, Any]:
        """The staging cache: folder, cap, bytes, entries, hits, what is being staged.

        >>> s.cache_info()  # doctest: +SKIP
        {'folder': '.../cache', 'max_bytes': ..., 'bytes': 209715200, 'entries': 1, 'hits': 3, ...}
        """
        from .staging import cache_info

        if self.link is not None and self.link.shared:
            return dict(self.link.client.call("cache")["cache"])
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
        from .nbjobs.submit import submit_notebook

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
        files = {"payload.pkl": pickle_payload(payload)}
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

        See ``jupyter_dlsched.inline`` for what cancel and time limits can do there.
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
        if self.link is not None:
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
                self._wake.set()
            handle = JobHandle(self, job_id)
            self._watch(handle, check=False)
            return handle
        spec = build_spec(
            capacity=idle_capacity(self.inventory),
            kind=kind,
            default_name=default_name,
            origin=origin_text or origin(),
            **resources,
        )
        self.backend.check(spec)
        files["context.json"] = json.dumps(submit_context()).encode()
        job_id = self.store.new_id()
        if inline_fn is not None:
            self._inline.register(job_id, inline_fn)
        info = self.store.insert_job(
            spec,
            files,
            owner=self.owner,
            uid=self.uid,
            backend=self.backend.name,
            job_id=job_id,
            inline=inline_fn is not None,
        )
        handle = JobHandle(self, info.id)
        self._watch(handle, check=False)
        self.wake()
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
        if self.link is not None:
            fn_pickle = pickle_payload({"fn": fn})
            context = json.dumps(submit_context()).encode()
            ids = self.link.submit(
                "function",
                [
                    {
                        "payload.pkl": pickle_payload({"fn_pickle": fn_pickle, "args": (item,)}),
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
            linked = [JobHandle(self, job_id) for job_id in ids]
            for handle in linked:
                self._watch(handle, check=False)
            return linked
        spec = build_spec(
            capacity=idle_capacity(self.inventory),
            kind="function",
            default_name=getattr(fn, "__name__", type(fn).__name__),
            origin=origin(),
            **resources,
        )
        self.backend.check(spec)
        fn_pickle = pickle_payload({"fn": fn})
        context = json.dumps(submit_context()).encode()
        batch = [
            (
                self.store.new_id(),
                replace(spec, name=member_name(spec.name, suffix, MAX_NAME)),
                {
                    "payload.pkl": pickle_payload({"fn_pickle": fn_pickle, "args": (item,)}),
                    "context.json": context,
                },
            )
            for item, suffix in zip(items, suffixes, strict=True)
        ]
        self.store.insert_jobs(batch, owner=self.owner, uid=self.uid, backend=self.backend.name)
        handles = [JobHandle(self, job_id) for job_id, _, _ in batch]
        for handle in handles:
            self._watch(handle, check=False)
        self.wake()
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
        if self.link is not None:
            return self.link.cancel(job_id)
        now = time.time()
        with self.store.transaction(cancel=True) as db:
            row = self.store.state_and_supervisor(db, job_id)
            if row is None:
                raise JobNotFound(job_id)
            state, supervisor = row
            if state in WAITING or (
                state == "running" and supervisor is None and self.backend.name == "local"
            ):
                self.store.transition_in(
                    db, job_id, "cancelled", "cancelled by user", now=now, finished=now
                )
            elif state == "running":
                self.store.request_cancel(db, job_id)
        info = self.store.get(job_id)
        if info.state == "running":
            self.backend.cancel(info)
        self.wake()
        return info

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo:
        """Change a job's priority (``"high"`` or an integer); takes effect at the next tick."""
        if self.link is not None:
            return self.link.set_priority(job_id, priority)
        self.store.set_priority(job_id, parse_priority(priority))
        self.wake()
        return self.store.get(job_id)

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
        if self.link is not None:
            return self.link.requeue(job_id)
        info = self.store.requeue(job_id)
        self.wake()
        return info

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
        if self.link is not None:
            return dict(self.link.client.call("schedules", **msg))
        return schedule_request(self.store, msg, uid=self.uid, admin=True)

    def pool(self) -> PoolInfo:
        """The machine now, with each GPU's jobs and the memory the scheduler granted."""
        if self.backend.name != "local":
            return self.backend.pool()
        # the pool's simulated GPUs are the ledger's, not this caller's environment; the probe
        # is cached and shared: never mutate it
        simulate = remembered_simulation(self.inventory)
        info = copy.deepcopy(probe(usage=True, simulate=simulate))
        running = self.store.jobs(states=["running"])
        by_pid = {j.job_pid: j.id for j in running if j.job_pid}
        by_pid.update({j.supervisor_pid: j.id for j in running if j.supervisor_pid})
        for gpu in info.gpus:
            gpu.jobs = []
            for p in gpu.processes:
                p.job_id = _job_of(p.pid, by_pid)
        for job in running:
            if not job.placement:
                continue
            for index, granted in zip(job.placement.gpus, job.placement.gpu_mem, strict=False):
                if index < len(info.gpus):
                    gpu = info.gpus[index]
                    gpu.jobs.append(job.id)
                    if gpu.simulated:
                        gpu.mem_used += granted
        for gpu in info.gpus:
            if gpu.simulated:
                # nothing measures a simulated GPU: its memory in use is what was allocated,
                # and it has no utilisation reading (views say "allocated", never "util")
                gpu.util = None
        return info

    def status(self) -> dict[str, Any]:
        """Counts by state and the pool's shape, for the CLI, REST and status bar."""
        if self.link is not None:
            status = self.link.status()
            if self.backend.name != "local":
                status.update(self._shape())  # the agent's own pool is the local one
            return status
        return {
            "version": __version__,
            "home": str(self.home),
            "backend": self.backend.name,
            "policy": getattr(self.policy(), "name", str(self.settings.policy)),
            "counts": self.store.count_jobs(),
            **self._shape(),
        }

    def _shape(self) -> dict[str, Any]:
        """This backend's name and pool: GPUs (total, busy, simulated), CPUs, memory."""
        inventory = self.inventory
        running = self.store.jobs(states=["running"])
        busy = {
            i
            for j in running
            if j.placement and j.backend == self.backend.name
            for i in j.placement.gpus
        }
        return {
            "backend": self.backend.name,
            "gpus": {
                "total": len(inventory.get("gpus", [])),
                "busy": len(busy),
                "simulated": sum(1 for g in inventory.get("gpus", []) if g.get("simulated")),
            },
            "cpus": inventory.get("cpus"),
            "mem_total": inventory.get("mem_total"),
        }

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

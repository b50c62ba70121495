"""The Ray backend: the same queue and ledger, with jobs run as Ray tasks on a cluster.

Our policy still decides order, priority and placement (Ray has no job
priorities); Ray only executes. Read top to bottom:

1. ``RayBackend.__init__`` joins a cluster: the connection this process already
   has (``ray.is_initialized()``), else ``address`` / ``$DLSCHED_RAY_ADDRESS``
   passed to ``ray.init`` (``None`` means Ray's own default: ``$RAY_ADDRESS``,
   a cluster started with ``ray start`` on this machine, else a new local one);
2. ``inventory`` lists the cluster's CPUs, memory and GPUs, each GPU in the
   ``group`` of its node, so gang jobs prefer one node;
3. ``launch`` claims the allocated job in the ledger exactly as a local
   supervisor does, then starts one Ray task with ``num_cpus`` / ``num_gpus``
   (fractions for shared GPUs) / ``memory``, pinned to the node the policy
   chose; a multi-GPU gang reserves its GPUs with a placement group;
4. a monitor thread in this process (``ray_monitor.py``) renews the leases,
   streams each task's output into ``spool/<id>/log``, enforces time limits,
   delivers cancels and preemptions (``ray.cancel(force=True)``) and records how
   each job ended, with ``result.pkl`` / ``error.json`` / ``error.pkl`` so
   ``JobHandle.result()`` works unchanged; a job whose Ray worker or node died is
   ``lost`` and retried per its ``retries``. The task itself, what runs on the
   node, is ``ray_task.py``;
5. ``close`` stops launching; running jobs keep running and are recorded while
   this process lives (Ray ends a task when the process that submitted it exits,
   then the lease lapses and the job is retried or marked lost).

>>> s = dls.Scheduler(backend="ray", address="ray://head:10001")  # doctest: +SKIP
>>> s.submit(train, 1e-3, gpus=2).result()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import json
import math
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..inside.runtime import STOP_FILE
from ..local.jobproc import world_size
from ..machine.inventory import GpuInfo, PoolInfo
from ..store import JobInfo
from ..store.buffers import buffer_files, map_buffer
from ..store.settings import Settings
from ..vocab import private
from ..vocab.errors import DlschedError
from ..vocab.resources import Placement
from ..vocab.units import format_size, parse_size
from .base import Backend
from .ray_monitor import RayMonitor, Run, ray_module
from .ray_task import run_task

if TYPE_CHECKING:
    from .port import Port

ADDRESS_ENV = "DLSCHED_RAY_ADDRESS"
GPU_MEM_ENV = "DLSCHED_RAY_GPU_MEM"
# Ray does not report GPU memory; memory-sized requests need a card size to share by
DEFAULT_GPU_MEM = 16 * 2**30
RAY_FRACTION_DIGITS = 4  # Ray keeps resource quantities to 1e-4


class _Unrunnable(Exception):
    """The job can never run as one Ray task on this cluster (the reason is the message)."""


class RayBackend(Backend):
    """Jobs run as Ray tasks; the ledger stays the single record of what ran.

    ``address``: a Ray address for ``ray.init`` (default ``$DLSCHED_RAY_ADDRESS``);
    ignored when this process is already connected. ``gpu_mem``: the memory of the
    cluster's GPUs (Ray does not report it; default ``$DLSCHED_RAY_GPU_MEM`` or
    16 GiB), used to size ``gpu_mem=`` requests as fractions of a card.
    ``init_options``: further keywords for ``ray.init`` (``runtime_env``, ``namespace``).
    """

    name = "ray"

    def __init__(
        self,
        port: Port | None = None,
        address: str | None = None,
        *,
        gpu_mem: int | str | None = None,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(port)
        ray_module()  # fail now, with the install hint, when Ray is missing
        self.address = address or os.environ.get(ADDRESS_ENV) or None
        self.init_options = dict(init_options or {})
        size = gpu_mem if gpu_mem is not None else os.environ.get(GPU_MEM_ENV)
        self.gpu_mem = parse_size(size, "gpu_mem") if size is not None else DEFAULT_GPU_MEM
        self._task: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._monitor = RayMonitor(self)
        _live_backends.add(self)
        _register_hand_back()

    def driver_options(self) -> dict[str, Any]:
        """What the pool agent's Ray driver needs to join the cluster this backend names:
        the address given (or of the cluster this process is connected to), the card
        size and the ``ray.init`` options."""
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        ray = ray_module()
        if address is None and ray.is_initialized():
            address = ray.get_runtime_context().gcs_address
        gpu_mem = self.gpu_mem if self.gpu_mem != DEFAULT_GPU_MEM else None
        return {"address": address, "gpu_mem": gpu_mem, "init_options": self.init_options}

    def connect(self) -> Any:
        """The ``ray`` module, connected: on first use, so reading the queue needs no cluster."""
        ray = ray_module()
        with self._lock:
            if not ray.is_initialized():
                ray.init(address=self.address, **self.init_options)
            if self._task is None:
                self._task = ray.remote(run_task)
        return ray

    # -- 2. the pool -----------------------------------------------------------------------

    def inventory(self) -> dict[str, Any]:
        ray = self.connect()
        nodes = sorted(
            (n for n in ray.nodes() if n.get("Alive")),
            key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]),
        )
        gpus: list[dict[str, Any]] = []
        described = []
        for group, node in enumerate(nodes):
            res = node.get("Resources", {})
            ip = node.get("NodeManagerAddress", "")
            for local in range(int(res.get("GPU", 0))):
                gpus.append(
                    {
                        "index": len(gpus),
                        "uuid": f"ray-{node['NodeID'][:12]}-{local}",
                        "name": f"GPU {local} on {ip}",
                        "mem_total": self.gpu_mem,
                        "simulated": False,
                        "group": group,
                        "node_id": node["NodeID"],
                    }
                )
            described.append(
                {
                    "node_id": node["NodeID"],
                    "ip": ip,
                    "cpus": float(res.get("CPU", 0)),
                    "gpus": int(res.get("GPU", 0)),
                    "mem_total": int(res.get("memory", 0)),
                }
            )
        return {
            "cpus": int(sum(n["cpus"] for n in described)),
            "mem_total": sum(n["mem_total"] for n in described),
            "gpus": gpus,
            "nodes": described,
        }

    def pool(self) -> PoolInfo:
        """The cluster now: Ray's free CPUs and memory, each GPU with the jobs granted on it.

        Through a pool agent (its Ray driver holds the connection, this process none)
        CPU and memory use are what the running jobs were granted."""
        assert self.port is not None
        inventory = self.port.inventory
        if self.port.through_agent and not ray_module().is_initialized():
            granted = [
                j for j in self.port.store.jobs(states=["running"]) if j.backend == self.name
            ]
            cpus_total = float(inventory.get("cpus", 0))
            busy = sum(j.cpus for j in granted) / cpus_total if cpus_total else 0.0
            mem_total = int(inventory.get("mem_total", 0))
            mem_used = sum(j.mem for j in granted)
        else:
            ray = self.connect()
            total, free = ray.cluster_resources(), ray.available_resources()
            cpus_total = total.get("CPU", 0.0)
            busy = 1.0 - free.get("CPU", 0.0) / cpus_total if cpus_total else 0.0
            mem_total = int(total.get("memory", 0))
            mem_used = mem_total - int(free.get("memory", 0))
        gpus = [
            GpuInfo(g["index"], g["uuid"], g["name"], g["mem_total"], group=g.get("group"))
            for g in inventory.get("gpus", [])
        ]
        for job in self.port.store.jobs(states=["running"]):
            if job.backend != self.name or not job.placement:
                continue
            for index, share in zip(job.placement.gpus, job.placement.gpu_mem, strict=False):
                if index < len(gpus):
                    gpus[index].jobs.append(job.id)
                    gpus[index].mem_used += share
        return PoolInfo(
            cpus=int(inventory.get("cpus", 0)),
            cpu_percent=100.0 * busy,
            mem_total=mem_total,
            mem_used=mem_used,
            mem_available=mem_total - mem_used,
            gpus=gpus,
            gpu_error=None if gpus else "the Ray cluster has no GPUs",
        )

    # -- 3. launch -------------------------------------------------------------------------

    def launch(self, job: JobInfo) -> None:
        assert self.port is not None
        if self._closed:
            return  # at exit or after close: a participant that lives on launches it
        self.connect()
        store = self.port.store
        lease = store.claim(job, Settings.load(store).lease_ttl)
        if lease is None:
            return  # another participant launched it, or it is no longer running
        job = lease.job
        folder = store.make_spool(job.id)
        for stale in ("result.pkl", "error.json", "error.pkl", STOP_FILE):
            (folder / stale).unlink(missing_ok=True)
        run = Run(lease, folder, open(private.open_append(folder / "log"), "ab", buffering=0))
        if job.attempts > 1:
            run.log.write(f"[dlsched] attempt {job.attempts}\n".encode())
        try:
            options = self._task_options(job, run)
            task = self._task_input(job, folder)
            run.buffers = task["buffers"]  # the objects live while the job may read them
            run.gen = self._task.options(**options).remote(task)
        except _Unrunnable as why:
            run.outcome = ("rejected", str(why))
        except Exception as error:  # Ray refused the task (bad option, lost connection)
            run.outcome = ("failed", f"Ray did not accept the task: {error}")
        self._monitor.add(run)

    def _task_options(self, job: JobInfo, run: Run) -> dict[str, Any]:
        """Ray resources and scheduling for the grant the policy made."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        assert self.port is not None
        inventory = self.port.inventory
        _check_fits_one_node(job, inventory.get("nodes", []))
        placement = job.placement or Placement()
        cards = {g["index"]: g for g in inventory.get("gpus", [])}
        nodes = {cards[i]["node_id"] for i in placement.gpus if i in cards}
        node = next(iter(nodes)) if len(nodes) == 1 else None
        if len(nodes) > 1:
            run.log.write(
                b"[dlsched] no single Ray node had the GPUs free at allocation; "
                b"Ray starts the job when one does\n"
            )
        options: dict[str, Any] = {
            "num_cpus": job.cpus,
            "max_retries": 0,  # our policy retries, per the job's `retries`
            "retry_exceptions": False,
            "name": f"dlsched-{job.id}",
        }
        if job.mem:
            options["memory"] = job.mem
        whole = int(job.gpus) if job.gpus >= 1 else 0
        if placement.shared and placement.gpus:
            mem_total = cards.get(placement.gpus[0], {}).get("mem_total", self.gpu_mem)
            options["num_gpus"] = _ray_fraction(placement.gpu_mem[0] / mem_total, job.gpus)
        elif whole:
            options["num_gpus"] = whole
        if whole >= 2:
            bundle = {"GPU": float(whole), "CPU": float(job.cpus)}
            if job.mem:
                bundle["memory"] = float(job.mem)
            selector = [{"ray.io/node-id": node}] if node else None
            run.group = placement_group(
                [bundle],
                strategy="STRICT_PACK",
                name=f"dlsched-{job.id}",
                bundle_label_selector=selector,
            )
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                run.group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            )
        elif node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return options

    def _task_input(self, job: JobInfo, folder: Path) -> dict[str, Any]:
        """What the task needs: the payload itself, since nodes need not share our disk."""
        assert self.port is not None
        store = self.port.store
        context = json.loads(store.read_file(job.id, "context.json") or b"{}")
        argv = None
        payload = None
        buffers: dict[str, Any] = {}
        if job.kind == "command":
            argv = json.loads(store.read_file(job.id, "command.json") or b"{}").get("argv")
            if not argv:
                raise _Unrunnable("its command is missing from the ledger")
        else:
            payload = store.read_file(job.id, "payload.pkl")
            if payload is None:
                raise _Unrunnable("its payload is missing from the ledger")
            buffers = _put_buffers(payload)
        threads = str(max(1, int(job.cpus)))
        env = {
            **job.env,
            "DLSCHED_JOB_ID": job.id,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "OPENBLAS_NUM_THREADS": threads,
        }
        return {
            "job_id": job.id,
            "world": world_size(job) if job.distributed else 0,
            "argv": argv,
            "payload": payload,
            "buffers": buffers,
            "env": env,
            "home": str(self.port.home),
            "cwd": context.get("cwd"),
            "sys_path": context.get("sys_path") or [],
        }

    # -- cancel, reap, close -------------------------------------------------------------

    def cancel(self, job: JobInfo) -> None:
        if self._monitor.cancel(job):
            return
        if job.supervisor_pid is None and self.port is not None:
            self.port.store.cancel_unlaunched(job.id)  # allocated, not launched: ends here

    def reap(self, job: JobInfo) -> None:
        """The lease lapsed and the ledger moved the job on: end its Ray task if we hold it."""
        self._monitor.reap(job)

    def close(self) -> None:
        """Stop launching; the monitor keeps recording running jobs, then ends."""
        self._closed = True
        self._monitor.close()

    def _hand_back(self) -> None:
        """At exit, requeue what still runs: Ray ends a task whose submitting process is gone.

        The attempt is not counted; the next participant with a Ray backend starts it again.
        """
        self._closed = True  # no launches from here on, even by a tick still under way
        self._monitor.hand_back()


_live_backends: weakref.WeakSet[RayBackend] = weakref.WeakSet()
_hand_back_registered = False


def _register_hand_back() -> None:
    """Once, after ``import ray``: exit handlers run last-in first-out, so ours runs
    while Ray is still connected and can cancel what we hand back."""
    global _hand_back_registered
    if not _hand_back_registered:
        _hand_back_registered = True
        atexit.register(_hand_back_all)


def _hand_back_all() -> None:
    for backend in list(_live_backends):
        backend._hand_back()


def _check_fits_one_node(job: JobInfo, nodes: list[dict[str, Any]]) -> None:
    """A Ray task runs on one node: fail at once what no node could ever hold."""
    if not nodes:
        return
    whole = int(job.gpus) if job.gpus >= 1 else 0
    most_gpus = max(n["gpus"] for n in nodes)
    most_cpus = max(n["cpus"] for n in nodes)
    most_mem = max(n["mem_total"] for n in nodes)
    if whole > most_gpus:
        raise _Unrunnable(
            f"requests {whole} GPUs on one Ray node; the largest node has {most_gpus}"
        )
    if job.cpus > most_cpus:
        raise _Unrunnable(
            f"requests {job.cpus:g} CPUs on one Ray node; the largest node has {most_cpus:g}"
        )
    if job.mem > most_mem:
        raise _Unrunnable(
            f"requests {format_size(job.mem)} of memory on one Ray node; "
            f"the largest node has {format_size(most_mem)}"
        )


def _ray_fraction(share: float, fallback: float) -> float:
    """A GPU share as Ray counts it: rounded down, so shares that fit us fit Ray too."""
    value = share if share > 0 else fallback
    scale = 10**RAY_FRACTION_DIGITS
    return max(1 / scale, min(1.0, math.floor(value * scale) / scale))


def _put_buffers(payload: bytes) -> dict[str, Any]:
    """Each big buffer the payload names (``store/buffers.py``), put from its file into
    Ray's object store: one copy, and the job's worker maps it from there without another
    (nodes need not see this machine's files, and the GiB never crosses Ray's control
    channel); the object refs by file path."""
    import numpy as np

    ray = ray_module()
    refs = {}
    for path, size in buffer_files(payload).items():
        try:
            mapped = map_buffer(Path(path), size)
        except DlschedError as gone:
            raise _Unrunnable(str(gone)) from None
        refs[path] = ray.put(np.frombuffer(mapped, dtype=np.uint8))
    return refs

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
4. a monitor thread in this process renews the leases, streams each task's
   output into ``spool/<id>/log``, enforces time limits, delivers cancels and
   preemptions (``ray.cancel(force=True)``) and records how each job ended,
   with ``result.pkl`` / ``error.json`` / ``error.pkl`` so ``JobHandle.result()``
   works unchanged; a job whose Ray worker or node died is ``lost`` and retried
   per its ``retries``;
5. ``close`` stops launching; running jobs keep running and are recorded while
   this process lives (Ray ends a task when the process that submitted it exits,
   then the lease lapses and the job is retried or marked lost).

>>> s = dls.Scheduler(backend="ray", address="ray://head:10001")  # doctest: +SKIP
>>> s.submit(train, 1e-3, gpus=2).result()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import IllegalTransition, JobNotFound
from ..pool import GpuInfo, PoolInfo
from ..resources import Placement
from ..runtime import STOP_FILE
from ..settings import Settings
from ..store import JobInfo
from ..units import format_duration, format_size, parse_size
from ..worker import world_size
from .base import Backend

log = logging.getLogger("jupyter_dlsched")

ADDRESS_ENV = "DLSCHED_RAY_ADDRESS"
GPU_MEM_ENV = "DLSCHED_RAY_GPU_MEM"
# Ray does not report GPU memory; memory-sized requests need a card size to share by
DEFAULT_GPU_MEM = 16 * 2**30
MONITOR_POLL_SECONDS = 0.02
TASK_FLUSH_SECONDS = 0.2
# a cancelled task that reports nothing within this long is recorded anyway
STOP_TIMEOUT_SECONDS = 10.0
RAY_FRACTION_DIGITS = 4  # Ray keeps resource quantities to 1e-4
PR_SET_PDEATHSIG = 1


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "the Ray backend needs Ray: pip install 'jupyter-dlsched[ray]'"
        ) from error
    return ray


class _Unrunnable(Exception):
    """The job can never run as one Ray task on this cluster (the reason is the message)."""


@dataclass
class _Run:
    """One launched job as the monitor sees it."""

    job: JobInfo
    folder: Path
    log: IO[bytes]
    gen: Any = None  # ray.ObjectRefGenerator of the task
    group: Any = None  # placement group of a gang
    began: float | None = None  # the task started executing
    stop_reason: str | None = None  # cancel, preempt, timeout, lease
    detail: str = ""
    kill_at: float | None = None
    give_up_at: float | None = None
    outcome: tuple[Any, ...] | None = None


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
        scheduler: Any = None,
        address: str | None = None,
        *,
        gpu_mem: int | str | None = None,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(scheduler)
        _ray()  # fail now, with the install hint, when Ray is missing
        self.address = address or os.environ.get(ADDRESS_ENV) or None
        self.init_options = dict(init_options or {})
        size = gpu_mem if gpu_mem is not None else os.environ.get(GPU_MEM_ENV)
        self.gpu_mem = parse_size(size, "gpu_mem") if size is not None else DEFAULT_GPU_MEM
        self._task: Any = None
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._monitor_thread: threading.Thread | None = None
        _live_backends.add(self)
        _register_hand_back()

    def connect(self) -> Any:
        """The ``ray`` module, connected: on first use, so reading the queue needs no cluster."""
        ray = _ray()
        with self._lock:
            if not ray.is_initialized():
                ray.init(address=self.address, **self.init_options)
            if self._task is None:
                self._task = ray.remote(_run_task)
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
        """The cluster now: Ray's free CPUs and memory, each GPU with the jobs granted on it."""
        ray = self.connect()
        assert self.scheduler is not None
        inventory = self.scheduler.inventory
        total, free = ray.cluster_resources(), ray.available_resources()
        cpus_total = total.get("CPU", 0.0)
        busy = 1.0 - free.get("CPU", 0.0) / cpus_total if cpus_total else 0.0
        mem_total = int(total.get("memory", 0))
        mem_used = mem_total - int(free.get("memory", 0))
        gpus = [
            GpuInfo(g["index"], g["uuid"], g["name"], g["mem_total"], group=g.get("group"))
            for g in inventory.get("gpus", [])
        ]
        for job in self.scheduler.store.jobs(states=["running"]):
            if job.backend != self.name or not job.placement:
                continue
            for index, granted in zip(job.placement.gpus, job.placement.gpu_mem, strict=False):
                if index < len(gpus):
                    gpus[index].jobs.append(job.id)
                    gpus[index].mem_used += granted
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
        assert self.scheduler is not None
        if self._closed:
            return  # at exit or after close: a participant that lives on launches it
        self.connect()
        store = self.scheduler.store
        claimed = self._claim(job, Settings.load(store))
        if claimed is None:
            return  # another participant launched it, or it is no longer running
        job = claimed
        folder = store.spool(job.id)
        folder.mkdir(mode=0o700, exist_ok=True)
        for stale in ("result.pkl", "error.json", "error.pkl", STOP_FILE):
            (folder / stale).unlink(missing_ok=True)
        run = _Run(job, folder, open(folder / "log", "ab", buffering=0))
        if job.attempts > 1:
            run.log.write(f"[dlsched] attempt {job.attempts}\n".encode())
        try:
            options = self._task_options(job, run)
            run.gen = self._task.options(**options).remote(self._task_input(job, folder))
        except _Unrunnable as why:
            run.outcome = ("rejected", str(why))
        except Exception as error:  # Ray refused the task (bad option, lost connection)
            run.outcome = ("failed", f"Ray did not accept the task: {error}")
        with self._lock:
            self._runs[job.id] = run
        self._ensure_monitor()

    def _claim(self, job: JobInfo, settings: Settings) -> JobInfo | None:
        """Take the job for this process (the same claim a local supervisor makes)."""
        assert self.scheduler is not None
        store = self.scheduler.store
        now = time.time()
        with store.transaction() as db:
            claimed = db.execute(
                "UPDATE jobs SET supervisor_pid=?, host=?, lease_expires=? "
                "WHERE id=? AND state='running' AND supervisor_pid IS NULL AND attempts=?",
                (os.getpid(), socket.gethostname(), now + settings.lease_ttl, job.id, job.attempts),
            ).rowcount
        return store.get(job.id) if claimed else None

    def _task_options(self, job: JobInfo, run: _Run) -> dict[str, Any]:
        """Ray resources and scheduling for the grant the policy made."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        assert self.scheduler is not None
        inventory = self.scheduler.inventory
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
        assert self.scheduler is not None
        store = self.scheduler.store
        context = json.loads(store.read_file(job.id, "context.json") or b"{}")
        argv = None
        payload = None
        if job.kind == "command":
            argv = json.loads(store.read_file(job.id, "command.json") or b"{}").get("argv")
            if not argv:
                raise _Unrunnable("its command is missing from the ledger")
        else:
            payload = store.read_file(job.id, "payload.pkl")
            if payload is None:
                raise _Unrunnable("its payload is missing from the ledger")
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
            "env": env,
            "home": str(self.scheduler.home),
            "cwd": context.get("cwd"),
            "sys_path": context.get("sys_path") or [],
        }

    # -- cancel, reap, close -------------------------------------------------------------

    def cancel(self, job: JobInfo) -> None:
        with self._lock:
            run = self._runs.get(job.id)
        if run is not None:
            self._stop(run, "cancel", "cancelled by user")
            self._wake.set()
            return
        if job.supervisor_pid is None and self.scheduler is not None:
            # allocated but not yet launched: nothing runs, so it ends here
            store = self.scheduler.store
            now = time.time()
            with store.transaction() as db:
                row = db.execute(
                    "SELECT state, supervisor_pid FROM jobs WHERE id=?", (job.id,)
                ).fetchone()
                if row is not None and row[0] == "running" and row[1] is None:
                    store.transition_in(
                        db, job.id, "cancelled", "cancelled by user", now=now, finished=now
                    )

    def reap(self, job: JobInfo) -> None:
        """The lease lapsed and the ledger moved the job on: end its Ray task if we hold it."""
        with self._lock:
            run = self._runs.get(job.id)
        if run is not None and run.job.attempts == job.attempts:
            self._stop(run, "lease", "the allocation was taken back", at_once=True)

    def close(self) -> None:
        """Stop launching; the monitor keeps recording running jobs, then ends."""
        self._closed = True
        self._wake.set()

    def _hand_back(self) -> None:
        """At exit, requeue what still runs: Ray ends a task whose submitting process is gone.

        The attempt is not counted; the next participant with a Ray backend starts it again.
        """
        self._closed = True  # no launches from here on, even by a tick still under way
        with self._lock:
            runs = [r for r in self._runs.values() if r.outcome is None]
            self._runs.clear()
        if not runs or self.scheduler is None:
            return
        store = self.scheduler.store
        for run in runs:
            run.stop_reason = "lease"  # the monitor must not record this end: we do, below
            self._force(run)
            with contextlib.suppress(Exception), store.transaction() as db:
                row = db.execute(
                    "SELECT state, attempts, supervisor_pid FROM jobs WHERE id=?", (run.job.id,)
                ).fetchone()
                if row is not None and tuple(row) == ("running", run.job.attempts, os.getpid()):
                    store.transition_in(
                        db,
                        run.job.id,
                        "queued",
                        "requeued: the process that ran it on Ray exited",
                        placement=None,
                        supervisor_pid=None,
                        job_pid=None,
                        lease_expires=None,
                        attempts=run.job.attempts - 1,
                    )
            with contextlib.suppress(OSError, ValueError):  # ValueError: the monitor closed it
                run.log.write(b"[dlsched] requeued: the process that ran it on Ray exited\n")
                run.log.close()
            if run.group is not None:
                with contextlib.suppress(Exception):
                    _ray().util.remove_placement_group(run.group)

    # -- 4. the monitor --------------------------------------------------------------------

    def _ensure_monitor(self) -> None:
        with self._lock:
            alive = self._monitor_thread is not None and self._monitor_thread.is_alive()
            if not alive:
                self._monitor_thread = threading.Thread(
                    target=self._monitor, name="dlsched-ray-monitor", daemon=True
                )
                self._monitor_thread.start()
        self._wake.set()

    def _monitor(self) -> None:
        assert self.scheduler is not None
        store = self.scheduler.store
        version = store.data_version()
        next_renew = next_check = 0.0
        settings = Settings.load(store)
        while True:
            with self._lock:
                runs = list(self._runs.values())
                if not runs and self._closed:
                    self._monitor_thread = None
                    break
            if not runs:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._collect(runs)
                now = time.time()
                if now >= next_renew:
                    settings = Settings.load(store)
                    next_renew = now + settings.lease_ttl / 4
                    self._renew(runs, now + settings.lease_ttl)
                current = store.data_version()
                if current != version or now >= next_check:
                    version, next_check = current, now + 1.0
                    self._check_requests(runs)
                self._enforce(runs, now)
                ended = [r for r in runs if r.outcome is not None]
                for run in ended:
                    self._finish(run)
                if ended and not self._closed:
                    self.scheduler.wake()  # free resources: start what waits
            except Exception:
                log.exception("dlsched ray monitor")
                time.sleep(0.5)
        store.close()

    def _collect(self, runs: list[_Run]) -> None:
        """Take every item the tasks have yielded so far (waits briefly for one)."""
        ray = _ray()
        pending = {id(r.gen): r for r in runs if r.gen is not None and r.outcome is None}
        if not pending:
            time.sleep(MONITOR_POLL_SECONDS)
            return
        gens = [r.gen for r in pending.values()]
        ready, _ = ray.wait(gens, num_returns=1, timeout=MONITOR_POLL_SECONDS)
        if ready:
            ready, _ = ray.wait(gens, num_returns=len(gens), timeout=0)
        for gen in ready:
            run = pending[id(gen)]
            while run.outcome is None and ray.wait([gen], timeout=0)[0]:
                try:
                    ref = next(gen)
                except StopIteration:
                    run.outcome = ("lost", "lost: the Ray task ended without a result")
                    break
                try:
                    item = ray.get(ref)
                except Exception as error:
                    run.outcome = _ray_error(error)
                    break
                self._take(run, item)

    def _take(self, run: _Run, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "log":
            run.log.write(item[1])
        elif kind == "started":
            info = item[1]
            run.began = time.time()
            gpus = f", GPUs {','.join(info['gpus'])}" if info["gpus"] else ""
            run.log.write(
                f"[dlsched] on Ray node {info['node']} (pid {info['pid']}{gpus})\n".encode()
            )
            assert self.scheduler is not None
            with self.scheduler.store.transaction() as db:
                db.execute(
                    "UPDATE jobs SET job_pid=?, host=? WHERE id=? AND state='running' "
                    "AND supervisor_pid=? AND attempts=?",
                    (info["pid"], info["node"], run.job.id, os.getpid(), run.job.attempts),
                )
        else:
            run.outcome = item

    def _renew(self, runs: list[_Run], until: float) -> None:
        assert self.scheduler is not None
        with self.scheduler.store.transaction() as db:
            for run in runs:
                db.execute(
                    "UPDATE jobs SET lease_expires=? WHERE id=? AND state='running' "
                    "AND supervisor_pid=? AND attempts=?",
                    (until, run.job.id, os.getpid(), run.job.attempts),
                )

    def _check_requests(self, runs: list[_Run]) -> None:
        """Cancels and preemptions asked for by any participant, and allocations taken back."""
        assert self.scheduler is not None
        by_id = {r.job.id: r for r in runs}
        marks = ",".join("?" * len(by_id))
        rows = self.scheduler.store.db.execute(
            "SELECT id, state, attempts, supervisor_pid, cancel_requested, preempt_requested "
            f"FROM jobs WHERE id IN ({marks})",
            list(by_id),
        ).fetchall()
        seen = set()
        for job_id, state, attempts, supervisor, cancel, preempt in rows:
            seen.add(job_id)
            run = by_id[job_id]
            if state != "running" or attempts != run.job.attempts or supervisor != os.getpid():
                self._stop(run, "lease", "the allocation was taken back", at_once=True)
            elif cancel:
                self._stop(run, "cancel", "cancelled by user")
            elif preempt:
                self._stop(run, "preempt", "preempted by a higher-priority job")
        for job_id in set(by_id) - seen:  # deleted from the ledger
            self._stop(by_id[job_id], "lease", "the job left the ledger", at_once=True)

    def _enforce(self, runs: list[_Run], now: float) -> None:
        for run in runs:
            limit = run.job.time_limit
            if limit is not None and run.began is not None and now - run.began >= limit:
                self._stop(run, "timeout", f"time limit {format_duration(limit)} reached")
            if run.kill_at is not None and now >= run.kill_at:
                run.kill_at = None
                self._force(run)
            if run.give_up_at is not None and now >= run.give_up_at and run.outcome is None:
                run.outcome = ("lost", "lost: Ray did not confirm that the task stopped")

    def _stop(self, run: _Run, reason: str, detail: str, at_once: bool = False) -> None:
        """Ask a job to end: preemption leaves ``grace`` seconds to checkpoint, the rest is now."""
        if run.stop_reason is not None or run.outcome is not None:
            return
        run.stop_reason, run.detail = reason, detail
        with contextlib.suppress(OSError):
            (run.folder / STOP_FILE).touch()
        if reason == "preempt" and not at_once and self.scheduler is not None:
            run.kill_at = time.time() + Settings.load(self.scheduler.store).preempt_grace()
        else:
            self._force(run)

    def _force(self, run: _Run) -> None:
        run.give_up_at = time.time() + STOP_TIMEOUT_SECONDS
        if run.gen is None:
            return
        try:
            _ray().cancel(run.gen, force=True)
        except Exception:  # already finished, or the cluster is gone
            log.debug("ray.cancel of job %s", run.job.id, exc_info=True)

    # -- recording the end -----------------------------------------------------------------

    def _finish(self, run: _Run) -> None:
        with self._lock:
            self._runs.pop(run.job.id, None)
        try:
            if run.stop_reason != "lease":
                self._record(run)
        finally:
            run.log.close()
            if run.group is not None:
                with contextlib.suppress(Exception):
                    _ray().util.remove_placement_group(run.group)

    def _record(self, run: _Run) -> None:
        assert self.scheduler is not None and run.outcome is not None
        store = self.scheduler.store
        job, folder, outcome = run.job, run.folder, run.outcome
        now = time.time()
        kind = outcome[0]
        exit_code: int | None = None
        term_signal: int | None = None
        if kind == "result":
            _write_atomic(folder / "result.pkl", outcome[1])
            to, why, exit_code = "succeeded", "", 0
        elif kind == "exit":
            code = int(outcome[1])
            if code < 0:
                term_signal = -code
                to, why = "failed", f"killed by signal {signal.Signals(term_signal).name}"
            else:
                exit_code = code
                to, why = ("succeeded", "") if code == 0 else ("failed", f"exit code {code}")
        elif kind == "error":
            details, pickled = outcome[1], outcome[2]
            (folder / "error.json").write_text(json.dumps(details))
            if pickled is not None:
                _write_atomic(folder / "error.pkl", pickled)
            first = (details["message"].strip().splitlines() or [""])[0]
            to, why, exit_code = "failed", f"{details['type']}: {first}"[:300], outcome[3]
        elif kind == "rejected":  # can never run here: no retry
            to, why = "failed", outcome[1]
        else:  # "failed" or "lost": the task did not report an outcome of its own
            to, why = kind, outcome[1]
            if kind == "failed" and len(outcome) > 2 and outcome[2]:
                (folder / "error.json").write_text(json.dumps(outcome[2]))
        common: dict[str, Any] = {
            "exit_code": exit_code,
            "term_signal": term_signal,
            "attained": job.attained + max(0.0, now - (job.started or now)) * job.gpus,
            "lease_expires": None,
        }
        if run.stop_reason == "cancel":
            to, why = "cancelled", "cancelled by user"
        elif run.stop_reason == "preempt":
            to, why = "preempted", "requeued after preemption"
            common.update(
                placement=None,
                supervisor_pid=None,
                job_pid=None,
                preempt_requested=0,
                preemptions=job.preemptions + 1,
            )
        elif run.stop_reason == "timeout":
            to, why = "timeout", run.detail
        if to in ("failed", "lost") and kind != "rejected" and job.attempts <= job.retries:
            why = f"retry {job.attempts}/{job.retries} after: {why}"
            to = "queued"
            common.update(placement=None, supervisor_pid=None, job_pid=None)
        if to not in ("queued", "preempted"):
            common["finished"] = now
        try:
            with store.transaction() as db:
                row = db.execute(
                    "SELECT attempts, supervisor_pid FROM jobs WHERE id=?", (job.id,)
                ).fetchone()
                if row is None or tuple(row) != (job.attempts, os.getpid()):
                    return  # reaped while this monitor was stalled; the ledger moved on
                store.transition_in(db, job.id, to, why, expect=["running"], now=now, **common)
        except (IllegalTransition, JobNotFound):
            pass


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


def _ray_error(error: BaseException) -> tuple[Any, ...]:
    """How a Ray-side failure ends a job: ``("lost" | "failed", reason[, error details])``."""
    ray = _ray()
    errors = ray.exceptions
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    if isinstance(error, errors.TaskCancelledError):  # not by us: those have a stop reason
        return ("lost", "lost: the task was cancelled in Ray, not through dlsched")
    if isinstance(error, getattr(errors, "OutOfMemoryError", ())):
        return ("failed", "out of memory: Ray's memory monitor ended the task")
    if isinstance(error, errors.RayTaskError):
        # the task body itself failed (not the job's code, which reports its own errors)
        details = {"type": type(error).__name__, "message": first, "traceback": str(error)}
        return ("failed", f"Ray task error: {first}", details)
    crashed = (
        errors.WorkerCrashedError,
        getattr(errors, "NodeDiedError", errors.WorkerCrashedError),
        getattr(errors, "LocalRayletDiedError", errors.WorkerCrashedError),
        errors.ObjectLostError,
    )
    if isinstance(error, crashed):
        return ("lost", f"lost: the Ray worker or node died ({type(error).__name__})")
    return ("lost", f"lost: {type(error).__name__}: {first}")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


# -- inside the Ray task (runs on a cluster node) ------------------------------------------


def _run_task(task: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """The Ray task of one job: yields ``started``, ``log`` chunks, then its outcome.

    A generator, so output streams back to the submitting process while the job
    runs: the job's node need not share a disk with the ledger.
    """
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    yield ("started", {"pid": os.getpid(), "node": ray.util.get_node_ip_address(), "gpus": gpus})
    with tempfile.TemporaryFile() as capture:
        with _job_context(task, gpus, capture.fileno()):
            job: _PythonJob | _CommandJob | _RanksJob
            if task["argv"]:
                job = _CommandJob(task, capture.fileno())
            elif task.get("world"):
                job = _RanksJob(task, capture.fileno())
            else:
                job = _PythonJob(task)
            offset = 0
            while True:
                finished = job.wait(TASK_FLUSH_SECONDS)
                sys.stdout.flush()
                sys.stderr.flush()
                while chunk := os.pread(capture.fileno(), 1 << 20, offset):
                    offset += len(chunk)
                    yield ("log", chunk)
                if finished:
                    break
    yield job.outcome


@contextlib.contextmanager
def _job_context(task: dict[str, Any], gpus: list[str], fd: int) -> Iterator[None]:
    """The job's environment, folder, import path and output capture; all undone after.

    Ray reuses worker processes, so nothing of one job may leak into the next.
    """
    saved_env, saved_path, saved_cwd = dict(os.environ), list(sys.path), os.getcwd()
    saved_streams = sys.stdout, sys.stderr
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    try:
        os.environ.update(task["env"])
        os.environ["DLSCHED_DEVICES"] = ",".join(gpus)
        home = task["home"]
        if os.path.exists(os.path.join(home, "ledger.sqlite")):
            os.environ["DLSCHED_HOME"] = home  # progress() reaches the ledger on a shared disk
        else:
            os.environ.pop("DLSCHED_HOME", None)
        cwd = task.get("cwd")
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        for entry in reversed(task.get("sys_path") or []):
            if entry not in sys.path and os.path.isdir(entry):
                sys.path.insert(0, entry)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)


class _PythonJob:
    """A function or cell payload, run in a thread so its output can stream meanwhile."""

    def __init__(self, task: dict[str, Any], start: bool = True) -> None:
        self.outcome: tuple[Any, ...] = ("failed", "the job did not finish")
        self._payload = task["payload"]
        self._thread = threading.Thread(target=self._run, name="dlsched-job", daemon=True)
        if start:
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        import cloudpickle

        try:
            payload = cloudpickle.loads(self._payload)
            runner = payload.get("runner")
            if runner is not None:
                result = runner(payload)
            else:
                # ``map`` pickles the function once for all its jobs
                fn = (
                    cloudpickle.loads(payload["fn_pickle"])["fn"]
                    if "fn_pickle" in payload
                    else payload["fn"]
                )
                result = fn(*payload.get("args", ()), **payload.get("kwargs", {}))
        except SystemExit as stop:
            if stop.code not in (0, None):
                code = stop.code if isinstance(stop.code, int) else 1
                self.outcome = _error_outcome(stop, code)
                return
            result = None
        except BaseException as error:
            self.outcome = _error_outcome(error, 1)
            return
        try:
            self.outcome = ("result", cloudpickle.dumps(result))
        except Exception as error:
            wrapped = TypeError(f"the job's result could not be pickled: {error}")
            self.outcome = _error_outcome(wrapped, 1)


def _error_outcome(error: BaseException, code: int) -> tuple[Any, ...]:
    import cloudpickle

    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stderr.write(text)
    details = {"type": type(error).__name__, "message": str(error), "traceback": text}
    try:
        pickled: bytes | None = cloudpickle.dumps(error)
    except Exception:
        pickled = None
    return ("error", details, pickled, code)


class _CommandJob:
    """An argv command, in its own session, killed if the Ray worker dies."""

    def __init__(self, task: dict[str, Any], fd: int) -> None:
        argv = task["argv"]
        self.outcome: tuple[Any, ...] = ("exit", 127)
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            os.write(fd, f"[dlsched] cannot run {argv[0]!r}: {error}\n".encode())

    def wait(self, timeout: float) -> bool:
        if self._process is None:
            return True
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self.outcome = ("exit", code)
        return True


class _RanksJob:
    """A distributed job: one process per rank on this node (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT`` as torchrun sets them); rank 0's result is the job's.

    The ranks are fresh interpreters (``python -m jupyter_dlsched.backends.ray``):
    forking a Ray worker is not safe. If one rank fails, the others are ended.
    """

    def __init__(self, task: dict[str, Any], fd: int) -> None:
        self.outcome: tuple[Any, ...] = ("exit", 1)
        self._folder = tempfile.mkdtemp(prefix="dlsched-ranks-")
        _write_atomic(Path(self._folder) / "payload.pkl", task["payload"])
        world = int(task["world"])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = str(probe.getsockname()[1])
        path = [p for p in sys.path if p]
        self._processes: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(path),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
            self._processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", __name__, self._folder, str(rank)],
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=_die_with_parent,
                )
            )

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self._processes]
            if any(code not in (None, 0) for code in codes):
                for p in self._processes:
                    if p.poll() is None:
                        p.kill()
                for p in self._processes:
                    p.wait()
                break
            if all(code == 0 for code in codes):
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        self.outcome = self._collect()
        shutil.rmtree(self._folder, ignore_errors=True)
        return True

    def _collect(self) -> tuple[Any, ...]:
        folder = Path(self._folder)
        for rank, process in enumerate(self._processes):
            error = folder / f"error-{rank}.json"
            if error.exists():
                pickled = folder / f"error-{rank}.pkl"
                data = pickled.read_bytes() if pickled.exists() else None
                return ("error", json.loads(error.read_text()), data, process.returncode or 1)
        failed = [p.returncode for p in self._processes if p.returncode != 0]
        if failed:
            return ("exit", failed[0])
        result = folder / "result.pkl"
        if result.exists():
            return ("result", result.read_bytes())
        return ("failed", "rank 0 ended without a result")


def _rank_main(argv: list[str]) -> int:
    """One rank of a distributed job: ``python -m jupyter_dlsched.backends.ray FOLDER RANK``."""
    folder, rank = Path(argv[0]), int(argv[1])
    job = _PythonJob({"payload": (folder / "payload.pkl").read_bytes()}, start=False)
    job._run()
    kind = job.outcome[0]
    if kind == "result":
        if rank == 0:
            _write_atomic(folder / "result.pkl", job.outcome[1])
        return 0
    if kind == "error":
        details, pickled, code = job.outcome[1], job.outcome[2], job.outcome[3]
        (folder / f"error-{rank}.json").write_text(json.dumps(details))
        if pickled is not None:
            _write_atomic(folder / f"error-{rank}.pkl", pickled)
        return int(code)
    return 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))

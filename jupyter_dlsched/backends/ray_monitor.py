"""The submit side of running Ray jobs: one monitor thread in the scheduling process.

``RayBackend.launch`` hands each started task to ``RayMonitor.add``; from then on the
monitor renews the job's lease, streams the task's output into ``spool/<id>/log``,
enforces its time limit, delivers cancels and preemptions (``ray.cancel(force=True)``)
and records how the job ended, with ``result.pkl`` / ``error.json`` / ``error.pkl`` so
``JobHandle.result()`` works unchanged; a job whose Ray worker or node died is ``lost``
and retried per its ``retries``. What the task yields is made in ``ray_task.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..inside.runtime import STOP_FILE
from ..store import JobInfo, Lease, RunEnd
from ..store.settings import Settings
from ..vocab.errors import IllegalTransition, JobNotFound
from ..vocab.units import format_duration
from .ray_task import write_atomic

if TYPE_CHECKING:
    from .base import Backend
    from .port import Port

log = logging.getLogger("jupyter_dlsched")

MONITOR_POLL_SECONDS = 0.02
# a cancelled task that reports nothing within this long is recorded anyway
STOP_TIMEOUT_SECONDS = 10.0


def ray_module() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "the Ray backend needs Ray: pip install 'jupyter-dlsched[ray]'"
        ) from error
    return ray


@dataclass
class Run:
    """One launched job as the monitor sees it: the lease its launch claimed, and more."""

    lease: Lease
    folder: Path
    log: IO[bytes]
    gen: Any = None  # ray.ObjectRefGenerator of the task
    group: Any = None  # placement group of a gang
    buffers: Any = None  # object refs of the payload's big buffers (``ray._put_buffers``)
    began: float | None = None  # the task started executing
    stop_reason: str | None = None  # cancel, preempt, timeout, lease
    detail: str = ""
    kill_at: float | None = None
    give_up_at: float | None = None
    outcome: tuple[Any, ...] | None = None

    @property
    def job(self) -> JobInfo:
        """The job as its launch claimed it (this attempt)."""
        return self.lease.job


class RayMonitor:
    """The launched jobs of one ``RayBackend``, followed to their end by one thread.

    The thread starts with the first job and ends once none is left after ``close``.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> Port | None:
        return self.backend.port

    def add(self, run: Run) -> None:
        """Follow a launched job (or record at once one with an ``outcome`` already)."""
        with self._lock:
            self._runs[run.job.id] = run
        self._ensure_thread()

    def cancel(self, job: JobInfo) -> bool:
        """End the job's task if this monitor follows it; ``False`` when it does not."""
        with self._lock:
            run = self._runs.get(job.id)
        if run is None:
            return False
        self._stop(run, "cancel", "cancelled by user")
        self._wake.set()
        return True

    def reap(self, job: JobInfo) -> None:
        """The lease lapsed and the ledger moved the job on: end its Ray task if we hold it."""
        with self._lock:
            run = self._runs.get(job.id)
        if run is not None and run.job.attempts == job.attempts:
            self._stop(run, "lease", "the allocation was taken back", at_once=True)

    def close(self) -> None:
        """Follow no new jobs; the thread ends once the running ones are recorded."""
        self._closed = True
        self._wake.set()

    def hand_back(self) -> None:
        """At exit, requeue what still runs: Ray ends a task whose submitting process is gone.

        The attempt is not counted; the next participant with a Ray backend starts it again.
        """
        self._closed = True  # the thread must not record these ends: we do, below
        with self._lock:
            runs = [r for r in self._runs.values() if r.outcome is None]
            self._runs.clear()
        if not runs or self.port is None:
            return
        for run in runs:
            run.stop_reason = "lease"  # the thread must not record this end: we do, below
            self._force(run)
            with contextlib.suppress(Exception):
                run.lease.hand_back("requeued: the process that ran it on Ray exited")
            with contextlib.suppress(OSError, ValueError):  # ValueError: the monitor closed it
                run.log.write(b"[dlsched] requeued: the process that ran it on Ray exited\n")
                run.log.close()
            if run.group is not None:
                with contextlib.suppress(Exception):
                    ray_module().util.remove_placement_group(run.group)

    # -- the thread --------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if not alive:
                self._thread = threading.Thread(
                    target=self._loop, name="dlsched-ray-monitor", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        assert self.port is not None
        store = self.port.store
        version = store.data_version()
        next_renew = next_check = 0.0
        settings = Settings.load(store)
        while True:
            with self._lock:
                runs = list(self._runs.values())
                if not runs and self._closed:
                    self._thread = None
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
                    self.port.wake()  # free resources: start what waits
            except Exception:
                log.exception("dlsched ray monitor")
                time.sleep(0.5)
        store.close()

    def _collect(self, runs: list[Run]) -> None:
        """Take every item the tasks have yielded so far (waits briefly for one)."""
        ray = ray_module()
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

    def _take(self, run: Run, item: tuple[Any, ...]) -> None:
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
            run.lease.record_process(info["pid"], info["node"])
        else:
            run.outcome = item

    def _renew(self, runs: list[Run], until: float) -> None:
        Lease.renew_all([run.lease for run in runs], until)

    def _check_requests(self, runs: list[Run]) -> None:
        """Cancels and preemptions asked for by any participant, and allocations taken back."""
        assert self.port is not None
        by_id = {r.job.id: r for r in runs}
        rows = self.port.store.run_requests(list(by_id))
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

    def _enforce(self, runs: list[Run], now: float) -> None:
        for run in runs:
            limit = run.job.time_limit
            if limit is not None and run.began is not None and now - run.began >= limit:
                self._stop(run, "timeout", f"time limit {format_duration(limit)} reached")
            if run.kill_at is not None and now >= run.kill_at:
                run.kill_at = None
                self._force(run)
            if run.give_up_at is not None and now >= run.give_up_at and run.outcome is None:
                run.outcome = ("lost", "lost: Ray did not confirm that the task stopped")

    def _stop(self, run: Run, reason: str, detail: str, at_once: bool = False) -> None:
        """Ask a job to end: preemption leaves ``grace`` seconds to checkpoint, the rest is now."""
        if run.stop_reason is not None or run.outcome is not None:
            return
        run.stop_reason, run.detail = reason, detail
        with contextlib.suppress(OSError):
            (run.folder / STOP_FILE).touch()
        if reason == "preempt" and not at_once and self.port is not None:
            run.kill_at = time.time() + Settings.load(self.port.store).preempt_grace()
        else:
            self._force(run)

    def _force(self, run: Run) -> None:
        run.give_up_at = time.time() + STOP_TIMEOUT_SECONDS
        if run.gen is None:
            return
        try:
            ray_module().cancel(run.gen, force=True)
        except Exception:  # already finished, or the cluster is gone
            log.debug("ray.cancel of job %s", run.job.id, exc_info=True)

    # -- recording the end -----------------------------------------------------------------

    def _finish(self, run: Run) -> None:
        with self._lock:
            self._runs.pop(run.job.id, None)
        try:
            if run.stop_reason != "lease":
                self._record(run)
        finally:
            run.log.close()
            if run.group is not None:
                with contextlib.suppress(Exception):
                    ray_module().util.remove_placement_group(run.group)

    def _record(self, run: Run) -> None:
        assert self.port is not None and run.outcome is not None
        folder, outcome = run.folder, run.outcome
        now = time.time()
        kind = outcome[0]
        exit_code: int | None = None
        term_signal: int | None = None
        if kind == "result":
            write_atomic(folder / "result.pkl", outcome[1])
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
            write_atomic(folder / "error.json", json.dumps(details).encode())
            if pickled is not None:
                write_atomic(folder / "error.pkl", pickled)
            first = (details["message"].strip().splitlines() or [""])[0]
            to, why, exit_code = "failed", f"{details['type']}: {first}"[:300], outcome[3]
        elif kind == "rejected":  # can never run here: no retry
            to, why = "failed", outcome[1]
        else:  # "failed" or "lost": the task did not report an outcome of its own
            to, why = kind, outcome[1]
            if kind == "failed" and len(outcome) > 2 and outcome[2]:
                write_atomic(folder / "error.json", json.dumps(outcome[2]).encode())
        if run.stop_reason == "cancel":
            to, why = "cancelled", "cancelled by user"
        elif run.stop_reason == "preempt":
            to, why = "preempted", ""
        elif run.stop_reason == "timeout":
            to, why = "timeout", run.detail
        end = RunEnd(to, why, exit_code, term_signal, retry=kind != "rejected")
        with contextlib.suppress(IllegalTransition, JobNotFound):
            # IllegalTransition: reaped while this monitor was stalled; the ledger moved on
            run.lease.finish(end, now)


def _ray_error(error: BaseException) -> tuple[Any, ...]:
    """How a Ray-side failure ends a job: ``("lost" | "failed", reason[, error details])``."""
    ray = ray_module()
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

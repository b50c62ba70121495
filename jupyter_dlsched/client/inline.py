"""Jobs that run in a thread of the submitting process once the scheduler grants resources.

This is ``%%schedule --inline``: the cell keeps the notebook's namespace (no
pickling), while the queue still decides when it runs and on which devices.
What a thread cannot do: it cannot be killed. Cancel and time limit raise
``InlineStopped`` inside the thread at the next Python instruction (sent again
until the cell stops: code may swallow one); code
blocked in C (a long GPU kernel, ``time.sleep``) notices only when it returns
to Python. If the process dies, the lease expires and the job is ``lost``.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..inside import runtime
from ..store import JobInfo, Lease, RunEnd
from ..vocab import private
from ..vocab.errors import IllegalTransition, JobNotFound

if TYPE_CHECKING:
    from ..backends.port import InlinePort


class InlineStopped(BaseException):
    """Raised inside an inline job's thread when it is cancelled or runs out of time."""


class InlineRunner:
    """Holds this process's inline jobs: starts their threads, renews leases, records ends."""

    def __init__(self, port: InlinePort) -> None:
        self.port = port
        self.pending: dict[str, Callable[[JobInfo], Any]] = {}
        self.threads: dict[str, threading.Thread] = {}
        #: the leases this process's threads hold, renewed together (``maintain``)
        self.leases: dict[str, Lease] = {}
        self.stopping: dict[str, str] = {}
        #: jobs whose cell runs now: the only time a stop is raised in their thread
        self.in_cell: set[str] = set()
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self._lock = threading.Lock()

    def register(self, job_id: str, fn: Callable[[JobInfo], Any]) -> None:
        with self._lock:
            self.pending[job_id] = fn

    def launch_allocated(self) -> None:
        """Start the threads of this process's inline jobs that have been allocated."""
        if not self.pending:
            return
        store = self.port.store
        for job_id, _started, inline in store.queue.unlaunched(os.getuid(), "local"):
            if inline and job_id in self.pending:
                self.launch(store.get(job_id))

    def launch(self, job: JobInfo) -> bool:
        """Start the thread of an allocated inline job of this process (False if not ours)."""
        with self._lock:
            fn = self.pending.pop(job.id, None)
        if fn is None:
            return False
        thread = threading.Thread(
            target=self._run, args=(job.id, fn), name=f"dlsched-inline-{job.id}", daemon=True
        )
        with self._lock:
            self.threads[job.id] = thread
        thread.start()
        return True

    def _run(self, job_id: str, fn: Callable[[JobInfo], Any]) -> None:
        store = self.port.store
        # by its id: the thread runs whichever attempt the queue started (a cell runs once)
        lease = store.claim(job_id, self.port.settings.lease_ttl)
        if lease is None:
            with self._lock:
                self.threads.pop(job_id, None)
            return
        with self._lock:
            self.leases[job_id] = lease
        info = lease.job
        token = runtime.bind(job_id, str(store.home))
        ran: tuple[Any, BaseException | None] | None = None  # (value, error) once it ended
        with self._lock:
            self.in_cell.add(job_id)
        while True:
            # a stop sent as the cell ended may land anywhere up to here: the cell ended
            # anyway, and once it is out of ``in_cell`` with none pending, none comes
            try:
                if ran is None:
                    ran = _run_cell(fn, info)
                with self._lock:
                    self.in_cell.discard(job_id)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(threading.get_ident()), None
                )
                break
            except InlineStopped:
                if ran is None:
                    ran = (None, InlineStopped())
        runtime.unbind(token)
        value, error = ran
        to, why = "succeeded", ""
        if isinstance(error, InlineStopped):
            reason = self.stopping.get(job_id, "cancel")
            to = "cancelled" if reason == "cancel" else "timeout"
            why = "cancelled by user" if reason == "cancel" else reason
            error = None
        elif error is not None:  # the cell's own exception, reported like a job's
            to, why = "failed", f"{type(error).__name__}: {str(error).strip()[:200]}"
        self._record(lease, to, why, value, error)

    def _record(
        self, lease: Lease, to: str, why: str, value: Any, error: BaseException | None
    ) -> None:
        store, info = self.port.store, lease.job
        folder = store.make_spool(info.id)
        if to == "succeeded":
            self.results[info.id] = value
            try:
                import cloudpickle

                private.write_file(folder / "result.pkl", cloudpickle.dumps(value))
            except Exception:
                pass  # the value stays available in this process only
        elif error is not None:
            self.errors[info.id] = error
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            report = {"type": type(error).__name__, "message": str(error), "traceback": tb}
            private.write_file(folder / "error.json", json.dumps(report).encode())
        # it runs once, in this kernel's thread: nothing is left to run a retry with
        end = RunEnd(to, why, retry=False)
        try:
            lease.finish(end)
        except (IllegalTransition, JobNotFound):
            pass
        with self._lock:
            self.threads.pop(info.id, None)
            self.leases.pop(info.id, None)
            self.stopping.pop(info.id, None)
        self.port.wake()

    def _stop_cell(self, job_id: str, thread: threading.Thread) -> None:
        """Raise ``InlineStopped`` in ``thread`` at its next instruction, if its cell runs."""
        with self._lock:
            if job_id in self.in_cell and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(InlineStopped)
                )

    def maintain(self) -> None:
        """Renew leases of running inline jobs; deliver cancels and time limits."""
        with self._lock:
            running = dict(self.threads)
            held = list(self.leases.values())
        if not running:
            return
        store = self.port.store
        now = time.time()
        ttl = self.port.settings.lease_ttl
        Lease.renew_all(held, now + ttl)
        for job_id, thread in running.items():
            if job_id in self.stopping:
                # sent again while the cell runs: the last one may have landed in code that
                # swallowed it (a garbage-collector callback, a __del__, a bare except)
                self._stop_cell(job_id, thread)
                continue
            info = store.get(job_id)
            reason = None
            if info.cancel_requested:
                reason = "cancel"
            elif info.time_limit is not None and info.started is not None:
                if now - info.started >= info.time_limit:
                    from ..vocab.units import format_duration

                    reason = f"time limit {format_duration(info.time_limit)} reached"
            if reason is not None and thread.ident is not None:
                self.stopping[job_id] = reason
                self._stop_cell(job_id, thread)


def _run_cell(fn: Callable[[JobInfo], Any], info: JobInfo) -> tuple[Any, BaseException | None]:
    """The cell's value, or the exception it ended with (``InlineStopped``: it was stopped)."""
    try:
        return fn(info), None
    except BaseException as error:
        return None, error

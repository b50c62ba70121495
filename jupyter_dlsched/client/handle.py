"""``JobHandle``: a ``concurrent.futures.Future`` backed by the ledger.

A handle works from any process: ``dls.get(job_id).result()`` in a fresh
kernel returns what a job submitted elsewhere produced.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..store import TERMINAL, JobInfo
from ..vocab.errors import (
    DlschedError,
    JobError,
    JobFailed,
    JobLost,
    JobTimeout,
    RemoteTraceback,
    UnsafeStateFolder,
)
from ..vocab.tracebacks import JobTraceback

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .inline import InlineRunner

log = logging.getLogger("jupyter_dlsched")

_NOTHING = object()


class HandleOwner(Protocol):
    """What a handle asks of the ``Scheduler`` that made it: its ledger, its loop, and
    its side of the handles (``Watching``)."""

    @property
    def store(self) -> Any: ...

    @property
    def looping(self) -> bool: ...

    def log_path(self, job_id: str) -> Path: ...

    def cancel(self, job_id: str) -> JobInfo: ...

    def tick(self) -> object: ...

    def _watch(self, handle: JobHandle, check: bool = True) -> None: ...

    def _load_result(self, job_id: str, info: JobInfo | None = None) -> Any: ...

    def _job_exception(self, info: JobInfo) -> BaseException: ...


class JobHandle(concurrent.futures.Future):
    """A submitted job. Compatible with ``concurrent.futures`` (``wait``, ``as_completed``).

    >>> h = dls.submit(train, 1e-3, gpus=1, name="resnet-lr3")  # doctest: +SKIP
    >>> h.state, h.devices  # doctest: +SKIP
    ('running', [0])
    >>> h.result(timeout=3600)  # doctest: +SKIP
    0.913
    """

    def __init__(self, scheduler: HandleOwner, job_id: str) -> None:
        super().__init__()
        self._scheduler = scheduler
        self.id = job_id
        self._resolve_lock = threading.Lock()
        self._resolved = False
        #: the row the job ended with, as it was resolved (a final row is not changed again)
        self._final: JobInfo | None = None
        self._value: Any = _NOTHING

    # -- what the ledger says ------------------------------------------------------------

    def info(self) -> JobInfo:
        """The job's current ledger row."""
        return self._scheduler.store.get(self.id)

    @property
    def state(self) -> str:
        return self.info().state

    @property
    def name(self) -> str:
        return self.info().name

    @property
    def devices(self) -> list[int]:
        """GPU indices granted to the job (empty while queued or for CPU jobs)."""
        return self.info().devices

    def logs(self, tail: int | None = None) -> str:
        """The job's combined stdout and stderr so far (the last ``tail`` lines if given)."""
        path = self._scheduler.log_path(self.id)
        text = path.read_text(errors="replace") if path.exists() else ""
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    # -- Future interface ------------------------------------------------------------------

    def done(self) -> bool:
        if not super().done():
            self._check()
        return super().done()

    def running(self) -> bool:
        return self.state == "running"

    def cancelled(self) -> bool:
        return self.state == "cancelled"

    def cancel(self) -> bool:
        """Cancel the job: a queued job ends at once, a running one gets SIGTERM then SIGKILL.

        Returns False only when the job had already finished.
        """
        info = self._scheduler.cancel(self.id)
        return info.state not in TERMINAL or info.state == "cancelled"

    def wait(self, timeout: float | None = None) -> JobInfo:
        """Block until the job has finished (or ``timeout`` seconds); returns its row."""
        self._wait(timeout)
        return self.info()

    def _wait(self, timeout: float | None) -> None:
        """Block until the job has finished (or ``timeout`` seconds)."""
        self._scheduler._watch(self)
        if not super().done():
            self._check()  # the ledger may already say it ended before the loop noticed
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while not super().done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                # the scheduler loop resolves us; the short wait also covers a missed wake-up
                self._condition.wait(0.5 if left is None else min(0.5, left))
                if not super().done():
                    self._condition.release()
                    try:
                        if not self._scheduler.looping:
                            self._scheduler.tick()  # nobody else may be reaping leases
                        self._check()
                    finally:
                        self._condition.acquire()

    def result(self, timeout: float | None = None) -> Any:
        """The job's return value; raises what the job raised (with its remote traceback)."""
        self._wait(timeout)
        if not super().done():
            raise concurrent.futures.TimeoutError(f"job {self.id} still {self.state}")
        if super().cancelled():
            raise concurrent.futures.CancelledError(f"job {self.id} was cancelled")
        error = super().exception(timeout=0)
        if error is not None:
            raise error.with_traceback(None)  # raised again, it shows this call only
        if self._value is _NOTHING:
            self._value = self._scheduler._load_result(self.id, self._final)
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        if not super().done():
            raise concurrent.futures.TimeoutError(f"job {self.id} still {self.state}")
        if super().cancelled():
            raise concurrent.futures.CancelledError(f"job {self.id} was cancelled")
        return super().exception(timeout=0)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        self._scheduler._watch(self)
        super().add_done_callback(fn)

    # -- resolution (called by the scheduler loop or by a check) ---------------------------

    def _check(self) -> None:
        info = self.info()
        if info.state in TERMINAL:
            self._resolve(info)

    def _resolve(self, info: JobInfo) -> None:
        with self._resolve_lock:
            if self._resolved:
                return
            self._resolved = True
        self._final = info
        if info.state == "succeeded":
            self.set_result(None)  # the value itself is loaded lazily by result()
        elif info.state == "cancelled":
            concurrent.futures.Future.cancel(self)
            self.set_running_or_notify_cancel()
        else:
            try:
                error = self._scheduler._job_exception(info)
            except Exception as unreadable:
                # resolved all the same: a handle left pending would wait for ever
                error = _unreadable(info, f"cannot read its error report: {unreadable}")
            self.set_exception(error)

    def __repr__(self) -> str:
        try:
            info = self.info()
            return f"<JobHandle {info.id} {info.name!r} {info.state}>"
        except Exception:
            return f"<JobHandle {self.id}>"


def _unreadable(info: JobInfo, why: str) -> JobError:
    """The failure of a job whose error report cannot be read: its reason, and why not."""
    kind = {"timeout": JobTimeout, "lost": JobLost}.get(info.state, JobFailed)
    return kind(info.id, info.state, f"{info.reason} ({why})")


def _shown_as_the_jobs(error: BaseException, tb: str, job_id: str) -> None:
    """In IPython, ``error`` shows as the user's frames only: here and in the job."""
    try:
        error._render_traceback_ = JobTraceback(error, tb, job_id)  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass  # an exception type with __slots__: IPython's own traceback it is


def job_exception(
    info: JobInfo, error_json: str | None, error_pickle: bytes | None
) -> BaseException:
    """The exception ``result()`` raises for a job that ended in ``info.state``."""
    details = json.loads(error_json) if error_json else {}
    tb = details.get("traceback")
    if info.state == "timeout":
        return JobTimeout(info.id, info.state, info.reason)
    if info.state == "lost":
        return JobLost(info.id, info.state, info.reason)
    if error_pickle:
        try:
            import cloudpickle

            original = cloudpickle.loads(error_pickle)
            if isinstance(original, BaseException):
                if tb:
                    original.__cause__ = RemoteTraceback(tb)
                    _shown_as_the_jobs(original, tb, info.id)
                return original
        except Exception:
            pass
    if info.state == "failed":
        failed = JobFailed(info.id, info.state, info.reason, tb, details.get("type"))
        if tb:  # its own exception could not come back: its traceback still shows
            _shown_as_the_jobs(failed, tb, info.id)
        return failed
    return JobError(info.id, info.state, info.reason, tb, details.get("type"))


class Watching:
    """A ``Scheduler``'s side of its handles: resolve them as their jobs end (from the
    state changes its loop, ``following.Follower``, reads), load their results and
    exceptions."""

    if TYPE_CHECKING:
        store: Any
        _inline: InlineRunner
        _watched: dict[str, list[JobHandle]]
        _watch_lock: threading.Lock

    def _watch(self, handle: JobHandle, check: bool = True) -> None:
        """Have the loop resolve ``handle`` when its job ends (futures' wait/as_completed)."""
        with self._watch_lock:
            handles = self._watched.setdefault(handle.id, [])
            if any(h is handle for h in handles):
                return
            handles.append(handle)
        if not check:
            return
        handle._check()
        if handle._resolved:
            with self._watch_lock:
                handles = self._watched.get(handle.id, [])
                if handle in handles:
                    handles.remove(handle)

    def _resolve_rows(self, rows: Sequence[Any]) -> None:
        finished = {r[1] for r in rows if r[2] in TERMINAL}
        if not finished:
            return
        with self._watch_lock:
            ready = [(i, self._watched.pop(i)) for i in finished if i in self._watched]
        for job_id, handles in ready:
            info = self.store.get(job_id)
            for handle in handles:
                handle._resolve(info)

    def _load_result(self, job_id: str, info: JobInfo | None = None) -> Any:
        """The value a job that succeeded returned (``info``: its final row, if read); its big
        buffers are mapped from their files (``store/results.py``: in the buffer folder, or
        moved beside it into the spool folder), not copied."""
        from ..store.buffers import loads

        if job_id in self._inline.results:
            return self._inline.results[job_id]
        if info is None:
            info = self.store.get(job_id)
        if info.kind == "command":
            return info.exit_code
        data = self.store.read_spool_file(job_id, "result.pkl")
        if data is None:
            raise FileNotFoundError(self.store.spool(job_id) / "result.pkl")
        return loads(data, moved=self.store.spool(job_id))

    def _job_exception(self, info: JobInfo) -> BaseException:
        if info.id in self._inline.errors:
            return self._inline.errors[info.id]
        try:
            error_json = self.store.read_spool_file(info.id, "error.json")
            error_pickle = self.store.read_spool_file(info.id, "error.pkl")
        except UnsafeStateFolder as unsafe:
            # not a report the job wrote (a link, a FIFO): the failure without its traceback
            log.warning("dlsched: job %s: its error report was not read: %s", info.id, unsafe)
            error_json = error_pickle = None
        except (OSError, DlschedError) as unreadable:
            # a folder on the way closed to this user: the failure, and why it has no report
            why = str(unreadable)  # a shared pool's words say what could not be read
            if not isinstance(unreadable, DlschedError):
                why = f"cannot read its error report: {why}"
            return _unreadable(info, why)
        try:
            details = error_json.decode("utf-8", "replace") if error_json is not None else None
            return job_exception(info, details, error_pickle)
        except ValueError:
            return job_exception(info, None, None)  # a report that is not JSON


#: what ``gather`` does with a member that did not succeed
GATHER_ERRORS = ("skip", "raise", "return")


def gather(
    handles: Iterable[concurrent.futures.Future],
    errors: str = "raise",
    timeout: float | None = None,
) -> list[Any]:
    """The results of a sweep, in the order of ``handles``, once every job has ended.

    >>> sweep = train.map([1e-2, 1e-3, 1e-4])  # doctest: +SKIP
    >>> dls.gather(sweep, errors="skip")  # doctest: +SKIP
    [0.91, 0.93]

    ``errors`` says what a member that failed, timed out, was lost or was cancelled gives:
    ``"raise"`` (default) raises the first such member's exception, in order;
    ``"skip"`` leaves it out; ``"return"`` puts its exception object where its result
    would be (``concurrent.futures.CancelledError`` for a cancelled one). ``timeout``
    bounds the whole wait (``concurrent.futures.TimeoutError`` past it, whatever
    ``errors`` says).
    """
    from ..vocab.errors import SpecError

    if errors not in GATHER_ERRORS:
        raise SpecError("errors", errors, '"skip", "raise" or "return"')
    deadline = None if timeout is None else time.monotonic() + timeout
    results: list[Any] = []
    for handle in list(handles):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            results.append(handle.result(timeout=left))
        except Exception as error:  # what the job raised, JobError, CancelledError
            if isinstance(error, concurrent.futures.TimeoutError) and not handle.done():
                raise  # still running past the timeout: not an outcome of the job
            if errors == "raise":
                raise
            if errors == "return":
                results.append(error)
    return results

"""Calls made from inside a running job: progress reports, checkpoint requests, staged data.

Outside a job (no ``DLSCHED_JOB_ID``) progress and checkpoint requests are
harmless no-ops, so the same training function runs unchanged in a plain
notebook cell; ``data()`` says there is no staged input there.
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..vocab.errors import DlschedError

JOB_ID_ENV = "DLSCHED_JOB_ID"
HOME_ENV = "DLSCHED_HOME"
STOP_FILE = "stop-requested"
#: ``DLSCHED_DATA_<NAME>``: the local path of a job's staged input ``name``
DATA_ENV_PREFIX = "DLSCHED_DATA_"

# set by in-kernel (--inline) runs, where the environment is the kernel's
_current: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "dlsched_current_job", default=None
)
_last_write: dict[str, float] = {}
_stores: dict[str, Any] = {}
_lock = threading.Lock()
# set by the SIGTERM handler: a plain flag, not a threading.Event. The supervisor sends a
# job's processes SIGTERM twice (each process, then its group), and Python may run the
# handler again inside the first run of it; Event.set takes a lock, so that second run
# waited forever on the first's lock, the job never saved, and it was killed at the end of
# its grace period (a rank that hung also held the others in their next collective)
_sigterm_seen = False
PROGRESS_MIN_INTERVAL = 0.2


def current_job() -> tuple[str, str] | None:
    """``(job_id, home)`` of the job this code runs in, or ``None`` outside a job."""
    bound = _current.get()
    if bound is not None:
        return bound
    job_id = os.environ.get(JOB_ID_ENV)
    home = os.environ.get(HOME_ENV)
    if job_id and home:
        return job_id, home
    return None


def bind(job_id: str, home: str) -> contextvars.Token:
    """Make ``current_job()`` return this job in the current context (in-kernel runs)."""
    return _current.set((job_id, home))


def unbind(token: contextvars.Token) -> None:
    _current.reset(token)


def _store(home: str) -> Any:
    from ..store import Store

    with _lock:
        store = _stores.get(home)
        if store is None:
            store = _stores[home] = Store(home)
        return store


def run_payload(data: bytes, buffers: Mapping[str, Any] | None = None) -> Any:
    """Unpickle what a job runs and run it: ``runner(payload)`` or ``fn(*args, **kwargs)``.

    Used by every backend's job process; exceptions propagate to the caller. ``buffers``:
    the big buffers by their files' paths where they came another way (``buffers.loads``).
    """
    from ..store.buffers import loads

    payload = loads(data, buffers)  # big buffers mapped from their files, not copied
    runner = payload.get("runner")
    if runner is not None:
        return runner(payload)
    # ``map`` pickles the function once for all its jobs
    packed = payload.get("fn_pickle")
    fn = loads(packed, buffers)["fn"] if packed is not None else payload["fn"]
    return fn(*payload.get("args", ()), **payload.get("kwargs", {}))


def progress(done: float, total: float | None = None, **metrics: float | str) -> None:
    """Report progress from inside a job; shown in the queue, widgets and sidebar.

    >>> for step in range(100):  # doctest: +SKIP
    ...     loss = train_step()
    ...     dls.progress(step + 1, 100, loss=loss)

    Writes are throttled (at most five a second, the last one always lands).
    """
    job = current_job()
    if job is None:
        return
    job_id, home = job
    now = time.time()
    final = total is not None and done >= total
    with _lock:
        if not final and now - _last_write.get(job_id, 0.0) < PROGRESS_MIN_INTERVAL:
            return
        _last_write[job_id] = now
    clean = {}
    for key, value in metrics.items():
        try:
            clean[str(key)] = float(value)
        except (TypeError, ValueError):
            clean[str(key)] = str(value)  # type: ignore[assignment]
    report = {"done": float(done), "total": total, "metrics": clean, "at": now}
    socket_path = os.environ.get(SOCKET_ENV) if _current.get() is None else None
    if socket_path:
        _report_to_pool(socket_path, job_id, report)
    else:
        _store(home).update(job_id, progress=report)


SOCKET_ENV = "DLSCHED_SOCKET"
_clients: dict[str, Any] = {}


def _report_to_pool(socket_path: str, job_id: str, report: dict[str, Any]) -> None:
    """A job of a shared pool reports through the pool's service (its ledger is not the
    job's to write). A report that cannot be delivered is dropped: training goes on."""
    from ..agent.client import AgentClient

    with _lock:
        client = _clients.get(socket_path)
        if client is None:
            client = _clients[socket_path] = AgentClient(socket_path, timeout=2.0)
    try:
        client.call("progress", id=job_id, progress=report)
    except (DlschedError, OSError):
        pass  # includes a service too busy to answer within the client's timeout


class DataNotStaged(DlschedError, LookupError):
    """``dls.data(name)`` outside a job, or for an input the job did not declare."""


def data(name: str) -> Path:
    """The local path of this job's staged input ``name`` (declared with ``stage_in``).

    >>> h = dls.submit(train, stage_in={"train": "/mnt/share/imagenet/train"})  # doctest: +SKIP
    >>> # inside train():
    >>> dls.data("train")  # doctest: +SKIP
    PosixPath('/home/me/.local/share/jupyter/dlsched/cache/3f2a.../train')

    The same path is in the job's environment as ``DLSCHED_DATA_TRAIN``. The
    files are shared with other jobs through the cache: read them, do not change them.
    """
    job = current_job()
    if job is None:
        raise DataNotStaged(
            f"dls.data({name!r}) is only known inside a job: submit the function with "
            f"stage_in={{{name!r}: PATH}} and call dls.data({name!r}) from it"
        )
    job_id, home = job
    if _current.get() is None:  # a job process: its environment holds the paths
        path = os.environ.get(DATA_ENV_PREFIX + name.upper())
        if path:
            return Path(path)
    paths = _store(home).job_data_paths(job_id)
    if name in paths:
        return Path(paths[name])
    known = ", ".join(repr(n) for n in sorted(paths)) or "none"
    raise DataNotStaged(
        f"job {job_id} has no staged input {name!r} (its inputs: {known}); "
        f"declare it with stage_in={{{name!r}: PATH}}"
    )


def checkpoint_requested() -> bool:
    """True once the scheduler asked this job to stop (preemption or cancel with grace).

    The first call also makes SIGTERM set this flag instead of ending the
    process at once, so a training loop can save a checkpoint and return::

        for step in range(start, steps):
            if dls.checkpoint_requested():
                save(step)
                break
    """
    _install_sigterm_flag()
    if _sigterm_seen:
        return True
    job = current_job()
    if job is None:
        return False
    job_id, home = job
    return (Path(home) / "spool" / job_id / STOP_FILE).exists()


_installed = False


def _install_sigterm_flag() -> None:
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if os.environ.get(JOB_ID_ENV) is None:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True


def _on_sigterm(signum: int, frame: Any) -> None:
    """Only sets the flag: safe to run again inside itself (it takes no lock)."""
    global _sigterm_seen
    _sigterm_seen = True

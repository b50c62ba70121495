"""What a notebook job runs, in the job process: nbclient on the job's own GPUs.

The kernel is a child of the job process, started with the job's environment
(``CUDA_VISIBLE_DEVICES``, cores, ``DLSCHED_JOB_ID``), so it uses the GPUs the
pool granted and is stopped with the job (cancel, time limit). The executed copy
is written after every cell, so a long run can be opened midway and a failed one
keeps the outputs of every cell up to the one that raised.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..inside.runtime import PROGRESS_MIN_INTERVAL, current_job, progress
from .params import inject
from .record import write_record

#: nbclient's own log says only what went wrong (not "Executing notebook with kernel")
_QUIET = logging.getLogger("jupyter_dlsched.notebook")
_QUIET.setLevel(logging.WARNING)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class NotebookCellError(Exception):
    """A cell of a notebook job raised: which cell, the exception, the user's traceback.

    >>> str(NotebookCellError(3, 5, "ZeroDivisionError", "division by zero", "..."))
    'cell 3/5 raised ZeroDivisionError: division by zero'
    """

    def __init__(self, cell: int, total: int, ename: str, evalue: str, traceback: str) -> None:
        super().__init__(cell, total, ename, evalue, traceback)
        self.cell, self.total = cell, total
        self.ename, self.evalue = ename, evalue
        #: the traceback as the notebook shows it, without colours
        self.traceback = traceback

    def __str__(self) -> str:
        return f"cell {self.cell}/{self.total} raised {self.ename}: {self.evalue}"


class _CellProgress:
    """``cell 12/40`` as the job's progress. ``dls.progress`` drops a report that follows
    the last one too closely; quick cells must not leave an old count showing while a
    long one runs, so a dropped report is sent again once the interval has passed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[int, int] | None = None
        self._sent_at = 0.0
        self._timer: threading.Timer | None = None

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            self._pending = (done, total)
            wait = self._sent_at + PROGRESS_MIN_INTERVAL * 1.5 - time.monotonic()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
            self._timer = None
            if pending is None:
                return
            self._sent_at = time.monotonic()
        done, total = pending
        progress(done, total, cell=f"{done}/{total}")


def default_output(source: Path, job_id: str) -> Path:
    """``train.ipynb`` run as job ``k3x9m2ab`` → ``train.k3x9m2ab.ipynb`` next to it."""
    return source.with_name(f"{source.stem}.{job_id}{source.suffix or '.ipynb'}")


def run_notebook(payload: dict[str, Any]) -> str:
    """The runner of a notebook job (``runtime.run_payload``): the executed copy's path."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    source = Path(payload["input"])
    job_id = os.environ.get("DLSCHED_JOB_ID", "job")
    output = Path(payload["output"]) if payload.get("output") else default_output(source, job_id)
    nb = nbformat.read(source, as_version=4)
    inject(nb, payload.get("parameters") or {})
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    number = {index: n for n, index in enumerate(code, start=1)}
    total = len(code)
    report = _CellProgress()
    kernel = payload.get("kernel") or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    nb.metadata.setdefault("dlsched", {}).update(
        {"job": job_id, "input": str(source), "parameters": payload.get("parameters") or {}}
    )

    def save() -> None:
        # a whole new file each time, renamed over the old: a reader never sees half of one
        partial = output.with_name(f".{output.name}.partial")
        nbformat.write(nb, partial)
        os.replace(partial, output)

    def cell_done(cell: Any, cell_index: int, execute_reply: Any = None, **_: Any) -> None:
        done = number.get(cell_index, 0)
        save()
        if (execute_reply or {}).get("content", {}).get("status") == "error":
            return  # the error is reported below, once the copy holds it
        print(f"[dlsched] cell {done}/{total} done", flush=True)
        report(done, total)

    _record(source, output, payload, kernel)
    print(f"[dlsched] running {source} with kernel {kernel}; executed copy: {output}", flush=True)
    save()
    report(0, total)
    # the kernel talks over Unix sockets in a private folder (no TCP port, nothing in the
    # notebook's folder), and is shut down here: a kernel left running would be killed as
    # a process the job left behind
    sockets = tempfile.mkdtemp(prefix="dlsched-kernel-")
    km = KernelManager(kernel_name=kernel, transport="ipc", ip=os.path.join(sockets, "kernel"))
    client = NotebookClient(
        nb,
        km=km,
        timeout=None,
        resources={"metadata": {"path": str(source.parent)}},
        on_cell_executed=cell_done,
        log=_QUIET,
    )
    try:
        client.execute()
    except CellExecutionError as error:
        save()
        failed = _failed_cell(nb)
        at = number.get(failed, 0) if failed is not None else 0
        tb = _ANSI.sub("", "\n".join(_error_output(nb, failed).get("traceback", [])))
        print(tb, file=sys.stderr, flush=True)
        raise NotebookCellError(at, total, error.ename, error.evalue, tb) from None
    finally:
        report.flush()
        if km.has_kernel:
            km.shutdown_kernel()
        shutil.rmtree(sockets, ignore_errors=True)
    save()
    print(f"[dlsched] executed notebook: {output}", flush=True)
    return str(output)


def _record(source: Path, output: Path, payload: dict[str, Any], kernel: str) -> None:
    """Say where the executed copy goes, in the job's spool folder (``record.py``)."""
    job = current_job()
    if job is None:
        return
    folder = Path(job[1]) / "spool" / job[0]
    if folder.is_dir():
        record = {
            "input": str(source),
            "output": str(output),
            "parameters": payload.get("parameters") or {},
            "kernel": kernel,
        }
        write_record(folder, record)


def _failed_cell(nb: Any) -> int | None:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.outputs):
            return index
    return None


def _error_output(nb: Any, index: int | None) -> dict[str, Any]:
    if index is None:
        return {}
    for out in nb.cells[index].outputs:
        if out.get("output_type") == "error":
            return dict(out)
    return {}

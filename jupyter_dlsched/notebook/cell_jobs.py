"""A scheduled cell's notebook side: what comes back, and where an inline cell prints.

``magics.py`` parses ``%%schedule`` and ``%dlsched`` and hands over to these:
``CellJob`` brings a finished cell's names and value back into the kernel, and
``bring_back`` does it again on request; an inline cell (``--inline``, run in a
kernel thread) gets ``inline_runner``, whose output goes to its job's log, not to
whichever cell runs now; ``render_as_user_error`` makes IPython show a job's
failure as the user's own traceback.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from ..client.handle import JobHandle
from ..vocab.schema import JobInfo
from ..vocab.tracebacks import user_traceback
from .cells import CellResult, execute


class CellJob:
    """One scheduled cell: brings its outputs back into the notebook when it succeeds."""

    def __init__(self, shell: Any, out: list[str], inline: bool, show_value: bool) -> None:
        self.shell = shell
        self.out = out
        self.inline = inline
        self.show_value = show_value
        self.view: Any = None
        self.result: CellResult | None = None
        self._lock = threading.Lock()
        self._done = False
        self._unshown: list[Any] = []  # a value that came back before the view existed

    def attach_view(self, view: Any) -> None:
        """The status line this cell's value goes under."""
        self.view = view
        while self._unshown:
            view.show_value(self._unshown.pop())

    def finish(self, handle: JobHandle, info: JobInfo) -> str:
        """Called once when the job ends; returns the words for ``done in … · <words>``."""
        with self._lock:
            if self._done:
                return self._summary()
            self._done = True
        if info.state != "succeeded":
            return ""
        result = handle.result(timeout=0)
        if not isinstance(result, CellResult):
            return "finished"
        self.result = result
        if not self.inline:
            self.shell.user_ns.update(result.outputs)
        if result.has_value:
            self.shell.user_ns["_"] = result.value
            if self.show_value and self.view is not None:
                self.view.show_value(result.value)
            elif self.show_value:
                self._unshown.append(result.value)
        return self._summary()

    def _summary(self) -> str:
        result = self.result
        if result is None:
            return ""
        parts = []
        if result.outputs:
            parts.append(", ".join(result.outputs) + " returned")
        elif result.has_value:
            text = repr(result.value)
            parts.append(f"returned {text[:60] + '…' if len(text) > 60 else text}")
        if result.missing:
            parts.append("not assigned by the cell: " + ", ".join(result.missing))
        for name, why in result.unsent.items():
            parts.append(f"{name} could not come back ({why})")
        return " · ".join(parts) or "nothing returned"


def inline_runner(shell: Any, source: str, filename: str, out: list[str], log_path: Any) -> Any:
    """The function an inline job runs in a kernel thread once its resources are granted."""

    def run(info: JobInfo) -> CellResult:
        devices = ",".join(map(str, info.devices))
        os.environ["DLSCHED_DEVICES"] = devices
        torch = sys.modules.get("torch")
        if torch is not None and info.devices:
            try:
                if torch.cuda.is_available() and info.devices[0] < torch.cuda.device_count():
                    torch.cuda.set_device(info.devices[0])
            except Exception:
                pass  # simulated GPUs have no CUDA device behind them
        from .cells import report_tqdm_progress

        report_tqdm_progress()
        with _routed_output(log_path):
            result = execute(source, shell.user_ns, filename, out)
        result.job_id = info.id
        return result

    return run


class _ThreadRouter:
    """``sys.stdout``/``sys.stderr`` stand-in: inline job threads write to their job's log."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.targets: dict[int, Any] = {}

    def write(self, text: str) -> int:
        target = self.targets.get(threading.get_ident())
        if target is None:
            return int(self.original.write(text) or 0)
        target.write(text)
        target.flush()
        return len(text)

    def flush(self) -> None:
        target = self.targets.get(threading.get_ident())
        (target or self.original).flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


_router_lock = threading.Lock()


class _routed_output:
    def __init__(self, log_path: Any) -> None:
        self.log_path = log_path
        self.file: Any = None

    def __enter__(self) -> None:
        Path(self.log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.file = open(self.log_path, "a", buffering=1, encoding="utf-8", errors="replace")
        with _router_lock:
            for name in ("stdout", "stderr"):
                stream = getattr(sys, name)
                if not isinstance(stream, _ThreadRouter):
                    stream = _ThreadRouter(stream)
                    setattr(sys, name, stream)
                stream.targets[threading.get_ident()] = self.file

    def __exit__(self, *exc: object) -> None:
        with _router_lock:
            for name in ("stdout", "stderr"):
                stream = getattr(sys, name)
                if isinstance(stream, _ThreadRouter):
                    stream.targets.pop(threading.get_ident(), None)
                    if not stream.targets:
                        setattr(sys, name, stream.original)
        self.file.close()


def bring_back(shell: Any, handle: JobHandle, names: list[str] | None) -> None:
    """Put a finished cell's ``--out`` names into the kernel of ``shell`` and say which
    (``%dlsched wait`` and ``%dlsched outputs``)."""
    result = handle.result(timeout=0)
    if not isinstance(result, CellResult):
        return  # a function or command job: its value is `dls.get(ID).result()`
    sent = result.outputs
    chosen = list(sent) if names is None else [n for n in names if n in sent]
    unknown = [] if names is None else [n for n in names if n not in sent]
    if unknown:
        offered = ", ".join(sent) or "nothing"
        raise UsageError(
            f"%dlsched: job {handle.id} did not send back {', '.join(unknown)} "
            f"(it sent back: {offered}); name them with --out when scheduling the cell"
        )
    if shell is not None and chosen:
        shell.user_ns.update({n: sent[n] for n in chosen})
    if chosen:
        print(f"set in this kernel: {', '.join(chosen)}")
    elif not result.missing and not result.unsent:
        print("the cell sent no names back (schedule it with --out a,b to get some)")
    if result.missing:
        print("not assigned by the cell: " + ", ".join(result.missing))
    for name, why in result.unsent.items():
        print(f"{name} could not come back ({why})")


def render_as_user_error(failure: BaseException, job_id: str) -> None:
    """Make IPython show a job's exception with only the user's frames.

    IPython asks an exception for ``_render_traceback_()`` before formatting its own
    traceback (which would be this module's frames and the job runner's).
    """
    from ..vocab.errors import RemoteTraceback

    cause = failure.__cause__
    if isinstance(cause, RemoteTraceback) and cause.tb.strip():
        text = user_traceback(cause.tb).rstrip("\n")
    else:
        text = f"{type(failure).__name__}: {failure}"
    lines = [
        *text.splitlines(),
        f"(job {job_id}; `%dlsched logs {job_id}` shows everything it printed)",
    ]
    try:
        failure._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass  # an exception type with __slots__: IPython's own traceback it is

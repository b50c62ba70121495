"""Inside a GPU kernel: tell its lease when cells run, and say so when a reclaim was near.

Loaded by the provisioner (``--ext=jupyter_dlsched.kernels.activity``) in every kernel it
starts; without a lease (``DLSCHED_KERNEL_LEASE`` unset) it does nothing. Activity comes
from IPython's own cell events, so it works with any front end.
"""

from __future__ import annotations

import ast
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import control, spare


class CellActivity:
    """Writes ``activity.json`` when a cell starts and ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cells = 0
        self.imports = KernelImports(folder.parent)

    def _write(self, busy: bool) -> None:
        try:
            control.write(
                self.folder,
                "activity.json",
                {
                    "busy": busy,
                    "last": time.time(),
                    "cells": self.cells,
                    "process_group": _in_process_group(),
                },
            )
        except OSError:
            pass  # the lease is gone (its folder removed): nothing to tell

    def pre_run_cell(self, *args: Any) -> None:
        warning = control.read(self.folder, "warning.json")
        self.cells += 1
        self._write(True)
        if warning is not None:
            idle = time.time() - float(warning.get("since") or time.time())
            print(
                f"dlsched: this kernel was idle {idle / 60:.0f} min while "
                f"{warning.get('waiting', 'other')} job(s) waited for GPUs, and its GPUs were "
                "about to be reclaimed; running this cell keeps them."
            )

    def post_run_cell(self, *args: Any) -> None:
        self._write(False)
        self.imports.note()


class KernelImports:
    """What cells imported: the top-level modules beyond the kernel's start, each with the
    file it came from, added to ``imports.json`` of the kernels' folder, where the spare
    kernels (``spare.py``) find what to import ahead of the next kernel."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.before = _top_level()
        self._seen = len(sys.modules)

    def note(self) -> None:
        if len(sys.modules) == self._seen or spare.pinned() is not None:
            return  # nothing imported since (or the list is pinned: nothing is learnt)
        self._seen = len(sys.modules)
        new = {}
        for name in sorted(_top_level() - self.before):
            if name in sys.stdlib_module_names or name.startswith("_") or name in _NEVER:
                continue
            origin = getattr(getattr(sys.modules.get(name), "__spec__", None), "origin", None)
            if isinstance(origin, str) and os.path.isabs(origin):
                new[name] = origin
        self.before |= set(new)
        if not new:
            return
        known = control.read(self.base, spare.IMPORTS_FILE) or {}
        added = {n: f for n, f in new.items() if n not in known}
        if added and len(known) < 4 * spare.MAX_LEARNT:
            try:
                control.write(self.base, spare.IMPORTS_FILE, {**known, **added})
            except OSError:
                pass  # nothing is learnt from this kernel


#: never imported ahead: the notebook itself, and what every kernel has anyway
_NEVER = {"__main__", "jupyter_dlsched", "IPython", "ipykernel"}


def _top_level() -> set[str]:
    return {name.partition(".")[0] for name in list(sys.modules)}


def _in_process_group() -> bool:
    """Whether this kernel joined a ``torch.distributed`` process group (its peers forbid a
    suspend); read only where the kernel imported it."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


class RestoreGate(ast.NodeTransformer):
    """Before a cell of a suspended kernel runs: wait in line for a GPU, be restored, then
    run; when the restore cannot be done the cell is not run (IPython's ``InputRejected``)
    and says why, and the kernel stays suspended for the next cell to try again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def visit(self, node: Any) -> Any:
        if control.read(self.folder, "suspended.json") is None:
            return node
        from IPython.core.error import InputRejected

        from .resume import KernelNotRestored, resume

        try:
            resume(self.folder)
        except KernelNotRestored as error:
            raise InputRejected(str(error)) from None
        except Exception as error:  # any other escape would unregister this gate
            raise InputRejected(
                f"this kernel stays suspended: its lease could not be queued ({error})"
            ) from None
        watch_lease(self.folder)  # the new lease's process, as at the start
        return node


def watch_lease(folder: Path) -> None:
    """Stop this kernel if its lease's process dies without ending the lease.

    A lease that ends (shut down, reclaimed, cancelled) stops the kernel first and says
    so in ``ended.json``; a lease process killed outright cannot, and the pool then frees
    GPUs this kernel still uses. Ending the kernel keeps the pool's picture true (Jupyter's
    restarter starts it again on a new lease, in line).
    """
    grant = control.read(folder, "grant.json") or {}
    pid = int(grant.get("pid") or 0)
    if pid <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return

    def wait() -> None:
        select.select([fd], [], [])
        time.sleep(0.5)  # an ending lease writes ended.json just before it exits
        # a lease that ended said so, unless the next one (a suspended kernel's, restoring
        # it) already took over and cleared it: the grant is then no longer this lease's
        current = int((control.read(folder, "grant.json") or {}).get("pid") or 0)
        if control.read(folder, "ended.json") is None and current == pid:
            print(
                f"dlsched: this kernel's GPU lease (process {pid}) died; the kernel stops "
                "so that its GPUs are not used twice",
                file=sys.__stderr__,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="dlsched-lease-watch", daemon=True).start()


def load_ipython_extension(ipython: Any) -> None:
    folder = os.environ.get(control.LEASE_ENV)
    if not folder:
        return
    activity = CellActivity(Path(folder))
    ipython.events.register("pre_run_cell", activity.pre_run_cell)
    ipython.events.register("post_run_cell", activity.post_run_cell)
    ipython.ast_transformers.append(RestoreGate(Path(folder)))
    watch_lease(Path(folder))

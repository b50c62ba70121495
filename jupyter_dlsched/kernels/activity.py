"""Inside a GPU kernel: tell its lease when cells run, and say so when a reclaim was near.

Loaded by the provisioner (``--ext=jupyter_dlsched.kernels.activity``) in every kernel it
starts; without a lease (``DLSCHED_KERNEL_LEASE`` unset) it does nothing. Activity comes
from IPython's own cell events, so it works with any front end.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import control


class CellActivity:
    """Writes ``activity.json`` when a cell starts and ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cells = 0

    def _write(self, busy: bool) -> None:
        try:
            control.write(
                self.folder,
                "activity.json",
                {"busy": busy, "last": time.time(), "cells": self.cells},
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
        if control.read(folder, "ended.json") is None:
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
    watch_lease(Path(folder))

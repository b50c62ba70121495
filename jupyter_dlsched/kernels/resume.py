"""Inside a suspended GPU kernel: the next cell queues a lease, waits in line, is restored.

A reclaim that suspended the kernel (``suspend.py``) left ``suspended.json`` in its control
folder and gave its GPUs to the queue; the kernel process lives on, its CUDA state in host
memory. Its next cell (``activity.RestoreGate``) calls ``resume``: the same lease the
provisioner queued at the start (``lease.json``), now with ``restore_pid``, so that the
lease's process restores this kernel onto its grant before the cell runs.

>>> resume(folder)  # doctest: +SKIP
'k3x9a2lm'
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..vocab.errors import DlschedError
from ..vocab.schema import TERMINAL
from . import control


class KernelNotRestored(DlschedError):
    """A suspended kernel could not be restored; the message says why and what to do."""


def resume(folder: Path, poll: float = 0.2) -> str:
    """Queue this kernel's lease again and wait until it restored the kernel; returns the
    lease's job id. Raises ``KernelNotRestored`` with the reason when it could not."""
    spec = control.read(folder, "lease.json")
    if spec is None:
        raise KernelNotRestored(
            "this kernel was suspended, but its lease's request is gone: restart the kernel"
        )
    from ..client.scheduler import Scheduler
    from .lease import hold

    sched = Scheduler(spec.get("home") or None, loop=False)
    handle = None
    try:
        handle = sched.submit_payload(
            "kernel",
            {
                "fn": hold,
                "args": (str(folder),),
                "kwargs": {**spec["hold"], "restore_pid": os.getpid()},
            },
            default_name="kernel",
            origin_text=spec.get("origin") or "",
            name=spec.get("name") or "kernel",
            **spec["request"],
        )
        print(
            "dlsched: this kernel was suspended while idle; this cell waits in line for a "
            f"GPU (lease {handle.id}) and runs once the kernel is restored",
            flush=True,
        )
        while True:
            restored = control.read(folder, "restored.json")
            if restored is not None and restored.get("job_id") == handle.id:
                return str(handle.id)
            info = sched.info(handle.id)
            if info.state in TERMINAL:
                ended = control.read(folder, "ended.json") or {}
                why = ended.get("message") or info.reason or info.state
                raise KernelNotRestored(
                    f"this kernel stays suspended: {why}. Run a cell again to retry, or "
                    "restart the kernel"
                )
            time.sleep(poll)
    except KeyboardInterrupt:
        if handle is not None:
            sched.cancel(handle.id)
        raise KernelNotRestored(
            "interrupted while waiting for a GPU: the kernel stays suspended"
        ) from None
    finally:
        sched.close()

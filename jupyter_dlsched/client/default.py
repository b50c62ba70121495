"""The process-wide scheduler: the one ``dls.submit``, ``%%schedule`` and the widgets use.

Its own module so that the front ends reach it without importing the package's root,
which loads them on first use.
"""

from __future__ import annotations

import threading

from .scheduler import Scheduler

_default: Scheduler | None = None
_default_lock = threading.Lock()


def default_scheduler() -> Scheduler:
    """The process-wide scheduler the module-level functions use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Scheduler()
        return _default


def set_default_scheduler(scheduler: Scheduler | None) -> None:
    """Use ``scheduler`` for the module-level functions (``None`` makes a fresh one on next use)."""
    global _default
    with _default_lock:
        old, _default = _default, scheduler
    if old is not None and old is not scheduler:
        old.close()

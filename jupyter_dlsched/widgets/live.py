"""One background thread that keeps live widgets current without blocking the kernel.

A view registers itself; the thread calls its ``refresh()`` every
``INTERVAL`` seconds until it returns ``False`` (its job ended, it was
closed). The thread ends when nothing is left to refresh. Widget trait
changes from a thread reach the front end through the kernel's IOPub
thread, so the user keeps running cells meanwhile.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger("jupyter_dlsched.widgets")

INTERVAL = 0.5


class LiveView(Protocol):
    def refresh(self) -> bool:
        """Update the widget from the ledger; False once there is nothing more to show."""
        ...


class Refresher:
    """Calls ``refresh()`` on registered views from a daemon thread."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._views: list[LiveView] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, view: LiveView) -> None:
        with self._lock:
            if view not in self._views:
                self._views.append(view)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="dlsched-widgets", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def remove(self, view: LiveView) -> None:
        with self._lock:
            if view in self._views:
                self._views.remove(view)

    def stop_all(self) -> None:
        """Stop refreshing every view (they keep their last state)."""
        with self._lock:
            self._views.clear()

    def watching(self, view: LiveView) -> bool:
        with self._lock:
            return view in self._views

    def _run(self) -> None:
        while True:
            with self._lock:
                views = list(self._views)
                if not views:
                    self._thread = None
                    return
            for view in views:
                try:
                    keep = view.refresh()
                except Exception:
                    log.exception("dlsched widget refresh")
                    keep = True
                if not keep:
                    self.remove(view)
            self._wake.wait(self.interval)
            self._wake.clear()


refresher = Refresher()

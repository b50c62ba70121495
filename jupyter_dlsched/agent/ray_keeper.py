"""The pool agent's Ray driver keeper: one driver process per ledger, started while a Ray
job waits or runs, restarted when it dies, stopped when the cluster is switched.

The driver (``backends/ray_driver.py``) is a separate program, never a fork of the
agent: Ray's gRPC threads must not be forked. This keeper is what the agent holds of
it — when it was started, its process, whether a client asked for one — and the
``ray`` request that joins a cluster. A shared pool has no Ray (it is per user).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..store import Store
from ..vocab import private
from ..vocab.errors import SpecError
from .shapes import RayReply, RayRequest, SubmitRequest

#: Seconds before a Ray driver that did not come up is started again. One that came up and
#: died is started again at once, once in this time: a driver dying in a loop waits too.
RAY_DRIVER_RETRY = 30.0
#: Bytes of ray-driver.log before it is moved aside to ray-driver.log.1.
RAY_LOG_MAX = 4 << 20


def cluster_options(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster a ``ray`` request names: address, card size, ``ray.init`` options."""
    options = {
        "address": msg.get("address"),
        "gpu_mem": msg.get("gpu_mem"),
        "init_options": msg.get("init_options") or {},
    }
    if not (
        all(options[k] is None or isinstance(options[k], str | int) for k in ("address", "gpu_mem"))
        and isinstance(options["init_options"], dict)
    ):
        raise SpecError("ray options", options, "an address, a card size, ray.init options")
    return options


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RayKeeper:
    """The Ray driver of one agent's ledger (``home``), and the ``ray`` request."""

    def __init__(self, home: Path, store: Callable[[], Store], shared: bool) -> None:
        self.home = home
        self._store = store
        self.shared = shared
        self._started = 0.0  # time.monotonic() the Ray driver was last started
        self._pid: int | None = None  # and its process
        self._served = False  # and whether it came up (was seen serving)
        self._quick = 0.0  # time.monotonic() of the last start at once after a dying driver
        self._wanted = False  # a client asked for a driver that is not started yet
        self._stopping: int | None = None  # the driver of a cluster switched away from
        self._log_from = 0  # where its messages begin in ray-driver.log

    @property
    def store(self) -> Store:
        return self._store()

    def request(self, msg: RayRequest) -> RayReply:
        """Join the Ray cluster ``address`` (with cards of ``gpu_mem``): keep a driver on it;
        its inventory once the driver has joined (ask again until then)."""
        from ..backends.ray_driver import JOINED_KEY, OPTIONS_KEY, describe, driver_alive

        if self.shared:
            raise SpecError(
                "backend", "ray", "the local backend in a shared pool (Ray is per user)"
            )
        options = cluster_options(msg)
        current = self.store.get_meta(OPTIONS_KEY)
        if current != options:
            if self.store.count_active("ray"):
                raise SpecError(
                    "address",
                    options["address"],
                    f"the cluster this ledger's Ray jobs run on now ({describe(current)}); "
                    "wait for them to end, or use another state folder",
                )
            self.store.set_meta(OPTIONS_KEY, options)
            self.store.set_meta("inventory:ray", None)
            self.stop()  # the next is started once it has gone
            self._wanted = True
        if msg.get("start"):
            self._wanted = True  # a client's first ask starts a driver; later ones look
        stopping = self._stopping
        if stopping is not None and not process_exists(stopping):
            stopping = self._stopping = None  # the driver of the old cluster has gone
        if self._wanted and stopping is None and self.keep(force=True):
            self._wanted = False
        joined = self.store.get_meta(JOINED_KEY) == options
        alive = driver_alive(self.home)
        pid = self._pid
        return {
            "inventory": self.store.get_meta("inventory:ray") if joined else None,
            "alive": alive,
            # the driver this agent started has exited without joining
            "failed": pid is not None and not joined and not alive and not process_exists(pid),
            "log": self.log_tail(),
        }

    def check_options(self, msg: SubmitRequest) -> None:
        """A Ray job is queued for the cluster its client joined, or refused."""
        from ..backends.ray_driver import OPTIONS_KEY, describe

        current = self.store.get_meta(OPTIONS_KEY)
        joined = msg.get("ray")
        if joined is not None and not isinstance(joined, dict):
            raise SpecError("ray", joined, "the options of the cluster the client joined")
        if joined is not None and cluster_options(joined) != current:
            raise SpecError(
                "backend",
                "ray",
                f"the cluster this state folder's Ray jobs now run on ({describe(current)}), "
                "which another Scheduler switched to: make a new Scheduler(backend='ray') to "
                "switch back",
            )

    def inventory(self) -> dict[str, Any]:
        inventory = self.store.get_meta("inventory:ray")
        if inventory is None:
            raise SpecError(
                "backend", "ray", "a Ray cluster joined first (Scheduler(backend='ray') does it)"
            )
        return dict(inventory)

    def keep(self, force: bool = False) -> bool:
        """Start the Ray driver if a Ray job waits or runs (or ``force``) and none serves;
        False when none serves and none was started."""
        import subprocess

        from ..backends.ray_driver import driver_alive

        if self.shared or (not force and not self.store.count_active("ray")):
            return False
        if driver_alive(self.home):
            self._served = True
            return True
        if self._pid is not None and process_exists(self._pid):
            return False  # the last one started has not bound its socket yet, or is exiting
        now = time.monotonic()
        at_once = self._served and now - self._quick >= RAY_DRIVER_RETRY
        if now - self._started < RAY_DRIVER_RETRY and not (force or at_once):
            return False  # the last one failed (its log says why), or died twice in a row
        if at_once and not force:
            self._quick = now
        self._started = now
        self._served = False
        path = self.home / "ray-driver.log"
        if path.exists() and path.stat().st_size > RAY_LOG_MAX:
            path.replace(path.with_name("ray-driver.log.1"))
        log_fd = private.open_append(path)
        self._log_from = os.fstat(log_fd).st_size
        try:
            driver = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jupyter_dlsched.backends.ray_driver",
                    "--home",
                    str(self.home),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # lives on when this agent exits
            )
            self._pid = driver.pid
        finally:
            os.close(log_fd)
        return True

    def stop(self) -> None:
        """Ask the driver to hand its jobs back and exit (not waited for: the loop goes on)."""
        from ..backends.ray_driver import driver_alive

        pid = self.store.get_meta("ray_driver_pid")
        if isinstance(pid, int) and driver_alive(self.home):
            try:
                os.kill(pid, signal.SIGTERM)
                self._stopping = pid
            except ProcessLookupError:
                pass
        self._started = 0.0

    def log_tail(self) -> str:
        """What the driver started last has written (its last 4 kB)."""
        try:
            with open(self.home / "ray-driver.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(self._log_from, f.tell() - 4000))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

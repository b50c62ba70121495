"""The Ray driver of a pool agent: the one process per ledger that holds the connection to a
Ray cluster and runs the ledger's Ray jobs, so they outlive the kernels that queued them.

Ray ends a task when the process that submitted it exits, so Ray jobs must not be
submitted by kernels, which come and go. A ``Scheduler(backend="ray")`` queues its
jobs through this user's pool agent like any other; the agent starts this driver
(``python -m jupyter_dlsched.backends.ray_driver --home H``) while a Ray job waits or
runs and none serves. The driver is the ledger's scheduler for the ``ray`` backend
(``Scheduler(backend="ray", agent=False)``: the same policy code, its own loop): it
decides and launches the Ray jobs, its monitor thread records how each ended, and it
exits once no Ray job has waited or run for ``idle_exit`` seconds. The cluster it
joins (``address``, ``gpu_mem``) is what the last client asked the agent for, kept in
the ledger's ``ray`` setting. One driver per ledger: it holds an abstract socket named
after the ledger, as the agent does, and the agent asks that socket whether it lives.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import logging
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("jupyter_dlsched.ray_driver")

#: Ledger setting with the cluster the driver joins: ``{"address": ..., "gpu_mem": ...}``.
OPTIONS_KEY = "ray"
#: The options of the cluster whose ``inventory:ray`` the ledger holds (written by the driver).
JOINED_KEY = "ray_joined"


def driver_address(home: str | os.PathLike[str]) -> bytes:
    """The abstract socket the Ray driver of ``home`` holds while it lives."""
    key = f"{os.getuid()}:{os.path.abspath(home)}"
    return b"\0dlsched-ray-" + hashlib.sha1(key.encode()).hexdigest()[:20].encode()


def driver_alive(home: str | os.PathLike[str]) -> bool:
    """Whether a Ray driver of this user serves ``home`` now (never blocks: a driver still
    joining its cluster has not accepted yet, and a full backlog means it lives)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(driver_address(home))
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        uid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            log.error(
                "dlsched: the Ray driver's socket for %s is held by uid %d, not by you", home, uid
            )
            return False
        return True
    finally:
        probe.close()


def serve(home: str | os.PathLike[str], idle_exit: float) -> int:
    """Run the Ray jobs of ``home`` until none has waited or run for ``idle_exit`` seconds."""
    from ..engine import Engine, EngineLink
    from ..store import Store

    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        holder.bind(driver_address(home))
    except OSError:
        holder.close()
        if not driver_alive(home):
            log.error("dlsched ray driver: %s: its socket is taken by another user", home)
            return 1
        return 0  # another driver serves this ledger
    holder.listen(16)
    holder.setblocking(False)
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    store = Store(home)
    store.set_meta("ray_driver_pid", os.getpid())
    options = store.get_meta(OPTIONS_KEY) or {}
    address = options.get("address")
    try:
        with Engine(
            store,
            "ray",
            address=address,
            gpu_mem=options.get("gpu_mem"),
            init_options=options.get("init_options") or {},
        ) as engine:
            engine.write_settings()  # a new ledger's defaults
            link = EngineLink(engine, owner=getpass.getuser(), uid=os.getuid())
            store.set_meta(JOINED_KEY, options)  # after the inventory: this cluster's
            log.info("dlsched ray driver: %s joined %s", home, address or "Ray's default cluster")
            busy_at = time.monotonic()
            seen = store.last_event_seq()
            while not stopping:
                _answer(holder)
                if store.count_active("ray"):
                    busy_at = time.monotonic()
                elif time.monotonic() - busy_at > idle_exit:
                    break
                changes = link.changes(seen, 0.2)  # the engine decides while this waits
                if changes:
                    seen = changes[-1][0]
    finally:
        holder.close()
    return 0


def _answer(holder: socket.socket) -> None:
    """Accept and close the connections of liveness checks."""
    while True:
        try:
            peer, _ = holder.accept()
        except OSError:
            return
        peer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_dlsched.backends.ray_driver")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--idle-exit", type=float, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    idle = args.idle_exit
    if idle is None:
        idle = float(os.environ.get("DLSCHED_AGENT_IDLE") or 600.0)
    return serve(args.home, idle)


def describe(options: dict[str, Any] | None) -> str:
    """Words for the cluster of ``options``: ``'ray://head:10001'``, or Ray's default."""
    address = (options or {}).get("address")
    return str(address) if address else "Ray's default cluster"


if __name__ == "__main__":
    sys.exit(main())

"""The launcher: a per-user process with the package preloaded that forks supervisors.

It listens on the abstract Unix socket ``launcher.socket_name`` gives, only
answers its own user (``SO_PEERCRED``), never imports CUDA libraries, forks a
supervisor (``start <id>``) or a stager (``stage <id>``) in a new session for
each request, and exits when idle or when its state folder disappears. Its
clients' side (start requests, spawning it, stopping it) is ``launcher.py``.

    python -m jupyter_dlsched.local.forkserver --home ~/.local/share/jupyter/dlsched
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from ..staging.stager import stage
from . import jobproc
from .launcher import IDLE_EXIT, socket_name
from .preload import launcher_modules
from .supervisor import supervise


def preload() -> None:
    """Import what supervisors, stagers and jobs need before forking them: the modules
    named in ``DLSCHED_PRELOAD`` (default numpy; what jobs import beyond them is learnt,
    ``preload.py``), cloudpickle and the C library (the supervisor, the stager and the job
    runner are imported with this module)."""
    for name in launcher_modules():
        try:
            importlib.import_module(name)
        except Exception:
            pass
    import cloudpickle  # noqa: F401  (every function job unpickles its payload)

    jobproc.libc()


def serve(home: str, idle_exit: float = IDLE_EXIT) -> int:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = socket_name(home)
    try:
        server.bind(address)
    except OSError:
        return 0  # another launcher for this folder is already serving
    server.listen(64)
    server.settimeout(1.0)
    preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped automatically
    last = time.monotonic()
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if time.monotonic() - last > idle_exit or not Path(home).is_dir():
                return 0
            continue
        last = time.monotonic()
        with conn:
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                _pid, uid, _gid = struct.unpack("3i", creds)
                if uid != os.getuid():
                    conn.sendall(b"refused\n")
                    continue
                line = conn.recv(256).decode().strip()
                verb, _, job_id = line.partition(" ")
                if verb == "stop":
                    conn.sendall(b"ok\n")
                    return 0
                if verb not in ("start", "stage") or not job_id:
                    conn.sendall(b"bad request\n")
                    continue
                pid = os.fork()
                if pid == 0:
                    server.close()
                    conn.close()
                    _become_supervisor(home, job_id, verb)
                conn.sendall(f"ok {pid}\n".encode())
            except OSError:
                continue


def _become_supervisor(home: str, job_id: str, verb: str = "start") -> None:
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if verb == "stage":
            code = stage(home, job_id)
        else:
            code = supervise(home, job_id)
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT)
    args = parser.parse_args(argv)
    return serve(args.home, args.idle_exit)


if __name__ == "__main__":
    sys.exit(main())

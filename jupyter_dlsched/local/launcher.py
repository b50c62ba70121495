"""Starting a job's supervisor (or a stager): ask this user's launcher, else a fresh interpreter.

Starting a job through ``python -m jupyter_dlsched.local.supervisor`` costs an
interpreter start-up; the launcher pays it once. The launcher is one process
per user, state folder, interpreter and code version (``forkserver.py``) with
the package preloaded, listening on an abstract Unix socket named after those
four, so a launcher never serves code older than its caller. This module is
what the deciding process does with it: find it, ask it to start something,
start one in the background, stop it, and the slow path when none answers.

>>> if not request_start(home, job_id):  # doctest: +SKIP
...     spawn_supervisor(home, job_id)
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time

from ..machine.detach import spawn

IDLE_EXIT = 600.0


_stamp: tuple[float, str] = (0.0, "")
_CODE_FOLDERS = ("", "agent", "local", "policy", "backends", "staging")  # what the agent runs


def code_stamp() -> str:
    """Interpreter and newest source file: a launcher never serves code older than its caller.

    Re-read at most every two seconds, so an upgraded or edited package gets a
    fresh launcher instead of silently falling back to slow starts. Only the
    package's own source folders are read (a few dozen ``stat`` calls), never
    the prebuilt JupyterLab files beside them.

    The interpreter is named by what it really is, not by how it was spelt: a kernel
    started as ``.venv/bin/python`` and a console script whose first line says
    ``.venv/bin/python3`` run the same code, and must not take each other's agent for
    an older one (each would replace the other's). The binary's resolved path says which
    interpreter, the environment's resolved prefix which packages it sees.
    """
    global _stamp
    now = time.monotonic()
    if now - _stamp[0] > 2.0:
        package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
        newest = 0
        for folder in _CODE_FOLDERS:
            with os.scandir(os.path.join(package, folder)) as entries:
                for entry in entries:
                    if entry.name.endswith(".py"):
                        newest = max(newest, entry.stat().st_mtime_ns)
        interpreter = os.path.realpath(sys.executable)
        _stamp = (now, f"{interpreter}:{os.path.realpath(sys.prefix)}:{package}:{newest}")
    return _stamp[1]


def socket_name(home: str | os.PathLike[str]) -> bytes:
    """The abstract socket address for this user, state folder, interpreter and code."""
    key = f"{os.getuid()}:{os.path.abspath(home)}:{code_stamp()}"
    return b"\0dlsched-" + hashlib.sha1(key.encode()).hexdigest()[:20].encode()


def request_start(
    home: str | os.PathLike[str], job_id: str, timeout: float = 2.0, verb: str = "start"
) -> bool:
    """Ask the launcher to start the supervisor of ``job_id``; False if none answers.

    ``verb="stage"`` starts the stager of a staging (``job_id`` is its source id).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(socket_name(home))
            conn.sendall(f"{verb} {job_id}\n".encode())
            reply = conn.recv(64)
    except OSError:
        return False
    return reply.startswith(b"ok")


def stop(home: str | os.PathLike[str]) -> bool:
    """Ask this folder's launcher to exit (running jobs are not affected)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2.0)
            conn.connect(socket_name(home))
            conn.sendall(b"stop\n")
            return conn.recv(64).startswith(b"ok")
    except OSError:
        return False


def spawn_launcher(home: str | os.PathLike[str]) -> None:
    """Start a launcher in the background (its own session, so it outlives the caller).

    ``DLSCHED_LAUNCHER_IDLE`` sets how many idle seconds it waits before exiting.
    """
    idle = os.environ.get("DLSCHED_LAUNCHER_IDLE", str(IDLE_EXIT))
    module = "jupyter_dlsched.local.forkserver"
    # outside a supervisor that starts it (``machine/detach.py``): not its job's process
    spawn(
        [sys.executable, "-m", module, "--home", str(home), "--idle-exit", idle],
        env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"},
    )


def spawn_supervisor(
    home: str | os.PathLike[str], job_id: str, module: str = "jupyter_dlsched.local.supervisor"
) -> None:
    """The slow path: a fresh interpreter runs the supervisor (or ``module``), outside a
    supervisor that starts it (the next job's is not the ending job's process)."""
    spawn([sys.executable, "-m", module, "--home", str(home), job_id])


def launch_stager(home: str | os.PathLike[str], source_id: str) -> None:
    """Start the stager of an armed staging: forked by the launcher, else a fresh interpreter."""
    if os.environ.get("DLSCHED_FAST_START", "1") != "0" and request_start(
        home, source_id, verb="stage"
    ):
        return
    spawn_supervisor(home, source_id, module="jupyter_dlsched.staging.stager")

"""A per-user launcher with the package preloaded that forks job supervisors in milliseconds.

Starting a job through ``python -m jupyter_dlsched.local.supervisor`` costs an
interpreter start-up; the launcher pays it once. It listens on an abstract
Unix socket named after the state folder, the interpreter and the code, only
answers its own user (``SO_PEERCRED``), never imports CUDA libraries, and
exits when idle or when its state folder disappears.

    python -m jupyter_dlsched.local.launcher --home ~/.local/share/jupyter/dlsched
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

IDLE_EXIT = 600.0
PRELOAD_ENV = "DLSCHED_PRELOAD"
DEFAULT_PRELOAD = "numpy"


_stamp: tuple[float, str] = (0.0, "")
_CODE_FOLDERS = ("", "local", "policy", "backends", "staging")  # what supervisors and stagers run


def _code_stamp() -> str:
    """Interpreter and newest source file: a launcher never serves code older than its caller.

    Re-read at most every two seconds, so an upgraded or edited package gets a
    fresh launcher instead of silently falling back to slow starts. Only the
    package's own source folders are read (a few dozen ``stat`` calls), never
    the prebuilt JupyterLab files beside them.
    """
    global _stamp
    now = time.monotonic()
    if now - _stamp[0] > 2.0:
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        newest = 0
        for folder in _CODE_FOLDERS:
            with os.scandir(os.path.join(package, folder)) as entries:
                for entry in entries:
                    if entry.name.endswith(".py"):
                        newest = max(newest, entry.stat().st_mtime_ns)
        _stamp = (now, f"{sys.executable}:{newest}")
    return _stamp[1]


def socket_name(home: str | os.PathLike[str]) -> bytes:
    """The abstract socket address for this user, state folder, interpreter and code."""
    key = f"{os.getuid()}:{os.path.abspath(home)}:{_code_stamp()}"
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
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_dlsched.local.launcher",
            "--home",
            str(home),
            "--idle-exit",
            idle,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"},
    )


def spawn_supervisor(
    home: str | os.PathLike[str], job_id: str, module: str = "jupyter_dlsched.local.supervisor"
) -> None:
    """The slow path: a fresh interpreter runs the supervisor (or ``module``)."""
    subprocess.Popen(
        [sys.executable, "-m", module, "--home", str(home), job_id],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def launch_stager(home: str | os.PathLike[str], source_id: str) -> None:
    """Start the stager of an armed staging: forked by the launcher, else a fresh interpreter."""
    if os.environ.get("DLSCHED_FAST_START", "1") != "0" and request_start(
        home, source_id, verb="stage"
    ):
        return
    spawn_supervisor(home, source_id, module="jupyter_dlsched.staging.stager")


def preload() -> None:
    """Import what supervisors, stagers and jobs need before forking them: the modules
    named in ``DLSCHED_PRELOAD`` (default numpy), the supervisor and the job runner."""
    for name in os.environ.get(PRELOAD_ENV, DEFAULT_PRELOAD).split(","):
        if name.strip():
            try:
                importlib.import_module(name.strip())
            except Exception:
                pass
    import cloudpickle  # noqa: F401  (every function job unpickles its payload)

    from ..staging import stager  # noqa: F401
    from . import jobproc, supervisor  # noqa: F401

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
            from ..staging.stager import stage

            code = stage(home, job_id)
        else:
            from .supervisor import supervise

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

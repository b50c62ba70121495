"""A job process forked ahead of its job, which its supervisor hands the job to.

The pool agent forks a spare supervisor before the next job is known
(``agent/forking.py``); the spare forks the job's process at once too, which then
waits on a socket. Once the spare has claimed its job it sends that process what a
fresh fork would have been given (``jobproc.Launch``: the job, its environment,
payload, cores and containment; its log as a descriptor), and the process runs it
exactly as a fresh fork does (``jobproc._run_job``): one process per job, as before,
but the fork is off the path from a decision to the job's first line.

    >>> warm = WarmProcess.fork()  # doctest: +SKIP
    >>> pid = warm.start(Launch(folder, job, env, context, payload, cores, log_fd))  # doctest: +SKIP

A process that is not used (a distributed job, a large payload, no job at all) is killed
and reaped before the job's own processes are forked: the supervisor's descendants are
the job's.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
from dataclasses import replace

from ..store import JobInfo
from .jobproc import PR_SET_PDEATHSIG, Launch, _run_job, libc, world_size

#: The largest payload sent to a waiting process; a larger one is forked with (the fork
#: shares its pages, where the socket would copy them).
MAX_PAYLOAD = 1 << 20

_LENGTH = struct.Struct(">Q")


class WarmProcess:
    """A forked process waiting for its job (``start``), or to be let go (``discard``)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock: socket.socket | None = sock

    @classmethod
    def fork(cls, close: tuple[int, ...] = ()) -> WarmProcess | None:
        """Fork a waiting job process (None if it cannot be forked: the job is forked then).

        ``close``: descriptors of this process the job's must not keep.
        """
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return None
        supervisor = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            ours.close()
            for fd in close:
                os.close(fd)
            _wait_for_job(theirs, supervisor)  # never returns
        theirs.close()
        try:
            os.setpgid(pid, pid)  # the job's group from the start (also done by the child)
        except OSError:
            pass
        return cls(pid, ours)

    def fits(self, job: JobInfo, payload: bytes) -> bool:
        """Whether this process can run ``job``: one process, and a payload to send."""
        return self._sock is not None and world_size(job) == 1 and len(payload) <= MAX_PAYLOAD

    def start(self, launch: Launch) -> int | None:
        """Hand the job to the waiting process; its pid, or None when it has gone (it is
        reaped: fork the job instead)."""
        assert self._sock is not None
        box = launch.box
        # the log (and where the result is reported) go as descriptors; the submitted
        # environment is not sent twice (``launch.env`` has it, with the job's grant)
        context = {k: v for k, v in launch.context.items() if k != "env"}
        order = pickle.dumps(replace(launch, context=context, log_fd=-1, result_fd=-1))
        fds = [launch.log_fd] + ([launch.result_fd] if launch.result_fd >= 0 else [])
        if box is not None:
            box.add(self.pid)
        try:
            socket.send_fds(self._sock, [_LENGTH.pack(len(order))], fds)
            self._sock.sendall(order)
        except OSError:
            if box is not None:
                box.ranks.discard(self.pid)
            self.discard()
            return None
        self._sock.close()
        self._sock = None
        return self.pid

    def discard(self) -> None:
        """Kill and reap the process if it was not given a job (no-op once it was)."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _wait_for_job(sock: socket.socket, supervisor: int) -> None:
    """The waiting process: read its job, then run it as a freshly forked job process does."""
    try:
        os.setpgid(0, 0)
        try:
            libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != supervisor:
            os._exit(0)  # the supervisor died before the death signal was asked for
        head, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, 2)
        head += _read(sock, _LENGTH.size - len(head))
        if len(head) < _LENGTH.size or not fds:
            os._exit(0)  # let go without a job
        data = _read(sock, _LENGTH.unpack(head)[0])
        sock.close()
        result_fd = fds[1] if len(fds) > 1 else -1
        if result_fd >= 0:
            os.set_inheritable(result_fd, False)  # a program the job runs does not get it
        launch = replace(pickle.loads(data), log_fd=fds[0], result_fd=result_fd)
    except BaseException:
        os._exit(1)
    _run_job(launch, supervisor)


def _read(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``sock`` (fewer only when it closes first)."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            break
        chunks += chunk
    return bytes(chunks)

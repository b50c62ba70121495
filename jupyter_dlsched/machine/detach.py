"""Processes the pool starts for itself, born outside whatever process starts them.

A supervisor is its job's child subreaper: every process below it is the job's, and it
kills what is left of them when the job ends (``local/containment.py``). When a supervisor
starts a process that belongs to the pool (the user's agent, when none answered the job's
end; a launcher; the next job's supervisor), that process must not be below it, or the
sweep of the job's leftovers ends it: an agent started that way was killed with the job,
under the client that had just connected to it. ``spawn`` starts such a process; from a
subreaper it goes through a short-lived middle process, with the subreaper flag off until
that process has exited, so the new process is adopted above (by init, or the subreaper
above this one).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


def _prctl(*args: object) -> int:
    return int(ctypes.CDLL(None, use_errno=True).prctl(*args))


def is_subreaper() -> bool:
    """Whether this process adopts its orphaned descendants (a supervisor)."""
    flag = ctypes.c_int(0)
    return _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and bool(flag.value)


@contextmanager
def not_a_subreaper() -> Iterator[None]:
    """This process is no subreaper inside the block: a process orphaned meanwhile (a
    daemon that forks away, a middle process that exits) goes to the subreaper above, or
    init."""
    was = is_subreaper()
    if was:
        _prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        yield
    finally:
        if was:
            _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def spawn(
    argv: Sequence[str], *, output: int | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes] | None:
    """Start ``argv`` in a session of its own, stdin from /dev/null, stdout and stderr to
    the file descriptor ``output`` (else /dev/null). Its ``Popen`` when this process may be
    its parent; None when this process is a subreaper: then it was started outside it
    (``OSError`` if it could not be)."""
    environ = dict(os.environ if env is None else env)
    if not is_subreaper():
        target = subprocess.DEVNULL if output is None else output
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=target,
            stderr=target,
            start_new_session=True,
            close_fds=True,
            env=environ,
        )
    actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    if output is None:
        actions += [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
    else:
        actions += [(os.POSIX_SPAWN_DUP2, output, fd) for fd in (1, 2)]
    with not_a_subreaper():
        middle = os.fork()
        if middle == 0:  # only a system call here: this child may have been forked with threads
            code = 1
            try:
                os.posix_spawn(argv[0], list(argv), environ, file_actions=actions, setsid=True)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(middle, 0)  # gone: what it started is adopted above, not here
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"could not start {argv[0]}")
    return None

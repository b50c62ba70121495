"""A job's log, kept within bounds: its stdout and stderr reach the log through a pipe its
supervisor empties, so one job's output can neither grow without end nor fill the disk
every user's pool lives on.

The supervisor writes what the job prints to the log (``LogKeeper.pump``, from its
watch loop) until either bound is reached, then one line saying why, and drops the
rest (still reading it, so the job never blocks on a full pipe):

* ``DLSCHED_MAX_LOG_BYTES`` (a size, ``"100MiB"`` by default; ``0``: no cap): what one
  attempt of a job may write to its log;
* the disk reserve: a log is not written into the last tenth of the disk that holds
  it (at least ``MIN_KEEP``, at most ``MAX_KEEP``), so that submitting and cancelling
  go on for everyone while one job writes without end.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..vocab.units import format_size, parse_size

MAX_LOG_ENV = "DLSCHED_MAX_LOG_BYTES"
DEFAULT_MAX_LOG = 100 << 20
#: The least and the most of a disk's free space a log never takes (a tenth in between).
MIN_KEEP = 8 << 20
MAX_KEEP = 1 << 30
#: Bytes read from the pipe in one go, and at most per wake-up of the supervisor.
CHUNK = 1 << 20
PER_WAKE = 16 << 20
#: The pipe's size where the system allows (a job's burst waits less for its supervisor).
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031


def max_log_bytes() -> int:
    """``DLSCHED_MAX_LOG_BYTES`` (0: no cap); ``SpecError`` for a value that is no size."""
    value = os.environ.get(MAX_LOG_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_LOG
    return parse_size(value, MAX_LOG_ENV)


def _cap_or_default() -> int:
    """``max_log_bytes()`` where a bad value cannot be refused (the agent refused it at its
    start already)."""
    try:
        return max_log_bytes()
    except ValueError:
        return DEFAULT_MAX_LOG


def disk_keep(folder: Path) -> int:
    """Bytes of the disk holding ``folder`` that a log leaves free."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return MIN_KEEP
    return min(MAX_KEEP, max(MIN_KEEP, st.f_blocks * st.f_frsize // 10))


def _free(folder: Path) -> int:
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class LogKeeper:
    """The pipe a job's output goes into (``job_end``: give it to the job as stdout and
    stderr) and the writing of it to the log ``log_fd`` in the spool ``folder``."""

    def __init__(self, log_fd: int, folder: Path, cap: int | None = None) -> None:
        self.log_fd, self.folder = log_fd, folder
        self.cap = _cap_or_default() if cap is None else cap
        self.keep = disk_keep(folder)
        self.written = 0
        self.cut = False
        self.fd, self.job_end = os.pipe()
        try:
            fcntl.fcntl(self.job_end, _F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # the system's default size
        os.set_blocking(self.fd, False)

    def started(self) -> None:
        """The job's processes hold the pipe's writing end now: the supervisor lets go."""
        if self.job_end >= 0:
            os.close(self.job_end)
            self.job_end = -1

    def pump(self) -> bool:
        """Move what the job wrote to the log; False once every writer has closed the pipe."""
        moved = 0
        while moved < PER_WAKE:
            try:
                data = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            moved += len(data)
            self._write(data)
        return True

    def close(self) -> None:
        """The job's processes are gone: take what is left in the pipe, and close."""
        self.started()
        if self.fd >= 0:
            self.pump()
            os.close(self.fd)
            self.fd = -1

    def _write(self, data: bytes) -> None:
        if self.cut:
            return
        if self.cap and self.written + len(data) > self.cap:
            self._put(data[: self.cap - self.written])
            self._stop(
                f"the job wrote more than its cap of {format_size(self.cap)} "
                f"({MAX_LOG_ENV} of the pool)"
            )
            return
        free = _free(self.folder)
        if free - len(data) < self.keep:
            self._stop(
                f"the disk holding it has {format_size(free)} free, and "
                f"{format_size(self.keep)} is kept for the pool"
            )
            return
        self._put(data)

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                sent = os.write(self.log_fd, view)
                view = view[sent:]
                self.written += sent
        except OSError as error:
            self._stop(f"it could not be written: {error.strerror}")

    def _stop(self, why: str) -> None:
        self.cut = True
        line = f"\n[dlsched] the log stops here: {why}; the rest of the output is dropped\n"
        try:
            os.write(self.log_fd, line.encode())
        except OSError:
            pass

"""How the pool agent forks: each job's supervisor and each stager, from its preloaded
state (no interpreter start), and one spare supervisor forked ahead of the next launch.

A forked child leaves the agent first (``_leave_agent``): its own session and name,
none of the agent's sockets, the agent's signal handlers undone.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..schema import JobInfo
from .config import ServiceConfig
from .connections import Connections

log = logging.getLogger("jupyter_dlsched.agent")

if TYPE_CHECKING:
    from ..engine import Engine
    from .scrape import ScrapeEndpoint

#: Seconds after a launch before the next spare supervisor is forked.
SPARE_DELAY = 0.05
#: Spare supervisors kept forked ahead: two, so that jobs started back to back (a queue
#: draining, each job shorter than ``SPARE_DELAY``) each find one.
SPARES = 2


def _set_name(name: bytes) -> None:
    """The process name ``ps`` and ``top`` show (``dlsched-agent``, ``dlsched-sup``)."""
    from ..local.jobproc import libc

    try:
        libc().prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class Forking:
    """The forks of ``Agent`` (``service.py``), which this is a part of."""

    if TYPE_CHECKING:  # the agent's, set in Agent.__init__
        home: Path
        shared: bool
        config: ServiceConfig | None
        conns: Connections
        scrape: ScrapeEndpoint | None
        _spares: list[tuple[int, int]]
        _spare_after: float
        _dirty: bool
        _stopping: bool
        sched: Engine | None

        @property
        def address(self) -> str | bytes: ...
        @property
        def _store(self) -> Any: ...

    def fork_supervisor(self, job: JobInfo) -> None:
        """Start the supervisor of an allocated job (it runs in its own session).

        The spare supervisor forked ahead of time takes it when there is one (it
        has its ledger connection open already); a new spare is forked once the
        loop is idle again.
        """
        if self._spares:
            pid, pipe = self._spares.pop(0)
            # the next spare waits until this job is under way (two forks at once compete
            # for the same cores and pages); a refill already pending is not pushed back, or
            # a queue draining fast would never get its spares back
            now = time.monotonic()
            if self._spare_after <= now:
                self._spare_after = now + SPARE_DELAY
            try:
                os.write(pipe, f"{job.id}\n".encode())
                return
            except OSError:
                pass  # the spare has gone: fork one for this job
            finally:
                os.close(pipe)
        try:
            pid = self._fork()
        except OSError as error:
            log.warning("dlsched agent: cannot start the supervisor of %s: %s", job.id, error)
            return  # relaunched after RELAUNCH_AFTER, or reaped when its claim lapses
        if pid == 0:
            self._become_supervisor(job.id, None)

    def _fork(self) -> int:
        """``os.fork()`` with the ledger connection closed first (it reopens on next use).

        SQLite keeps, per process, the state of the locks its connections hold on
        a file; a forked copy of that state would make the child believe it holds
        the parent's locks, and a connection it opens would skip taking them.
        """
        assert self.sched is not None
        self.sched.store.close()
        return os.fork()

    def fork_stager(self, source_id: str) -> None:
        """Fork the stager of a staging (it copies a job's input into the cache)."""
        try:
            if self._fork() != 0:
                return
        except OSError as error:
            log.warning("dlsched agent: cannot start a stager: %s", error)
            return
        code = 1
        try:
            self._leave_agent(b"dlsched-stage")
            from ..staging.stager import stage

            code = stage(self.home, source_id, as_owner=self.shared, quota_for=self._cache_quota)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    def _cache_quota(self, uid: int) -> int | None:
        """The bytes of the data cache a user's entries may hold (``max_cache_bytes``)."""
        if self.config is None:
            return None
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            return self.config.limits.max_cache_bytes
        return self.config.limits_for(user).max_cache_bytes

    def _leave_agent(self, name: bytes) -> None:
        """In a forked child: its own session and name, none of the agent's sockets."""
        os.setsid()
        _set_name(name)
        self.conns.close_in_child()
        if self.scrape is not None:
            self.scrape.listener.close()
        for _, pipe in self._spares:
            os.close(pipe)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def fork_spare(self) -> None:
        """Fork a supervisor that opens the ledger and waits for the id of the next job."""
        if len(self._spares) >= SPARES or self._stopping or time.monotonic() < self._spare_after:
            return
        try:
            read, write = os.pipe()
        except OSError:
            return
        try:
            pid = self._fork()
        except OSError:
            os.close(read)
            os.close(write)
            return
        if pid == 0:
            os.close(write)
            self._become_supervisor(None, read)
        os.close(read)
        self._spares.append((pid, write))

    def _become_supervisor(self, job_id: str | None, pipe: int | None) -> None:
        code = 1
        warm = None
        try:
            self._leave_agent(b"dlsched-sup")
            from ..local.supervisor import supervise
            from ..local.warm import WarmProcess
            from ..store import Store

            if pipe is not None:
                # a spare forks its job's process ahead too (before it opens the ledger,
                # which that process must not share): the job is handed to it once known
                warm = WarmProcess.fork(close=(pipe,))
            store = Store(self.home)
            if pipe is not None:
                with os.fdopen(pipe, "rb") as waiting:
                    line = waiting.readline().decode().strip()
                if not line:
                    code = 0  # the agent has gone (or exited): nothing to supervise
                    return
                job_id = line
            assert job_id is not None
            code = supervise(
                self.home, job_id, as_owner=self.shared, agent=self.address, store=store, warm=warm
            )
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            if warm is not None:
                warm.discard()  # not given a job: it goes before its supervisor does
            os._exit(code)

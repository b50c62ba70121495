"""How the pool agent forks: each job's supervisor and each stager, from its preloaded
state (no interpreter start), and spare supervisors forked ahead of the next launches.

A spare supervisor is handed its job's id through a pipe; when that job has ended (and
everything of it exited) it says so and waits on the same pipe for another job
(``take_back``), up to ``REUSE`` jobs: a queue draining back to back costs one fork per
job (its job process), not three (a supervisor, its job process forked ahead, and the
refill of the spare).

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

from ..vocab.schema import JobInfo
from .config import ServiceConfig
from .connections import Connections, Peer

log = logging.getLogger("jupyter_dlsched.agent")

if TYPE_CHECKING:
    from ..engine import Engine
    from .scrape import ScrapeEndpoint

#: Seconds after a launch before the next spare supervisor is forked.
SPARE_DELAY = 0.05
#: Spare supervisors kept forked ahead: two, so that jobs started back to back (a queue
#: draining, each job shorter than ``SPARE_DELAY``) each find one.
SPARES = 2
#: Jobs one spare supervisor runs, one after the other, before it exits.
REUSE = 100


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
        _lent: dict[int, int]
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
            except OSError:
                os.close(pipe)  # the spare has gone: fork one for this job
            else:
                self._lent[pid] = pipe  # for its next job, when it says it waits for one
                return
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
        for pipe in [pipe for _, pipe in self._spares] + list(self._lent.values()):
            os.close(pipe)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def take_back(self, peer: Peer, again: bool) -> None:
        """A supervisor's last word for its job (``ended`` with ``again``): a spare again,
        waiting on its pipe for the next job, while fewer than ``SPARES`` wait; else (or
        when it does not wait, ``again`` false) its pipe is closed and it exits."""
        if peer.uid != os.geteuid():
            return  # only this agent's own supervisors
        pipe = self._lent.pop(peer.pid, None)
        if pipe is None:
            return
        if again and len(self._spares) < SPARES and not self._stopping:
            self._spares.append((peer.pid, pipe))
        else:
            os.close(pipe)

    def sweep_lent(self) -> None:
        """Forget supervisors that died with their pipe lent (killed: no last word)."""
        for pid in list(self._lent):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.close(self._lent.pop(pid))
            except PermissionError:
                pass

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
            from ..local.preload import learnt, warm_up
            from ..local.supervisor import rehearse, supervise
            from ..local.warm import WarmProcess
            from ..store import Store

            store = Store(self.home)
            if pipe is None:
                assert job_id is not None
                code = supervise(
                    self.home, job_id, as_owner=self.shared, agent=self.address, store=store
                )
                return
            line = ""  # the job it ran last
            with os.fdopen(pipe, "rb") as waiting:
                for run in range(1, REUSE + 1):
                    # a spare forks its job's process ahead too, with the ledger closed
                    # (that process must not share its connection): the job is handed to
                    # it once known
                    # what this user's jobs imported before, imported here once, so every
                    # process forked for a job has it (not in a shared pool: whose job
                    # comes next is not known)
                    if not self.shared:
                        warm_up(learnt(store, os.getuid(), self.home), self.home)
                    store.close()
                    warm = WarmProcess.fork(close=(pipe,))
                    store.data_version()  # opened again, before the job is known
                    if line:
                        rehearse(store, line)  # the pages its next start touches, copied now
                    line = waiting.readline().decode().strip()
                    if not line:
                        code = 0  # the agent has gone (or exited): nothing to supervise
                        return
                    code = supervise(
                        self.home,
                        line,
                        as_owner=self.shared,
                        agent=self.address,
                        store=store,
                        warm=warm,
                        again=run < REUSE,
                    )
                    warm = None  # given the job, or let go
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            if warm is not None:
                warm.discard()  # not given a job: it goes before its supervisor does
            os._exit(code)

"""How the pool agent forks: each job's supervisor and each stager, from its preloaded
state (no interpreter start), and spare supervisors forked ahead of the next launches.

A spare supervisor is handed its job's id through a channel (a socket pair); when that
job has ended (and everything of it exited) it says so and waits on the same channel for
another job (``take_back``), up to ``REUSE`` jobs: a queue draining back to back costs one
fork per job (its job process), not three (a supervisor, its job process forked ahead,
and the refill of the spare). On that channel a spare also says when it imports what was
learnt and when it is ready; which spare a job gets, which spares are told to import what
they lack, and which go when too many wait, is ``spares.py``.

A forked child leaves the agent first (``_leave_agent``): its own session and name,
none of the agent's sockets, the agent's signal handlers undone.
"""

from __future__ import annotations

import logging
import os
import pwd
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocab.schema import JobInfo
from .config import ServiceConfig
from .connections import Connections, Peer
from .spares import LENT, WARM, WARMING, Spare, best, least_use

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
#: Seconds after a launch before the next spare is forked while one ready with what was
#: learnt is still in hand: a spare forked by the agent imports the learnt modules again
#: (a second or two of a core for torch), and one job at a time never needs it (the
#: spare that ran the job before is back first).
WARM_REFILL_DELAY = 1.0


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
        selector: selectors.BaseSelector
        _spares: list[Spare]
        _lent: dict[int, Spare]
        _spare_after: float
        _learnt: int
        _dirty: bool
        _stopping: bool
        sched: Engine | None

        @property
        def address(self) -> str | bytes: ...
        @property
        def _store(self) -> Any: ...

    def fork_supervisor(self, job: JobInfo) -> None:
        """Start the supervisor of an allocated job (it runs in its own session).

        A spare supervisor forked ahead of time takes it when there is one (it has its
        ledger connection open already, and what was learnt imported: ``spares.best``);
        a new spare is forked once the loop is idle again.
        """
        while self._spares:
            spare = best(self._spares, self._learnt)
            if spare.rank(self._learnt)[0] >= 2 and self._hand_on(job):
                return
            self._spares.remove(spare)
            # the next spare waits until this job is under way (two forks at once compete
            # for the same cores and pages); a refill already pending is not pushed back, or
            # a queue draining fast would never get its spares back
            now = time.monotonic()
            # (one with what was learnt is in hand, or comes back after its job)
            in_hand = any(s.rank(self._learnt)[0] <= 1 for s in self._spares) or any(
                s.learnt >= self._learnt for s in self._lent.values()
            )
            delay = WARM_REFILL_DELAY if self._learnt and in_hand else SPARE_DELAY
            if self._spare_after <= now:
                self._spare_after = now + delay
            else:
                self._spare_after = min(self._spare_after, now + delay)
            if spare.lend(job):
                self._lent[spare.pid] = spare  # for its next job, when it says it waits
                return
            self._forget(spare)  # it has gone: the next one, or one forked for this job
        if self._learnt and self._hand_on(job):
            return
        try:
            pid = self._fork()
        except OSError as error:
            log.warning("dlsched agent: cannot start the supervisor of %s: %s", job.id, error)
            return  # relaunched after RELAUNCH_AFTER, or reaped when its claim lapses
        if pid == 0:
            self._become_supervisor(job.id, None)

    def _hand_on(self, job: JobInfo) -> bool:
        """Give ``job`` to a lent spare whose job has ended, when no spare in hand has what
        was learnt: it is handed over when that spare says it waits again (``take_back``),
        in the time it takes its supervisor to come back, not the seconds of an import."""
        for spare in self._lent.values():
            if spare.returning(self._store, self._learnt, REUSE):
                spare.queued = job
                return True
        return False

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
        for spare in self._spares + list(self._lent.values()):
            spare.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def take_back(self, peer: Peer, again: bool) -> None:
        """A supervisor's last word for its job (``ended`` with ``again``): a spare again,
        waiting on its channel for the next job (while too many wait, the one of least use
        goes, once it has said where it stands: ``tend_spares``); else (or when it does
        not wait, ``again`` false) its channel is closed and it exits."""
        if peer.uid != os.geteuid():
            return  # only this agent's own supervisors
        spare = self._lent.pop(peer.pid, None)
        if spare is None:
            return
        if again and not self._stopping:
            spare.back()
            self._learnt = max(self._learnt, spare.learnt)
            queued, spare.queued = spare.queued, None
            if queued is not None and spare.lend(queued):
                self._lent[spare.pid] = spare
                return
            self._spares.append(spare)
            self.tend_spares()
            if queued is not None:
                self.fork_supervisor(queued)  # it had gone: another takes it
        else:
            self._forget(spare)

    def spare_said(self, spare: Spare) -> None:
        """A spare's channel is readable: what it said, or that it has gone."""
        if not spare.hear():
            self._forget(spare)
            return
        if spare.state != LENT:
            self._learnt = max(self._learnt, spare.learnt)
            self.tend_spares()

    def tend_spares(self) -> None:
        """Let go of the spares of least use while more than ``SPARES`` wait, and tell each
        that is ready without what was learnt since to import it."""
        while len(self._spares) > SPARES:
            spare = least_use(self._spares, self._learnt)
            if spare is None:
                break  # decided once they have said where they stand
            if spare.state == WARMING:
                spare.kill()  # its import would only take the cores from the jobs
            self._forget(spare)
        for spare in self._spares:
            if spare.rank(self._learnt)[0] == 3 and spare.send(WARM):
                spare.told(WARMING)

    def _forget(self, spare: Spare) -> None:
        """Let go of a spare (it exits when it reads the end of its channel)."""
        if spare in self._spares:
            self._spares.remove(spare)
        if self._lent.get(spare.pid) is spare:
            del self._lent[spare.pid]
        try:
            self.selector.unregister(spare.channel)
        except (KeyError, ValueError):
            pass
        spare.close()
        queued, spare.queued = spare.queued, None
        if queued is not None and not self._stopping:
            self.fork_supervisor(queued)  # it does not come back: another takes it

    def close_spares(self) -> None:
        """Let go of every spare (each exits; a job one runs is not affected)."""
        for spare in self._spares + list(self._lent.values()):
            spare.queued = None  # launched again by the next agent (``RELAUNCH_AFTER``)
            self._forget(spare)

    def sweep_lent(self) -> None:
        """Forget supervisors that died with their channel lent (killed: no last word)."""
        for pid, spare in list(self._lent.items()):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self._forget(spare)
            except PermissionError:
                pass

    def fork_spare(self) -> None:
        """Fork a supervisor that opens the ledger and waits for the id of the next job."""
        if len(self._spares) >= SPARES or self._stopping or time.monotonic() < self._spare_after:
            return
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            return
        try:
            pid = self._fork()
        except OSError:
            ours.close()
            theirs.close()
            return
        if pid == 0:
            ours.close()
            self._become_supervisor(None, theirs.detach())
        theirs.close()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1  # it has exited already: its channel says so
        ours.setblocking(False)
        spare = Spare(pid, ours, pidfd)
        self.selector.register(ours, selectors.EVENT_READ, spare)
        self._spares.append(spare)

    def _become_supervisor(self, job_id: str | None, pipe: int | None) -> None:
        code = 1
        warm = None
        try:
            self._leave_agent(b"dlsched-sup")
            from ..local.preload import wanted, warm_up
            from ..local.supervisor import rehearse, supervise
            from ..local.warm import WarmProcess
            from ..store import Store

            store = Store(self.home)
            uid = os.getuid()
            if pipe is None:
                assert job_id is not None
                code = supervise(
                    self.home, job_id, as_owner=self.shared, agent=self.address, store=store
                )
                return
            runs = 0
            line = ""  # the job it ran last
            with os.fdopen(pipe, "rb") as waiting:
                while runs < REUSE:
                    # what this user's jobs imported before, imported here once, so every
                    # process forked for a job has it (not in a shared pool: whose job
                    # comes next is not known); the agent is told, so that a job goes to a
                    # spare that has it, or waits for this import rather than doing its own
                    learnt, modules = (0, []) if self.shared else wanted(store, uid, self.home)
                    fresh = False
                    if modules:
                        _say(pipe, f"w{learnt} {runs}")
                        before = len(sys.modules)
                        warm_up(modules, self.home)
                        fresh = len(sys.modules) != before
                    if warm is None or fresh:
                        if warm is not None:
                            warm.discard()  # forked before the import: it lacks it
                        # a spare forks its job's process ahead too, with the ledger closed
                        # (that process must not share its connection): the job is handed
                        # to it once known
                        store.close()
                        warm = WarmProcess.fork(close=(pipe,))
                        store.data_version()  # opened again, before the job is known
                        if line:
                            rehearse(store, line)  # the pages its next start touches, now
                    _say(pipe, f"r{learnt} {runs}")
                    try:
                        order = waiting.readline().decode().strip()
                    except ConnectionResetError:
                        order = ""  # the agent closed the channel before reading what we said
                    if not order:
                        code = 0  # the agent has gone (or exited): nothing to supervise
                        return
                    if order == WARM:
                        continue  # more was learnt: imported before the next job
                    runs += 1
                    code = supervise(
                        self.home,
                        order,
                        as_owner=self.shared,
                        agent=self.address,
                        store=store,
                        warm=warm,
                        again=runs < REUSE,
                    )
                    warm = None  # given the job, or let go
                    line = order
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            if warm is not None:
                warm.discard()  # not given a job: it goes before its supervisor does
            os._exit(code)


def _say(channel: int, word: str) -> None:
    """A spare tells the agent where it stands (``spares.py``); an agent gone is no error
    (the spare reads the end of its channel next)."""
    try:
        os.write(channel, f"{word}\n".encode())
    except OSError:
        pass

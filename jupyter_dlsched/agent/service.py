"""The pool agent: the one process that decides, launches and answers for a ledger.

Kernels, the CLI and the server extension are its clients: they submit,
steer and read over a Unix socket; the agent validates, writes the ledger,
ticks the policy and forks each job's supervisor from its preloaded state
(no interpreter start). Every peer is identified by ``SO_PEERCRED``.

Two ways to run it, one code path:

* **one user** (``Agent(home)``): an abstract socket named after the user and
  the state folder; started on first use by a client, exits when idle; a peer
  of another uid is refused.
* **a shared pool** (``Agent(home, socket_path, config=...)``, what
  ``dlsched service run`` starts, as root or a service user): a socket file
  anyone may connect to; each job's supervisor stays with the service and
  forks the job process as the job's owner. Everyone sees the queue; only a
  job's owner or an admin may cancel or steer it, and each user's results and
  logs live in a spool folder only that user can open.

Running jobs do not depend on the agent: each has a supervisor in its own
session that renews its lease and records how it ended in the ledger. A
restarted agent (after ``kill -9``) opens the same ledger and goes on; the
supervisors it did not start tell it when their jobs end.

    python -m jupyter_dlsched.agent --home DIR [--socket PATH --config FILE]
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
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..local.launcher import code_stamp
from ..local.logcap import max_log_bytes
from ..store import payload_keep
from ..vocab.errors import DlschedError, LedgerUnavailable, PermissionDenied, SpecError
from ..vocab.schema import WAITING
from .bites import Bites
from .client import IDLE_EXIT, trusted_server_uids, user_address
from .config import ServiceConfig
from .connections import Connections, Peer
from .deciding import agent_engine
from .door import check_request
from .forking import SPARES, Forking, _set_name
from .protocol import ProtocolError, error_reply
from .ray_keeper import RayKeeper
from .reads import QUEUED_READS
from .refusals import CountedRefusals
from .requests import Requests
from .scrape import ScrapeEndpoint
from .spares import Spare

if TYPE_CHECKING:
    from ..engine import Engine
    from ..machine.sampling import Sampler
from .visibility import Viewer, redact

log = logging.getLogger("jupyter_dlsched.agent")

#: Seconds between a shared pool's utilisation samples, and how long they are kept.
SAMPLE_INTERVAL = 5.0
SAMPLE_RETENTION = 24 * 3600.0


def _check_reachable(home: Path) -> None:
    """Every folder above a shared pool's state folder must let other users pass (``o+x``):
    each job's supervisor opens the job's spool folder as the job's owner."""
    import stat

    folders = {Path(os.path.abspath(home)), Path(os.path.realpath(home))}
    for folder in sorted({p for f in folders for p in f.parents}):
        try:
            mode = os.stat(folder).st_mode
        except FileNotFoundError:
            continue  # created with the state folder, checked again after
        if not mode & stat.S_IXOTH:
            raise SpecError(
                "--home",
                str(home),
                f"a folder every user can reach: {folder} is "
                f"{stat.filemode(mode)} ({stat.S_IMODE(mode):04o}), which other users cannot "
                f"pass through (chmod o+x {folder}, or choose another --home)",
            )


def preload() -> None:
    """Import what supervisors and jobs need before forking them (``DLSCHED_PRELOAD``)."""
    from ..local import forkserver

    forkserver.preload()


class Agent(CountedRefusals, Requests, Forking):
    """Serve one ledger: ``Agent(home).serve()`` runs until stopped (or idle, for one user)."""

    def __init__(
        self,
        home: str | os.PathLike[str],
        socket_path: str | os.PathLike[str] | None = None,
        *,
        config: ServiceConfig | None = None,
        idle_exit: float = IDLE_EXIT,
        metrics: tuple[str, int] | None = None,
    ) -> None:
        self.home = Path(home)
        #: where Prometheus scrapes this pool's metrics (``--metrics HOST:PORT``), if anywhere
        self.metrics_address = metrics
        self.scrape: ScrapeEndpoint | None = None
        #: a shared pool records the utilisation history its users' sidebars draw
        self.sampler: Sampler | None = None
        self.shared = socket_path is not None
        self.socket_path = Path(socket_path) if socket_path is not None else None
        self.config = config if config is not None or not self.shared else ServiceConfig.load(None)
        self.idle_exit = idle_exit
        self.uid = os.getuid()
        self.selector = selectors.DefaultSelector()
        #: the limits that bit: counted for the metrics, logged once a minute per user
        self.bites = Bites()
        self.conns = Connections(
            self.selector,
            shared=self.shared,
            handle=self._handle,
            who=self._who,
            refuse=self._refuse_uid,
            bites=self.bites,
        )
        self.sched: Engine | None = None
        self._dirty = True
        self._stopping = False
        self._socket_inode = 0  # the socket file this agent bound, in a shared pool
        self._address: str | bytes | None = None
        #: supervisors forked ahead of time, waiting for a job (``spares.py``)
        self._spares: list[Spare] = []
        #: supervisors handed a job through their channel, by pid: kept to hand them the
        #: next job when they say they wait for one (``Forking.take_back``)
        self._lent: dict[int, Spare] = {}
        self._spare_after = 0.0
        #: the most modules a spare said were learnt (spares that read fewer lack some)
        self._learnt = 0
        #: this ledger's Ray driver, started while a Ray job waits or runs
        self.ray = RayKeeper(self.home, lambda: self._store, self.shared)
        self._names: dict[int, tuple[str, bool, float]] = {}
        #: each user's list requests not yet answered, oldest first (``Reads.queue_read``)
        self._read_queue: dict[int, deque[tuple[Peer, dict[str, Any], list[bytes]]]] = {}
        self.code = code_stamp()
        # each handler takes its op's request shape and returns its reply shape (shapes.OPS);
        # a message off the wire is only a JSON object, so the table takes any
        self._ops: dict[str, Callable[[Peer, Any, list[bytes]], Mapping[str, Any] | None]]
        self._ops = {
            "hello": self._hello,
            "ping": self._ping,
            "submit": self._submit,
            "cancel": self._cancel,
            "priority": self._priority,
            "requeue": self._requeue,
            "get": self._get,
            "jobs": self._jobs,
            "finished": self._finished,
            "count": self._count,
            "seq": self._seq,
            "status": self._status_request,
            "changes": self._changes,
            "events": self._events,
            "meta": self._meta,
            "progress": self._progress,
            "ended": self._ended,
            "tick": self._tick_request,
            "settings": self._settings,
            "cache": self._cache,
            "metrics": self._metrics,
            "samples": self._samples,
            "ray": self._ray,
            "schedules": self._schedules,
            "stop": self._stop,
            "room": self._room,
        }

    @property
    def address(self) -> str | bytes:
        """Where clients reach this agent (computed once: forked supervisors report to it)."""
        if self._address is None:
            self._address = (
                str(self.socket_path) if self.socket_path is not None else user_address(self.home)
            )
        return self._address

    @property
    def peers(self) -> dict[int, Peer]:
        """The open client connections, by file descriptor."""
        return self.conns.peers

    @property
    def _store(self) -> Any:
        assert self.sched is not None
        return self.sched.store

    # -- start and loop ---------------------------------------------------------------------

    def bind(self) -> bool:
        """Take the socket; False when another agent already serves it."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.socket_path is None:
            try:
                listener.bind(self.address)
            except OSError:
                listener.close()
                return False
        else:
            folder = self.socket_path.parent
            folder.mkdir(parents=True, exist_ok=True)
            # clients refuse a socket another user could have put in place: so does the service
            trusted_server_uids(str(self.socket_path), service_uid=os.geteuid())
            if _answers(str(self.socket_path)):
                listener.close()
                return False
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass
            # anyone may connect: who they are comes from SO_PEERCRED, not the file's mode.
            # The mode is given at creation (a chmod afterwards would follow a planted link);
            # the umask is the process's, and no other thread exists yet to create a file.
            umask = os.umask(0o111)
            try:
                listener.bind(str(self.socket_path))
            finally:
                os.umask(umask)
            self._socket_inode = os.stat(self.socket_path).st_ino
        listener.listen(256)
        listener.setblocking(False)
        self.conns.listen(listener)
        return True

    def open(self) -> None:
        """Open the ledger (and in a shared pool make its folders traversable to users),
        then delete the payloads no unfinished job needs any more.

        A shared pool whose state folder users cannot reach (a folder above it closed
        to them) is refused: every job would fail to open its own spool folder.
        """
        options: dict[str, Any] = {}
        if self.config is not None:
            params = dict(self.config.policy_params)
            if self.config.policy == "fair" and "weights" not in params:
                params["weights"] = self.config.owner_weights()
            options = {
                "policy": self.config.policy,
                "policy_params": params,
                "min_schedule_interval": self.config.min_schedule_interval,
            }
        if self.shared:
            _check_reachable(self.home)  # before anything is created in it
        self.sched = agent_engine(self, self.home, **options)
        self._store.ledger.removed()  # holds the ledger's file: one made later is not it
        if self.shared:
            from ..machine.sampling import Sampler

            assert self.sched is not None
            self.sampler = Sampler(self._store, self.sched.pool, SAMPLE_INTERVAL, SAMPLE_RETENTION)
        if self.metrics_address is not None:
            # prometheus_client is imported by pools that are scraped, not by every agent
            from ..machine.metrics import CONTENT_TYPE

            self.scrape = ScrapeEndpoint(
                self.selector,
                self.metrics_address,
                self.render_metrics,
                CONTENT_TYPE,
                evicted=self._scrape_evicted,
            )
        if self.shared:
            _check_reachable(self.home)  # and the folders just created
            # users reach their own spool folder (0700, theirs) through these; they cannot list them
            os.chmod(self._store.home, 0o711)
            os.chmod(self._store.spool_root, 0o711)
        payload_keep()  # a bad DLSCHED_PAYLOAD_KEEP is this start's error, in one line
        max_log_bytes()  # and so is a bad DLSCHED_MAX_LOG_BYTES
        try:
            blobs, size = self._store.collect_leftovers()
        except LedgerUnavailable as error:
            log.warning("dlsched agent: leftover payloads not collected: %s", error)
        else:
            if blobs:
                from ..vocab.units import format_size

                log.info(
                    "dlsched agent: deleted %d leftover payloads (%s)", blobs, format_size(size)
                )

    def serve(self) -> int:
        """Bind, open, preload and run until stopped; 0 also when another agent serves."""
        if not self.bind():
            return 0
        try:
            self.open()
            preload()
            _set_name(b"dlsched-agent")
            self.run()
        finally:
            self.close()
        return 0

    def run(self) -> None:
        """The loop (after ``bind`` and ``open``): until SIGTERM, a ``stop``, or idle."""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        self._loop()

    def _request_stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        self.close_spares()  # each reads the end of its channel and exits
        self.stop_listening()
        self.conns.close_all()
        if self.scrape is not None:
            self.scrape.close()
            self.scrape = None
        if self.sched is not None:
            self.sched.store.close()

    def stop_listening(self) -> None:
        """Free the socket for the next agent: a client behind a ``stop`` starts one
        instead of reaching this agent as it shuts down. A socket file is removed only
        while it is still the one this agent bound (the next agent may have bound its own)."""
        bound = self.conns.listener is not None
        self.conns.stop_listening()
        if bound and self.socket_path is not None:
            try:
                if os.stat(self.socket_path).st_ino == self._socket_inode:
                    self.socket_path.unlink()
            except FileNotFoundError:
                pass

    def _loop(self) -> None:
        store = self._store
        version = store.data_version()
        last_change = last_tick = last_busy = time.monotonic()
        last_refill = last_warned = last_ray = last_sweep = last_sample = 0.0
        while not self._stopping:
            quiet = time.monotonic() - last_change
            busy = self._dirty or self._read_queue
            timeout = 0.0 if busy else min(0.25, max(0.002, quiet / 20))
            scrape = self.scrape
            for key, mask in self.selector.select(timeout):
                if scrape is not None and scrape.owns(key.data):
                    scrape.event(key.data, mask)
                elif isinstance(key.data, Spare):
                    self.spare_said(key.data)
                else:
                    self.conns.event(key.data, mask)
            now = time.monotonic()
            if now - last_sweep >= 0.5:
                last_sweep = now
                if not self.shared and store.ledger.removed():
                    # its state folder was removed: nothing here is anyone's any more
                    log.warning("dlsched agent: the ledger was removed; exiting")
                    return
                self.conns.sweep(now)
                self.sweep_lent()
                if scrape is not None:
                    scrape.sweep(now)
            try:
                current = store.data_version()
                if current != version:
                    version = current
                    self._dirty = True
                if self._dirty:
                    last_change = now
                if self._dirty or now - last_tick >= 1.0:
                    self._dirty = False
                    last_tick = now
                    self._tick()
                assert self.sched is not None
                self.sched.flush_positions()
                if now - last_refill >= 30.0:
                    last_refill = now
                    store.reserve.refill()
                if self.sampler is not None and now - last_sample >= SAMPLE_INTERVAL:
                    last_sample = now
                    self.sampler.sample_once()  # the pool's history, for every user's charts
                if now - last_ray >= 5.0:
                    last_ray = now
                    self.ray.keep()  # a Ray job waits or runs: a driver must serve it
            except LedgerUnavailable as error:
                if now - last_warned >= 60.0:
                    last_warned = now
                    log.warning("dlsched agent: %s", error)
                time.sleep(0.5)
            except Exception:
                log.exception("dlsched agent loop")
                time.sleep(0.5)
            self._answer_watchers()
            self.conns.serve_ready()
            self.serve_queued_reads()
            if len(self._spares) < SPARES and not self._dirty:
                self.fork_spare()  # off the path of the launch that used the last one
            if self.peers or not self.shared and self._has_waiting():
                last_busy = now
            if not self.shared and now - last_busy > self.idle_exit:
                return

    def _tick(self) -> None:
        assert self.sched is not None
        self.sched.tick()

    def _has_waiting(self) -> bool:
        """Whether a job waits, or a Ray job runs (its driver is kept alive by this agent)."""
        counts = self._store.count_jobs()
        if any(counts.get(s, 0) for s in WAITING) or self._store.count_active("ray"):
            return True
        return bool(self._store.timetable.schedule_count())  # a schedule's next run is waiting

    # -- connections ------------------------------------------------------------------------

    def _refuse_uid(self, uid: int) -> DlschedError | None:
        """Why a peer of ``uid`` may not connect at all (one user's pool: anyone else)."""
        if not self.shared and uid != self.uid:
            # their own agent serves them
            return PermissionDenied(
                f"this pool agent serves uid {self.uid} only; you are uid {uid}"
            )
        return None

    def _who(self, uid: int) -> tuple[str, bool]:
        """A peer's user name and whether it is an admin, looked up at most once a minute
        (a directory service can be slow, and the loop serves everyone)."""
        now = time.monotonic()
        known = self._names.get(uid)
        if known is None or now - known[2] > 60.0:
            admin = uid == self.uid or (
                self.config is not None and self.config.is_admin(uid, self.uid)
            )
            known = self._names[uid] = (_user_name(uid), admin, now)
        return known[0], known[1]

    def _handle(self, peer: Peer, message: dict[str, Any], blobs: list[bytes]) -> None:
        if message.get("op") in QUEUED_READS:
            self.queue_read(peer, message, blobs)  # answered in its user's turn
        else:
            self._answer(peer, message, blobs)

    def _answer(self, peer: Peer, message: dict[str, Any], blobs: list[bytes]) -> None:
        op = message.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        try:
            if handler is None or not isinstance(op, str):
                raise ProtocolError(f"unknown request {op!r}")
            check_request(op, message)  # its shape (shapes.OPS), then the handler's checks
            reply = handler(peer, message, blobs)
        except (DlschedError, ValueError, TypeError, KeyError) as error:
            if not isinstance(error, DlschedError):
                error = ProtocolError(f"a malformed {op!r} request: {error}")
            self.conns.send(peer, error_reply(error))
            return
        except Exception as error:
            log.exception("dlsched agent: %s request", op)
            self.conns.send(peer, error_reply(DlschedError(f"the pool agent failed: {error}")))
            return
        if reply is not None:
            self.conns.send(peer, {"ok": True, **self._visible(peer, reply)})

    def _visible(self, peer: Peer, reply: Mapping[str, Any]) -> Mapping[str, Any]:
        """``reply`` as ``peer`` may see it: the one rule for every request (visibility.py)."""
        if not self.shared:
            return reply
        return redact(dict(reply), Viewer(peer.uid, peer.admin), self._store.owners)

    # -- limits of a shared pool: each refusal counted and logged (bites.py) -----------------

    def _scrape_evicted(self) -> None:
        assert self.scrape is not None
        self.bites.hit(
            "metrics_connections",
            "",
            "%d connections to the metrics port: closed the oldest idle one for a new one",
            self.scrape.connections,
        )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _answers(path: str) -> bool:
    """True when an agent already listens on the socket file ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run a jupyter-dlsched pool agent.")
    parser.add_argument("--home", required=True, help="the pool's state folder")
    parser.add_argument("--socket", help="serve a shared pool on this socket file")
    parser.add_argument("--config", help="the shared pool's configuration (TOML)")
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT)
    args = parser.parse_args(argv)
    config = ServiceConfig.load(args.config) if args.socket else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return Agent(args.home, args.socket, config=config, idle_exit=args.idle_exit).serve()


if __name__ == "__main__":
    sys.exit(main())

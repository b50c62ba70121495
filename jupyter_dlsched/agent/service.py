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

import json
import logging
import math
import os
import pwd
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..backends.base import refuse_stage_in
from ..backends.local import LocalBackend
from ..errors import DlschedError, JobNotFound, LedgerUnavailable, PermissionDenied, SpecError
from ..local.launcher import code_stamp
from ..metrics import CONTENT_TYPE
from ..policy import Policy
from ..pool import idle_capacity
from ..scheduler import Scheduler
from ..schema import WAITING, JobInfo, info_to_json
from ..spec import MAX_NAME, build_spec, check_text
from ..store import payload_keep
from ..sweep import member_name
from ..words import PRIORITY_WORDS
from .client import IDLE_EXIT, trusted_server_uids, user_address
from .config import ServiceConfig
from .connections import Connections, Peer
from .limits import LimitsGate
from .protocol import ProtocolError, error_reply
from .ray_keeper import RayKeeper
from .scrape import ScrapeEndpoint

if TYPE_CHECKING:
    from ..sampling import Sampler
from .visibility import Viewer, redact

log = logging.getLogger("jupyter_dlsched.agent")

#: Longest a ``changes`` request waits for a state change before answering empty.
MAX_WAIT = 30.0
#: Rows a list request returns at most.
MAX_ROWS = 100_000
#: Largest progress report a job may send (JSON bytes).
MAX_PROGRESS = 64 * 1024
#: Seconds after a launch before the next spare supervisor is forked.
SPARE_DELAY = 0.05
#: Waiting jobs whose place in line changed that are written at once; more wait up to 1 s.
POSITIONS_AT_ONCE = 200
#: Seconds between a shared pool's utilisation samples, and how long they are kept.
SAMPLE_INTERVAL = 5.0
SAMPLE_RETENTION = 24 * 3600.0
#: Samples one ``samples`` request answers at most (each source thinned evenly to fit).
MAX_SAMPLES = 20_000
#: Seconds before an allocated job nobody claimed is launched again.
RELAUNCH_AFTER = 5.0
_METADATA_KEYS = ("inventory", "settings", "cache")


class ForkingBackend(LocalBackend):
    """The local backend as the agent runs it: supervisors are forked by the agent itself."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(None)
        self.agent = agent

    def launch(self, job: JobInfo) -> None:
        self.agent.fork_supervisor(job)


class AgentScheduler(Scheduler):
    """The scheduler inside the agent: the service's limits, and every user's jobs launched."""

    def __init__(self, agent: Agent, home: str | os.PathLike[str], **options: Any) -> None:
        self.agent = agent
        self._tried: dict[str, float] = {}
        self._positions: dict[str, tuple[int | None, str | None]] = {}
        self._positions_at = 0.0
        super().__init__(home, backend=ForkingBackend(agent), loop=False, agent=False, **options)
        from ..tick import QueueIndex

        self._index = QueueIndex()

    def tick(self, now: float | None = None) -> Any:
        try:
            return super().tick(now)
        except BaseException:
            from ..tick import QueueIndex

            self._index = QueueIndex()  # read everything again after a failed decision
            raise

    def policy(self) -> Policy:
        policy = super().policy()
        if self.agent.config is not None:
            return LimitsGate(policy, self.agent.config)
        return policy

    def wake(self) -> None:
        """Decide at the end of this loop turn, not in the middle of a request."""
        self.agent._dirty = True

    @property
    def stager_uid(self) -> int | None:
        # a shared pool stages every user's inputs, each read as its owner (staging/owner.py)
        return None if self.agent.shared else int(self.uid)

    def _launch_stager(self, source_id: str) -> None:
        self.agent.fork_stager(source_id)

    def _queue_positions(self, changed: list[tuple[int | None, str | None, str]]) -> None:
        """Places in line, written at most once a second when many moved (a deep queue moves
        every job up at each start: written every time, that would be most of a decision)."""
        self._positions.update((job_id, (pos, why)) for pos, why, job_id in changed)
        if len(self._positions) <= POSITIONS_AT_ONCE:
            self.flush_positions(force=True)

    def flush_positions(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._positions and (force or now - self._positions_at >= 1.0):
            rows = [(pos, why, job_id) for job_id, (pos, why) in self._positions.items()]
            super()._queue_positions(rows)  # kept for the next try if the disk is full
            self._positions = {}
            self._positions_at = now

    def _launch_mine(self, now: float, just_started: Iterable[str]) -> None:
        """Launch every allocated job nobody claimed (a user's own, or all in a shared pool)."""
        fresh = set(just_started)
        uid = None if self.agent.shared else self.uid
        for job_id, started, inline in self.store.unlaunched(uid, self.backend.name):
            if inline:
                continue  # runs in the thread of the kernel that holds the cell
            if job_id not in fresh and now - self._tried.get(job_id, 0.0) < RELAUNCH_AFTER:
                continue
            if job_id not in fresh and started is not None and now - started < 1.0:
                continue  # a supervisor is claiming it right now
            self._tried[job_id] = now
            self.backend.launch(self.store.get(job_id))
        if len(self._tried) > 10_000:
            self._tried = {k: v for k, v in self._tried.items() if now - v < 60.0}


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _seconds(msg: dict[str, Any], key: str, default: float) -> float:
    """A time field of a request (epoch seconds), or ``default`` when left out."""
    value = msg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1e12 < value < 1e12:
        raise SpecError(key, value, "a time in epoch seconds")
    return float(value)


#: What a submission may store with a job (``Store.read_file`` names).
JOB_FILES = ("payload.pkl", "command.json", "context.json")


def _job_files(item: object, blobs: list[bytes]) -> dict[str, bytes]:
    """One job of a ``submit``: ``{"files": {name: index of an attachment}}``, checked."""
    files = item.get("files") if isinstance(item, dict) else None
    if not isinstance(files, dict):
        raise ProtocolError("each job of a submit request needs files: {name: attachment}")
    out = {}
    for name, index in files.items():
        if name not in JOB_FILES:
            raise ProtocolError(f"a job file {name!r}: expected one of {', '.join(JOB_FILES)}")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(blobs):
            raise ProtocolError(
                f"job file {name!r} names attachment {index!r}; the request has {len(blobs)}"
            )
        out[name] = blobs[index]
    return out


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


#: Job ids one ``jobs`` request may name (SQLite binds at most 32,766 values a statement).
MAX_IDS = 10_000


def _count_arg(msg: dict[str, Any], key: str) -> int:
    """A request's ``offset`` or ``since`` (missing: 0): a whole number the ledger's 64-bit
    integers hold, 0 or more."""
    value = msg.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise SpecError(key, value, "a whole number from 0 to 2**63 - 1")
    return value


def _list_args(msg: dict[str, Any]) -> dict[str, Any]:
    """The filters of a ``jobs`` request, checked: states, owner, ids, order."""
    from ..schema import STATES

    states, owner, ids = msg.get("states"), msg.get("owner"), msg.get("ids")
    if states is not None and (
        not isinstance(states, list) or not all(isinstance(x, str) and x in STATES for x in states)
    ):
        raise SpecError("states", states, "a list of job states: " + ", ".join(STATES))
    if owner is not None and not isinstance(owner, str):
        raise SpecError("owner", owner, "a user name")
    if ids is not None and (
        not isinstance(ids, list) or len(ids) > MAX_IDS or not all(isinstance(x, str) for x in ids)
    ):
        raise SpecError("ids", ids, f"a list of at most {MAX_IDS:,} job ids")
    newest_first = msg.get("newest_first", False)
    if not isinstance(newest_first, bool | None):
        raise SpecError("newest_first", newest_first, "true or false")
    return {"states": states, "owner": owner, "ids": ids, "newest_first": bool(newest_first)}


def _page(msg: dict[str, Any]) -> int:
    """Rows one list request answers: its ``limit``, at most ``MAX_ROWS``."""
    limit = msg.get("limit")
    if limit is None:
        return MAX_ROWS
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SpecError("limit", limit, "a whole number of rows, 1 or more")
    return min(limit, MAX_ROWS)


def preload() -> None:
    """Import what supervisors and jobs need before forking them (``DLSCHED_PRELOAD``)."""
    from ..local import forkserver

    forkserver.preload()


class Agent:
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
        self.conns = Connections(
            self.selector,
            shared=self.shared,
            handle=self._handle,
            who=self._who,
            refuse=self._refuse_uid,
        )
        self.sched: AgentScheduler | None = None
        self._dirty = True
        self._stopping = False
        self._address: str | bytes | None = None
        #: a supervisor forked ahead of time: (pid, the pipe its job id is written to)
        self._spare: tuple[int, int] | None = None
        self._spare_after = 0.0
        #: this ledger's Ray driver, started while a Ray job waits or runs
        self.ray = RayKeeper(self.home, lambda: self._store, self.shared)
        self._names: dict[int, tuple[str, bool, float]] = {}
        self.code = code_stamp()
        self._ops: dict[str, Callable[[Peer, dict[str, Any], list[bytes]], dict[str, Any] | None]]
        self._ops = {
            "hello": self._hello,
            "ping": lambda peer, msg, blobs: {},
            "submit": self._submit,
            "cancel": self._cancel,
            "priority": self._priority,
            "requeue": self._requeue,
            "get": self._get,
            "jobs": self._jobs,
            "finished": self._finished,
            "count": lambda peer, msg, blobs: {"counts": self._store.count_jobs()},
            "seq": lambda peer, msg, blobs: {"seq": self._store.last_event_seq()},
            "status": lambda peer, msg, blobs: {"status": self._status(peer)},
            "changes": self._changes,
            "events": self._events,
            "meta": self._meta,
            "progress": self._progress,
            "ended": self._ended,
            "tick": self._tick_request,
            "settings": self._settings,
            "cache": lambda peer, msg, blobs: {"cache": self._cache_info(peer)},
            "metrics": lambda peer, msg, blobs: {"text": self.render_metrics().decode()},
            "samples": self._samples,
            "ray": lambda peer, msg, blobs: self.ray.request(msg),
            "stop": self._stop,
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
            options = {"policy": self.config.policy, "policy_params": params}
        if self.shared:
            _check_reachable(self.home)  # before anything is created in it
        self.sched = AgentScheduler(self, self.home, **options)
        if self.shared:
            from ..sampling import Sampler

            assert self.sched is not None
            self.sampler = Sampler(self._store, self.sched.pool, SAMPLE_INTERVAL, SAMPLE_RETENTION)
        if self.metrics_address is not None:
            self.scrape = ScrapeEndpoint(
                self.selector, self.metrics_address, self.render_metrics, CONTENT_TYPE
            )
        if self.shared:
            _check_reachable(self.home)  # and the folders just created
            # users reach their own spool folder (0700, theirs) through these; they cannot list them
            os.chmod(self._store.home, 0o711)
            os.chmod(self._store.spool_root, 0o711)
        payload_keep()  # a bad DLSCHED_PAYLOAD_KEEP is this start's error, in one line
        try:
            blobs, size = self._store.collect_leftovers()
        except LedgerUnavailable as error:
            log.warning("dlsched agent: leftover payloads not collected: %s", error)
        else:
            if blobs:
                from ..units import format_size

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
        if self._spare is not None:
            os.close(self._spare[1])  # the spare reads the end of its pipe and exits
            self._spare = None
        bound = self.conns.listener is not None
        self.conns.close_all()
        if self.scrape is not None:
            self.scrape.close()
            self.scrape = None
        if bound and self.socket_path is not None:
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass
        if self.sched is not None:
            self.sched.store.close()

    def _loop(self) -> None:
        store = self._store
        version = store.data_version()
        last_change = last_tick = last_busy = time.monotonic()
        last_refill = last_warned = last_ray = last_sweep = last_sample = 0.0
        while not self._stopping:
            quiet = time.monotonic() - last_change
            timeout = 0.0 if self._dirty else min(0.25, max(0.002, quiet / 20))
            scrape = self.scrape
            for key, mask in self.selector.select(timeout):
                if scrape is not None and scrape.owns(key.data):
                    scrape.event(key.data, mask)
                else:
                    self.conns.event(key.data, mask)
            now = time.monotonic()
            if now - last_sweep >= 0.5:
                last_sweep = now
                self.conns.sweep(now)
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
            if self._spare is None and not self._dirty:
                self.fork_spare()  # off the path of the launch that used the last one
            if self.peers or not self.shared and self._has_waiting():
                last_busy = now
            if not self.shared and (now - last_busy > self.idle_exit or not self.home.is_dir()):
                return

    def _tick(self) -> None:
        assert self.sched is not None
        self.sched.tick()

    def _has_waiting(self) -> bool:
        """Whether a job waits, or a Ray job runs (its driver is kept alive by this agent)."""
        counts = self._store.count_jobs()
        return any(counts.get(s, 0) for s in WAITING) or bool(self._store.count_active("ray"))

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
        op = message.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise ProtocolError(f"unknown request {op!r}")
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

    def _visible(self, peer: Peer, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` as ``peer`` may see it: the one rule for every request (visibility.py)."""
        if not self.shared:
            return reply
        return redact(reply, Viewer(peer.uid, peer.admin), self._store.owners)

    # -- forking supervisors ------------------------------------------------------------------

    def fork_supervisor(self, job: JobInfo) -> None:
        """Start the supervisor of an allocated job (it runs in its own session).

        The spare supervisor forked ahead of time takes it when there is one (it
        has its ledger connection open already); a new spare is forked once the
        loop is idle again.
        """
        if self._spare is not None:
            pid, pipe = self._spare
            self._spare = None
            # the next spare waits until this job is under way (two forks at once compete
            # for the same cores and pages)
            self._spare_after = time.monotonic() + SPARE_DELAY
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
        if self._spare is not None:
            os.close(self._spare[1])
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    def fork_spare(self) -> None:
        """Fork a supervisor that opens the ledger and waits for the id of the next job."""
        if self._spare is not None or self._stopping or time.monotonic() < self._spare_after:
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
        self._spare = (pid, write)

    def _become_supervisor(self, job_id: str | None, pipe: int | None) -> None:
        code = 1
        try:
            self._leave_agent(b"dlsched-sup")
            from ..local.supervisor import supervise
            from ..store import Store

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
                self.home, job_id, as_owner=self.shared, agent=self.address, store=store
            )
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    # -- requests ---------------------------------------------------------------------------

    def _hello(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        return {
            "version": __version__,
            "mode": "shared" if self.shared else "user",
            "home": str(self.home),
            "socket": self.socket_path and str(self.socket_path),
            "pid": os.getpid(),
            "code": self.code,
            "uid": peer.uid,
            "user": peer.user,
            "admin": peer.admin,
        }

    def _submit(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        assert self.sched is not None
        options = msg.get("options") or {}
        if not isinstance(options, dict):
            raise SpecError("options", options, "a mapping of resource options")
        inline = bool(msg.get("inline"))
        if self.shared and inline:
            raise SpecError(
                "inline",
                True,
                "a job that runs in the pool's own processes (a shared pool "
                "cannot run a thread of your kernel): leave out --inline",
            )
        backend = msg.get("backend") or "local"
        if backend != "local" and self.shared:
            raise SpecError("backend", backend, "the local backend in a shared pool")
        if backend == "ray":
            self.ray.check_options(msg)
            inventory = self.ray.inventory()
        elif backend == "local":
            inventory = self.sched.inventory
        else:
            raise SpecError("backend", backend, '"local" or "ray" through a pool agent')
        spec = build_spec(
            capacity=idle_capacity(inventory),
            kind=str(msg.get("kind", "function")),
            default_name=str(msg.get("default_name", "job")),
            origin=str(msg.get("origin", "")),
            **options,
        )
        if backend == "ray":
            if inline:
                raise SpecError("inline", True, "no --inline with the ray backend")
            refuse_stage_in("ray", spec)
        self._check_priority(peer, spec.priority)
        jobs = msg.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise ProtocolError("a submit request without jobs")
        self._check_queued(peer, len(jobs))
        batch = []
        for item in jobs:
            files = _job_files(item, blobs)
            named = spec
            if item.get("suffix"):  # a sweep member: "train[2] lr=0.01"
                suffix = check_text(str(item["suffix"]), "name")
                named = replace(spec, name=member_name(spec.name, suffix, MAX_NAME))
            batch.append((self._store.new_id(), named, files))
        self._check_payload(peer, batch)
        self._store.insert_jobs(
            batch, owner=peer.user, uid=peer.uid, backend=backend, inline=inline
        )
        self._dirty = True
        if backend == "ray":
            self.ray.keep()
        return {"ids": [job_id for job_id, _, _ in batch]}

    # -- limits of a shared pool -------------------------------------------------------------

    def _check_priority(self, peer: Peer, priority: int) -> None:
        if peer.admin or self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_priority
        if cap is not None and priority > cap:
            raise PermissionDenied(
                f"priority {_priority_value(priority)} is above the highest a user may ask "
                f"for in this pool, {_priority_value(cap)}; an admin can raise it"
            )

    def _check_queued(self, peer: Peer, adding: int) -> None:
        if self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_queued
        if cap is None:
            return
        waiting = self._store.count_waiting(peer.uid)
        if waiting + adding > cap:
            raise PermissionDenied(
                f"{peer.user} has {waiting} job{'s' if waiting != 1 else ''} waiting; the "
                f"limit per user is {cap} (this request adds {adding})"
            )

    def _check_payload(self, peer: Peer, batch: list[tuple[str, Any, dict[str, bytes]]]) -> None:
        """Refuse a submission that would put a user's unfinished jobs' payloads over
        ``max_payload_bytes``: what one user queues cannot fill the pool's disk."""
        if self.config is None:
            return
        cap = self.config.limits_for(peer.user).max_payload_bytes
        if cap is None:
            return
        from ..units import format_size

        distinct = {id(data): len(data) for _, _, files in batch for data in files.values()}
        adding = sum(distinct.values())
        held = self._store.payload_bytes(peer.uid)
        if held + adding > cap and self._store.release_kept_payloads(peer.uid):
            held = self._store.payload_bytes(peer.uid)  # ended jobs' kept payloads went first
        if held + adding > cap:
            raise PermissionDenied(
                f"{peer.user}'s queued payloads take {format_size(held)}; the limit per user "
                f"is {format_size(cap)}; this request adds {format_size(adding)} (wait for "
                "jobs to end, or pass large data by path rather than as an argument)"
            )

    def _owned(self, peer: Peer, job_id: object, doing: str) -> JobInfo:
        """The job, if ``peer`` may ``doing`` it: its owner, or an admin."""
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        info = self._store.get(job_id)
        if info.uid != peer.uid and not peer.admin:
            raise PermissionDenied(
                f"job {info.id} belongs to {info.owner}: only its owner or a pool admin may "
                f"{doing} it"
            )
        return info

    def _cancel(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "cancel")
        self._dirty = True
        return {"job": info_to_json(self.sched.cancel(info.id))}

    def _priority(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        assert self.sched is not None
        from ..spec import parse_priority

        info = self._owned(peer, msg.get("id"), "change the priority of")
        priority = parse_priority(msg.get("priority"))
        self._check_priority(peer, priority)
        self._dirty = True
        return {"job": info_to_json(self.sched.set_priority(info.id, priority))}

    def _requeue(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "requeue")
        self._check_queued(peer, 1)
        self._dirty = True
        return {"job": info_to_json(self.sched.requeue_job(info.id))}

    def _get(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        job_id = msg.get("id")
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        return {"job": info_to_json(self._store.get(job_id))}

    def _jobs(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        rows = self._store.jobs(
            limit=_page(msg), offset=_count_arg(msg, "offset"), **_list_args(msg)
        )
        return {"jobs": [info_to_json(info) for info in rows]}

    def _finished(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        since, owner = msg.get("since") or 0.0, msg.get("owner")
        if (
            isinstance(since, bool)
            or not isinstance(since, int | float)
            or not math.isfinite(since)
        ):
            raise SpecError("since", since, "a time in epoch seconds")
        if owner is not None and not isinstance(owner, str):
            raise SpecError("owner", owner, "a user name")
        rows = self._store.finished_jobs(since=float(since), owner=owner, limit=_page(msg))
        return {"jobs": [info_to_json(info) for info in rows]}

    def _status(self, peer: Peer) -> dict[str, Any]:
        assert self.sched is not None
        status = self.sched.status()
        status["pool"] = {
            "mode": "shared" if self.shared else "user",
            "socket": str(self.socket_path) if self.socket_path else None,
            "agent_pid": os.getpid(),
            "you": peer.user,
            "admin": peer.admin,
        }
        return status

    def _samples(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """Utilisation history in ``[since, until]`` (of ``source``), thinned to ``max_rows``."""
        since, until = _seconds(msg, "since", 0.0), _seconds(msg, "until", time.time())
        source = msg.get("source")
        if source is not None and (not isinstance(source, str) or len(source) > 64):
            raise SpecError("source", source, "gpu, gpu:N, cpu or ram")
        rows = msg.get("max_rows", MAX_SAMPLES)
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_SAMPLES:
            raise SpecError("max_rows", rows, f"a whole number from 1 to {MAX_SAMPLES}")
        return {"samples": self._store.thinned_samples(since, until, source, rows)}

    def render_metrics(self) -> bytes:
        """The pool's Prometheus metrics now (GPUs measured through NVML when real)."""
        from ..metrics import exposition

        assert self.sched is not None
        inventory = self._store.get_meta("inventory", {}) or {}
        pool = None
        if any(not g.get("simulated") for g in inventory.get("gpus") or []):
            pool = self.sched.pool()  # measured, with each GPU process's job (or user)
        return exposition(self._store, pool, time.time())

    def _cache_info(self, peer: Peer) -> dict[str, Any]:
        """The stage-in cache; in a shared pool a user sees only their own entries and
        stagings listed (their sources are theirs), with the totals of everyone's."""
        from ..staging import cache_info

        info = cache_info(self._store)
        if self.shared:
            mine = [item for item in info["items"] if _owner(item["path"]) == peer.uid]
            # this user's share: what their entries hold, and their max_cache_bytes
            info["user_bytes"] = sum(item["bytes"] for item in mine)
            info["user_max_bytes"] = self._cache_quota(peer.uid)
            if not peer.admin:
                info["items"] = mine
                info["staging"] = [s for s in info["staging"] if s.get("uid") == peer.uid]
        return info

    def _events(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        job_id = msg.get("id")
        if job_id is not None:
            self._store.get(job_id)  # JobNotFound for an unknown id
        page = _page(msg)
        rows = self._store.events(job_id, since=_count_arg(msg, "since"), limit=page + 1)
        return {"events": rows[:page], "more": len(rows) > page}

    def _meta(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        key = msg.get("key")
        if not isinstance(key, str) or not (key in _METADATA_KEYS or key.startswith("inventory:")):
            raise SpecError("key", key, "one of " + ", ".join(_METADATA_KEYS))
        return {"value": self._store.get_meta(key)}

    def _changes(
        self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]
    ) -> dict[str, Any] | None:
        """State changes after ``since``; with ``wait``, held until there is one (or timeout)."""
        since, wait = _count_arg(msg, "since"), msg.get("wait") or 0.0
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
            raise SpecError("wait", wait, "seconds to wait, 0 or more")
        wait = min(float(wait), MAX_WAIT)
        rows = self._store.state_changes_since(since, _page(msg))  # the next from the last one
        if rows or wait <= 0:
            return {"changes": [list(r) for r in rows]}
        peer.waiting = (since, time.monotonic() + wait)
        return None

    def _answer_watchers(self) -> None:
        watchers = [p for p in self.peers.values() if p.waiting is not None]
        if not watchers:
            return
        now = time.monotonic()
        seq = self._store.last_event_seq()
        for peer in watchers:
            assert peer.waiting is not None
            since, deadline = peer.waiting
            if seq <= since and now < deadline:
                continue
            peer.waiting = None
            rows = self._store.state_changes_since(since, MAX_ROWS) if seq > since else []
            self.conns.send(peer, {"ok": True, "changes": [list(r) for r in rows]})
            self.conns.resume(peer)  # the requests that arrived while it was held

    def _progress(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        info = self._owned(peer, msg.get("id"), "report progress for")
        progress = msg.get("progress")
        if info.state != "running" or not isinstance(progress, dict):
            return {"recorded": False}
        if len(json.dumps(progress)) > MAX_PROGRESS:
            raise SpecError("progress", "...", f"at most {MAX_PROGRESS} bytes of JSON")
        self._store.update(info.id, progress=progress)
        return {"recorded": True}

    def _ended(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        self._dirty = True  # a job's resources are free: decide now
        return {}

    def _tick_request(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        self._dirty = True
        return {}

    def _settings(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        assert self.sched is not None
        if self.shared and not peer.admin:
            raise PermissionDenied("only a pool admin may change the pool's policy or leases")
        self.sched._write_settings(
            msg.get("policy"), msg.get("lease_ttl"), msg.get("grace"), msg.get("policy_params")
        )
        self._dirty = True
        return {"settings": self._store.get_meta("settings")}

    def _stop(self, peer: Peer, msg: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        if not peer.admin:
            raise PermissionDenied("only a pool admin may stop the pool's service")
        self._stopping = True
        return {}


def _priority_value(priority: int) -> str:
    """``"urgent (1000)"`` for a named level, ``"101"`` for any other."""
    name = PRIORITY_WORDS.get(priority)
    return f"{name} ({priority})" if name else str(priority)


def _set_name(name: bytes) -> None:
    """The process name ``ps`` and ``top`` show (``dlsched-agent``, ``dlsched-sup``)."""
    from ..local.jobproc import libc

    try:
        libc().prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


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

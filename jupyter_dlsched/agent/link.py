"""How a ``Scheduler`` works through a pool agent: submit, steer and read over its socket.

``connect(...)`` decides whether a scheduler is a client at all: a shared
pool (``DLSCHED_SOCKET`` or the system socket) always; else this user's own
agent, unless ``Scheduler(agent=False)`` or ``DLSCHED_AGENT=0`` asks for the
ledger directly (and a Ray or SLURM backend, or a policy object, always use
the ledger directly). A client never
writes the ledger: submissions, cancels and priority changes are requests the
agent validates and applies. In its own pool a client still reads the ledger
(SQLite readers do not block the writer); in a shared pool it cannot, and
``RemoteLedger`` reads through the agent instead, while results and logs are
read straight from the user's own spool folder.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..local.launcher import code_stamp
from ..vocab import private
from ..vocab.errors import (
    DlschedError,
    JobNotFound,
    PermissionDenied,
    SpecError,
    UnsafeStateFolder,
)
from ..vocab.schema import JobInfo, info_from_json
from ..vocab.spec import _after, parse_stage_in
from .client import AgentClient, agent_exited, agent_wanted, shared_socket, user_address
from .protocol import AgentUnavailable
from .shapes import HelloReply, SubmitRequest, SubmittedJob


def connect(
    home: str | os.PathLike[str] | None,
    *,
    socket_path: str | os.PathLike[str] | None = None,
    agent: bool | None = None,
    shared_pool: bool = True,
) -> AgentLink | None:
    """The agent a new scheduler should go through, or None to use the ledger directly
    (``shared_pool=False``: this user's own agent even where a shared pool serves)."""
    shared = str(socket_path) if socket_path is not None else None
    if shared is None and agent is not False and shared_pool:
        shared = shared_socket()
    if shared is not None:
        return AgentLink(AgentClient(shared), shared=True)
    if agent or (agent is None and agent_wanted()):
        from ..store import Store
        from ..vocab.private import default_home

        folder = Path(home).expanduser() if home is not None else default_home()
        # opened here first: a folder that is not safe or a ledger that cannot be read is
        # this call's error, said as it is, not an agent that failed to start
        store = Store(folder)
        return AgentLink(AgentClient(user_address(store.home), home=store.home), store=store)
    return None


class AgentLink:
    """A scheduler's requests to its agent (``hello`` says which pool it is)."""

    through_agent = True

    def __init__(self, client: AgentClient, *, shared: bool = False, store: Any = None) -> None:
        self.client = client
        self.shared = shared
        self._store = store
        self.hello: HelloReply = client.call("hello")
        if not shared and (self.hello.get("code") != code_stamp() or self._other_ledger()):
            # the agent runs older (or newer) code than this client, or serves a ledger
            # removed since (its state folder deleted and made again): replace it (running
            # jobs carry on under their supervisors); one agent per ledger at any time
            self.hello = self._restart_agent()
        self.home = Path(self.hello["home"])
        self._watch: AgentClient | None = None
        #: the Ray cluster this client joined (``join_ray``), sent with its Ray jobs
        self.ray: dict[str, Any] | None = None

    def _other_ledger(self) -> bool:
        served = self.hello.get("ledger")
        if not served or self._store is None:
            return False
        return bool(served != self._store.ledger.path_identity())

    def _restart_agent(self) -> HelloReply:
        import time

        old = self.hello.get("pid")
        try:
            self.client.call("stop")
        except DlschedError:
            pass
        self.client.close()
        deadline = time.monotonic() + 10.0
        while isinstance(old, int) and old > 0 and time.monotonic() < deadline:
            if agent_exited(old):
                break
            time.sleep(0.01)
        return self.client.call("hello")

    def ledger(self) -> Any:
        """What the scheduler reads: the ledger itself in one's own pool, else the agent."""
        if self.shared:
            return RemoteLedger(self)
        if self._store is None:
            from ..store import Store

            self._store = Store(self.home)
        return self._store

    def submit(
        self,
        kind: str,
        jobs: Sequence[dict[str, bytes]],
        *,
        default_name: str,
        origin: str,
        options: dict[str, Any],
        inline: bool = False,
        backend: str = "local",
        suffixes: Sequence[str] | None = None,
    ) -> list[str]:
        """Queue ``jobs`` (each its files) with the same options; their ids. ``suffixes``:
        what each job's name adds to the common one (a sweep's ``"[2] lr=0.01"``)."""
        blobs: list[bytes] = []
        index: dict[int, int] = {}
        items: list[SubmittedJob] = []
        for files in jobs:
            refs = {}
            for name, data in files.items():
                key = id(data)
                if key not in index:  # a map's shared context travels once
                    index[key] = len(blobs)
                    blobs.append(data)
                refs[name] = index[key]
            items.append({"files": refs})
        for item, suffix in zip(items, suffixes or (), strict=False):
            item["suffix"] = suffix
        request: SubmitRequest = {
            "kind": kind,
            "default_name": default_name,
            "origin": origin,
            "options": wire_options(options),
            "inline": inline,
            "jobs": items,
            "backend": backend,
        }
        if backend == "ray":
            request["ray"] = self.ray  # the cluster this client joined: refused if switched since
        reply = self.client.call("submit", blobs, **request)
        return list(reply["ids"])

    def join_ray(
        self,
        address: str | None,
        gpu_mem: int | str | None,
        init_options: dict[str, Any],
        timeout: float = 180.0,
    ) -> dict[str, Any]:
        """Have the agent keep a Ray driver on the cluster at ``address``; the cluster's
        inventory once the driver has joined it (Ray's first start takes seconds)."""
        import json
        import time

        try:
            json.dumps(init_options)
        except (TypeError, ValueError):
            raise SpecError(
                "init_options",
                init_options,
                "JSON values (they travel to the pool agent's Ray driver; agent=False keeps "
                "Ray in this process)",
            ) from None
        deadline = time.monotonic() + timeout
        start = True
        while True:
            reply = self.client.call(
                "ray", address=address, gpu_mem=gpu_mem, init_options=init_options, start=start
            )
            start = False
            if reply["inventory"] is not None:
                self.ray = {"address": address, "gpu_mem": gpu_mem, "init_options": init_options}
                return dict(reply["inventory"])
            if reply["failed"] or time.monotonic() > deadline:
                tail = str(reply.get("log") or "").strip().splitlines()[-12:]
                raise AgentUnavailable(
                    "the pool agent's Ray driver did not join the cluster"
                    + (":\n" + "\n".join(tail) if tail else "")
                )
            time.sleep(0.1)

    def cancel(self, job_id: str) -> JobInfo:
        return info_from_json(self.client.call("cancel", id=job_id)["job"])

    def set_priority(self, job_id: str, priority: int | str) -> JobInfo:
        return info_from_json(self.client.call("priority", id=job_id, priority=priority)["job"])

    def requeue(self, job_id: str) -> JobInfo:
        return info_from_json(self.client.call("requeue", id=job_id)["job"])

    def status(self) -> dict[str, Any]:
        return dict(self.client.call("status")["status"])

    def tick(self, now: float | None = None) -> None:
        """Ask the agent for a decision (``now`` is for an engine in this process: the agent
        reads its own clock)."""
        self.client.call("tick")

    def wake(self) -> None:
        """Ask the agent for a decision (it takes it at the end of its loop turn)."""
        self.client.call("tick")

    def schedules(self, msg: dict[str, Any]) -> dict[str, Any]:
        """List the schedules, or remove one (``{"remove": id}``), as the agent allows."""
        return dict(self.client.call("schedules", **msg))

    def cache(self) -> dict[str, Any]:
        """The staging cache as the agent shows it to this user."""
        return dict(self.client.call("cache")["cache"])

    def settings(self, **values: Any) -> None:
        if any(v is not None for v in values.values()):
            self.client.call("settings", **values)

    def changes(self, since: int, wait: float) -> list[tuple[int, str, str]]:
        """State changes after ``since``, waiting up to ``wait`` seconds for one."""
        if self._watch is None:
            self._watch = self.client.watcher()
        rows = self._watch.call("changes", since=since, wait=wait)["changes"]
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def interrupt(self) -> None:
        """End a ``changes`` wait now (the scheduler is closing)."""
        if self._watch is not None:
            self._watch.interrupt()

    def close(self) -> None:
        self.client.close()
        if self._watch is not None:
            self._watch.close()


def wire_options(options: dict[str, Any]) -> dict[str, Any]:
    """Resource options as JSON values (the agent validates them again, as the only judge)."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key == "after":
            value = list(_after(value))
        elif isinstance(value, datetime):
            value = value.timestamp()
        elif isinstance(value, timedelta):
            value = value.total_seconds()
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif key == "stage_in" and value is not None:
            value = parse_stage_in(value)  # relative paths are the submitter's, not the agent's
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(key, value, "a finite number")
        if not _jsonable(value):
            raise SpecError(key, value, "a number, a string, or a list or mapping of them")
        out[key] = value
    return out


def _jsonable(value: object) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


def _not_yours(info: JobInfo, name: str) -> PermissionDenied:
    """Why another user's job file is not read: a pickle never (loading one runs the code
    it names, as the reader), the rest only by its owner and root."""
    owner = info.owner
    if name.endswith(".pkl"):
        return PermissionDenied(
            f"job {info.id} belongs to {owner}: its result is a pickle its job wrote as "
            f"{owner}, and loading a pickle runs the code it names, so only {owner} loads it "
            f"(an admin reads its state and log: dlsched logs {info.id})"
        )
    return PermissionDenied(
        f"job {info.id} belongs to {owner}: only its owner (or root) may read its log and "
        "error report, and only its owner its result"
    )


class RemoteLedger:
    """The ledger of a shared pool, read through its agent (the reads a client makes).

    Results, error reports and logs are the user's own files in the pool's
    spool folder; they are read directly, with the same checks as at home.
    """

    #: Rows asked for per request of a long list (the service answers at most its own page,
    #: ``reads.MAX_CHANGE_ROWS`` changes or ``MAX_EVENT_ROWS`` events, and says ``more``).
    PAGE = 10_000

    def __init__(self, link: AgentLink) -> None:
        self._link = link
        self._client = link.client
        self.home = link.home
        self.spool_root = self.home / "spool"
        self.path = self.home / "ledger.sqlite"

    def get(self, job_id: str) -> JobInfo:
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        return info_from_json(self._client.call("get", id=job_id)["job"])

    def jobs(
        self,
        states: Iterable[str] | None = None,
        owner: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        ids: Sequence[str] | None = None,
        newest_first: bool = False,
        holding: bool = False,
    ) -> list[JobInfo]:
        out: list[JobInfo] = []
        while True:  # the service answers a page at a time (reads.MAX_JOB_ROWS at most)
            reply = self._client.call(
                "jobs",
                states=list(states) if states is not None else None,
                owner=owner,
                limit=None if limit is None else limit - len(out),
                offset=offset,
                ids=list(ids) if ids is not None else None,
                newest_first=newest_first,
                holding=holding,
            )
            out += [info_from_json(r) for r in reply["jobs"]]
            if not reply.get("more") or (limit is not None and len(out) >= limit):
                return out
            offset = reply.get("next_offset", offset + len(reply["jobs"]))

    def finished_jobs(
        self, since: float = 0.0, owner: str | None = None, limit: int | None = None
    ) -> list[JobInfo]:
        out: list[JobInfo] = []
        while True:
            reply = self._client.call(
                "finished",
                since=since,
                owner=owner,
                limit=None if limit is None else limit - len(out),
                offset=len(out),
            )
            out += [info_from_json(r) for r in reply["jobs"]]
            if not reply.get("more") or (limit is not None and len(out) >= limit):
                return out

    def count_jobs(self) -> dict[str, int]:
        return dict(self._client.call("count")["counts"])

    def get_meta(self, key: str, default: Any = None) -> Any:
        value = self._client.call("meta", key=key)["value"]
        return default if value is None else value

    def set_meta(self, key: str, value: Any) -> None:
        raise PermissionDenied(f"the shared pool's {key} is set by its service, not by a client")

    def last_event_seq(self) -> int:
        return int(self._client.call("seq")["seq"])

    def state_changes_since(self, seq: int) -> list[tuple[int, str, str]]:
        out: list[tuple[int, str, str]] = []
        while True:  # the service answers a page at a time
            reply = self._client.call("changes", since=seq, limit=self.PAGE)
            rows = reply["changes"]
            if not rows:
                return out
            out += [(int(r[0]), str(r[1]), str(r[2])) for r in rows]
            if not reply.get("more"):
                return out
            seq = out[-1][0]

    def events(self, job_id: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:  # the service answers a page at a time
            reply = self._client.call("events", id=job_id, since=since, limit=self.PAGE)
            out += reply["events"]
            if not reply.get("more") or not reply["events"]:
                return out
            since = int(out[-1]["seq"])

    def spool(self, job_id: str) -> Path:
        from ..store import _ID

        if not isinstance(job_id, str) or not _ID.match(job_id):
            raise JobNotFound(job_id)
        return self.spool_root / job_id

    def read_spool_file(self, job_id: str, name: str) -> bytes | None:
        """One of this user's job files. Of another user's job, root reads what is not a
        pickle (the error report) as the owner's file; a pickle (the result) is refused
        unread, to everyone: loading one runs the code it names, as the reader."""
        path = self.spool(job_id) / name
        try:
            return private.read_file(path)
        except UnsafeStateFolder:
            # root may open any file: one that is not root's is checked as its owner's
            info = self.get(job_id) if os.getuid() == 0 else None
            if info is None or info.uid == 0:
                raise
            if name.endswith(".pkl"):
                raise _not_yours(info, name) from None
            return private.read_file(path, info.uid)
        except PermissionError as error:
            if getattr(error, "errno", None) == errno.EACCES:
                info = self.get(job_id)
                if info.uid != os.getuid():
                    raise _not_yours(info, name) from None
                # the user's own job: a folder on the way is closed to them
                what = "result" if name == "result.pkl" else "error report"
                raise PermissionDenied(
                    f"job {job_id}: cannot read its {what}: {path}: {error.strerror} (a folder "
                    f"on the way to the pool's state folder {self.home} is closed to you; ask "
                    "the pool's admin to let users through it: chmod o+x)"
                ) from None
            raise

    def close(self) -> None:
        self._link.close()

    def __getattr__(self, name: str) -> Any:
        raise DlschedError(
            f"{name} is not available through a shared pool: its ledger belongs to the "
            "pool's service"
        )

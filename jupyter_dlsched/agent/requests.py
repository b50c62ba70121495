"""The pool agent's requests: one method per request of the protocol (``Agent._ops``).

Each takes the peer (who asks: uid, name, admin), the message and its binary
attachments, and returns the reply (``None``: answered later, as ``changes`` with
``wait`` is); the message and the reply are typed with the op's shapes
(``shapes.OPS``), which the clients' calls are typed with too. A shape says what a
well-formed request holds: each handler still checks every field it reads. Every
reply then passes the one visibility rule (``visibility.py``). The checks of a shared
pool's limits (priority cap, queued jobs, payload bytes) are here too, since only
requests apply them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._version import __version__
from ..backends.base import refuse_stage_in
from ..errors import JobNotFound, PermissionDenied, SpecError
from ..schema import JobInfo, info_to_json
from ..spec import check_text
from ..words import PRIORITY_WORDS
from .config import ServiceConfig
from .connections import Connections, Peer
from .protocol import ProtocolError
from .shapes import (
    CacheReply,
    ChangesReply,
    ChangesRequest,
    CountReply,
    Done,
    EventsReply,
    EventsRequest,
    FinishedRequest,
    HelloReply,
    JobIdRequest,
    JobReply,
    JobsReply,
    JobsRequest,
    MetaReply,
    MetaRequest,
    MetricsReply,
    NoFields,
    PriorityRequest,
    ProgressReply,
    ProgressRequest,
    RayReply,
    RayRequest,
    SamplesReply,
    SamplesRequest,
    SchedulesReply,
    SchedulesRequest,
    SeqReply,
    SettingsReply,
    SettingsRequest,
    StatusReply,
    SubmitReply,
    SubmitRequest,
)

if TYPE_CHECKING:
    from ..engine import Engine
    from ..sampling import Sampler
    from .ray_keeper import RayKeeper

#: Longest a ``changes`` request waits for a state change before answering empty.
MAX_WAIT = 30.0

#: Rows a list request returns at most.
MAX_ROWS = 100_000

#: Largest progress report a job may send (JSON bytes).
MAX_PROGRESS = 64 * 1024

#: Samples one ``samples`` request answers at most (each source thinned evenly to fit).
MAX_SAMPLES = 20_000

_METADATA_KEYS = ("inventory", "settings", "cache")


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _seconds(msg: Mapping[str, Any], key: str, default: float) -> float:
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


#: Job ids one ``jobs`` request may name (SQLite binds at most 32,766 values a statement).
MAX_IDS = 10_000


def _count_arg(msg: Mapping[str, Any], key: str) -> int:
    """A request's ``offset`` or ``since`` (missing: 0): a whole number the ledger's 64-bit
    integers hold, 0 or more."""
    value = msg.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise SpecError(key, value, "a whole number from 0 to 2**63 - 1")
    return value


def _list_args(msg: Mapping[str, Any]) -> dict[str, Any]:
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


def _page(msg: Mapping[str, Any]) -> int:
    """Rows one list request answers: its ``limit``, at most ``MAX_ROWS``."""
    limit = msg.get("limit")
    if limit is None:
        return MAX_ROWS
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SpecError("limit", limit, "a whole number of rows, 1 or more")
    return min(limit, MAX_ROWS)


def _priority_value(priority: int) -> str:
    """``"urgent (1000)"`` for a named level, ``"101"`` for any other."""
    name = PRIORITY_WORDS.get(priority)
    return f"{name} ({priority})" if name else str(priority)


class Requests:
    """The request handlers of ``Agent`` (``service.py``), which this is a part of."""

    if TYPE_CHECKING:  # the agent's, set in Agent.__init__
        home: Path
        shared: bool
        uid: int
        code: str
        config: ServiceConfig | None
        conns: Connections
        sched: Engine | None
        sampler: Sampler | None
        ray: RayKeeper
        _dirty: bool
        _stopping: bool
        socket_path: Path | None

        def _cache_quota(self, uid: int) -> int | None: ...

        @property
        def _store(self) -> Any: ...
        @property
        def peers(self) -> dict[int, Peer]: ...

    def _hello(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> HelloReply:
        return {
            "version": __version__,
            "mode": "shared" if self.shared else "user",
            "home": str(self.home),
            "socket": str(self.socket_path) if self.socket_path is not None else None,
            "pid": os.getpid(),
            "code": self.code,
            "uid": peer.uid,
            "user": peer.user,
            "admin": peer.admin,
        }

    def _submit(self, peer: Peer, msg: SubmitRequest, blobs: list[bytes]) -> SubmitReply:
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
        if backend not in ("local", "ray"):
            raise SpecError("backend", backend, '"local" or "ray" through a pool agent')
        jobs = msg.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise ProtocolError("a submit request without jobs")
        ray = backend == "ray"
        if ray:
            self.ray.check_options(msg)
            if inline:
                raise SpecError("inline", True, "no --inline with the ray backend")
        batch = self.sched.prepare(
            str(msg.get("kind", "function")),
            [_job_files(item, blobs) for item in jobs],
            default_name=str(msg.get("default_name", "job")),
            origin=str(msg.get("origin", "")),
            options=options,
            suffixes=[
                check_text(str(item["suffix"]), "name") if item.get("suffix") else None
                for item in jobs
            ],
            inventory=self.ray.inventory() if ray else None,
            check=(lambda spec: refuse_stage_in("ray", spec)) if ray else None,
        )
        self._check_priority(peer, batch[0][1].priority)
        self._check_queued(peer, len(batch))
        self._check_payload(peer, batch)
        ids = self.sched.insert(
            batch, owner=peer.user, uid=peer.uid, inline=inline, backend=backend
        )
        if ray:
            self.ray.keep()
        return {"ids": ids}

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

    def _cancel(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "cancel")
        self._dirty = True
        return {"job": info_to_json(self.sched.cancel(info.id))}

    def _priority(self, peer: Peer, msg: PriorityRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        from ..spec import parse_priority

        info = self._owned(peer, msg.get("id"), "change the priority of")
        priority = parse_priority(msg.get("priority"))
        self._check_priority(peer, priority)
        self._dirty = True
        return {"job": info_to_json(self.sched.set_priority(info.id, priority))}

    def _requeue(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        assert self.sched is not None
        info = self._owned(peer, msg.get("id"), "requeue")
        self._check_queued(peer, 1)
        self._dirty = True
        return {"job": info_to_json(self.sched.requeue(info.id))}

    def _get(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> JobReply:
        job_id = msg.get("id")
        if not isinstance(job_id, str):
            raise JobNotFound(job_id)
        return {"job": info_to_json(self._store.get(job_id))}

    def _jobs(self, peer: Peer, msg: JobsRequest, blobs: list[bytes]) -> JobsReply:
        rows = self._store.jobs(
            limit=_page(msg), offset=_count_arg(msg, "offset"), **_list_args(msg)
        )
        return {"jobs": [info_to_json(info) for info in rows]}

    def _finished(self, peer: Peer, msg: FinishedRequest, blobs: list[bytes]) -> JobsReply:
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

    def _ping(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        return {}

    def _count(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> CountReply:
        return {"counts": self._store.count_jobs()}

    def _seq(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> SeqReply:
        return {"seq": self._store.last_event_seq()}

    def _status_request(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> StatusReply:
        return {"status": self._status(peer)}

    def _cache(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> CacheReply:
        return {"cache": self._cache_info(peer)}

    def _metrics(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> MetricsReply:
        return {"text": self.render_metrics().decode()}

    def _ray(self, peer: Peer, msg: RayRequest, blobs: list[bytes]) -> RayReply:
        return self.ray.request(msg)

    def _schedules(self, peer: Peer, msg: SchedulesRequest, blobs: list[bytes]) -> SchedulesReply:
        from ..schedules.requests import answer

        # the same answer a Scheduler without an agent gives itself, as a plain dict
        return cast(SchedulesReply, answer(self._store, dict(msg), uid=peer.uid, admin=peer.admin))

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

    def _samples(self, peer: Peer, msg: SamplesRequest, blobs: list[bytes]) -> SamplesReply:
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

    def _events(self, peer: Peer, msg: EventsRequest, blobs: list[bytes]) -> EventsReply:
        job_id = msg.get("id")
        if job_id is not None:
            self._store.get(job_id)  # JobNotFound for an unknown id
        page = _page(msg)
        rows = self._store.events(job_id, since=_count_arg(msg, "since"), limit=page + 1)
        return {"events": rows[:page], "more": len(rows) > page}

    def _meta(self, peer: Peer, msg: MetaRequest, blobs: list[bytes]) -> MetaReply:
        key = msg.get("key")
        if not isinstance(key, str) or not (key in _METADATA_KEYS or key.startswith("inventory:")):
            raise SpecError("key", key, "one of " + ", ".join(_METADATA_KEYS))
        return {"value": self._store.get_meta(key)}

    def _changes(self, peer: Peer, msg: ChangesRequest, blobs: list[bytes]) -> ChangesReply | None:
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

    def _progress(self, peer: Peer, msg: ProgressRequest, blobs: list[bytes]) -> ProgressReply:
        info = self._owned(peer, msg.get("id"), "report progress for")
        progress = msg.get("progress")
        if info.state != "running" or not isinstance(progress, dict):
            return {"recorded": False}
        if len(json.dumps(progress)) > MAX_PROGRESS:
            raise SpecError("progress", "...", f"at most {MAX_PROGRESS} bytes of JSON")
        self._store.update(info.id, progress=progress)
        return {"recorded": True}

    def _ended(self, peer: Peer, msg: JobIdRequest, blobs: list[bytes]) -> Done:
        self._dirty = True  # a job's resources are free: decide now
        return {}

    def _tick_request(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        self._dirty = True
        return {}

    def _settings(self, peer: Peer, msg: SettingsRequest, blobs: list[bytes]) -> SettingsReply:
        assert self.sched is not None
        if self.shared and not peer.admin:
            raise PermissionDenied("only a pool admin may change the pool's policy or leases")
        self.sched.write_settings(
            msg.get("policy"),
            msg.get("lease_ttl"),
            msg.get("grace"),
            msg.get("policy_params"),
            resize_every=msg.get("resize_every"),
            resize_cost=msg.get("resize_cost"),
        )
        self._dirty = True
        return {"settings": self._store.get_meta("settings")}

    def _stop(self, peer: Peer, msg: NoFields, blobs: list[bytes]) -> Done:
        if not peer.admin:
            raise PermissionDenied("only a pool admin may stop the pool's service")
        self._stopping = True
        return {}
